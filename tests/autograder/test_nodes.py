"""One machine's launch seen as several nodes from inside a rank (autograder.rank.nodes), in process: torchrun's
node-local variables for the block, the learner's read of LOCAL_WORLD_SIZE noted at its line, all undone after."""
from __future__ import annotations

import os

from autograder.rank.nodes import as_nodes


def test_four_ranks_as_two_nodes_and_the_learners_read_is_noted(tmp_path, monkeypatch):
    learner = tmp_path / "ex02_accumulation.py"
    learner.write_text("import os\n\ndef world():\n    return int(os.environ['LOCAL_WORLD_SIZE'])\n")
    namespace: dict = {}
    exec(compile(learner.read_text(), str(learner), "exec"), namespace)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.delenv("GROUP_RANK", raising=False)
    with as_nodes(learner, rank=3, world=4, nodes=2) as reads:
        assert (os.environ["LOCAL_RANK"], os.environ["GROUP_RANK"]) == ("1", "1")
        assert namespace["world"]() == 2
    assert reads == {"LOCAL_WORLD_SIZE": "ex02_accumulation.py:4"}
    assert os.environ["LOCAL_WORLD_SIZE"] == "4" and "GROUP_RANK" not in os.environ  # as before the block
    with as_nodes(learner, rank=1, world=2, nodes=1) as reads:  # one node: nothing changes, nothing is watched
        assert namespace["world"]() == 4
    assert reads == {}
