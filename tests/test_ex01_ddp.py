"""Exercise 1 (DDP): the solution scores full marks, the stub zero, and each classic mistake
is named in the learner's words with its numbers."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from autograder.checks import ex01_ddp
from distlab.launch import time_scale
from tests.helpers import EXERCISES, REPO, SOLUTIONS, failed, solution_and_mutants


@pytest.mark.slow
def test_cli_gives_the_solution_full_marks_at_world_sizes_2_and_4(tmp_path):
    out = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "autograder", str(SOLUTIONS), "--exercise", "1",
                           "--json", str(out)], cwd=REPO, capture_output=True, text=True,
                          timeout=200 * time_scale())  # a hang guard, scaled like the grader's own limit
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    ex = doc["exercises"][0]
    assert (ex["exercise"], ex["score"], ex["max_score"], ex["passed"]) == (1, 10, 10, True)
    assert ex["measurements"]["W2_max_abs_diff_vs_reference"] < 1e-5
    assert ex["measurements"]["W4_max_abs_diff_vs_reference"] < 1e-5
    assert "[W=4] matches single-process training" in proc.stdout


@pytest.mark.slow
def test_cli_gives_the_stub_zero_with_not_implemented(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "autograder", str(EXERCISES), "--exercise", "1"],
                          cwd=REPO, capture_output=True, text=True, timeout=120 * time_scale())
    assert proc.returncode == 1
    assert "0/10" in proc.stdout and "not implemented yet (ex01_ddp.py line" in proc.stdout


MUTANTS = {
    # Without DDP and without a sampler every rank trains alone on all the data.
    "no_ddp_no_sampler": {
        "loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)":
            "loader = DataLoader(dataset, batch_size=batch_size, shuffle=True)",
        "ddp_model = DDP(model, device_ids=[device.index] if device.type == \"cuda\" else None)":
            "ddp_model = model",
        "torch.save(ddp_model.module.state_dict(), checkpoint_path)":
            "torch.save(ddp_model.state_dict(), checkpoint_path)",
    },
    "epoch_logging_saving": {
        "        sampler.set_epoch(epoch)": "        pass",
        "        if rank == 0:\n            # Rank 0": "        if True:\n            # Rank 0",
        "    if rank == 0:\n        torch.save(": "    if True:\n        torch.save(",
        "    dist.destroy_process_group()": "    pass",
    },
    "wrong_lr": {
        "torch.optim.SGD(ddp_model.parameters(), lr=lr)": "torch.optim.SGD(ddp_model.parameters(), lr=lr * 1.5)",
        # Saving through `from torch import save` is still seen (and is correct).
        "import torch\n": "import torch\nfrom torch import save\n",
        "        torch.save(ddp_model.module": "        save(ddp_model.module",
    },
}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """The mutants, graded at W=2 in one launch (one report each)."""
    paths = solution_and_mutants(tmp_path_factory.mktemp("ex01"), "ex01_ddp.py", MUTANTS)
    del paths["solution"]  # the CLI test grades it at both world sizes
    return dict(zip(paths, ex01_ddp.grade(list(paths.values()), world_sizes=(2,))))


@pytest.mark.slow
def test_no_sampler_and_no_ddp_are_named(graded):
    fails = failed(graded["no_ddp_no_sampler"])
    assert "did you pass a DistributedSampler to the DataLoader?" in fails["[W=2] each rank reads its own shard"]
    assert "rank 1 read" not in fails["[W=2] each rank reads its own shard"]
    same = fails["[W=2] same parameters on every rank"]
    assert "rank 0 and rank 1 ended with different weights (max abs difference" in same
    assert "wrap the model in DistributedDataParallel" in same
    # One mistake, one message: what needs the shards is not judged a second time.
    assert fails["[W=2] new shuffle every epoch"] == "not checked: needs '[W=2] each rank reads its own shard' first"


@pytest.mark.slow
def test_set_epoch_logging_and_saving_mistakes_are_named(graded):
    report = graded["epoch_logging_saving"]
    fails = failed(report)
    assert set(fails) == {"[W=2] new shuffle every epoch", "[W=2] only rank 0 logs",
                          "[W=2] rank 0 saves the model once", "[W=2] teardown destroys the process group"}
    assert "call sampler.set_epoch(epoch)" in fails["[W=2] new shuffle every epoch"]
    assert fails["[W=2] only rank 0 logs"].startswith("rank 1 printed 2 lines (first: 'epoch 0: mean loss")
    assert fails["[W=2] rank 0 saves the model once"] == "torch.save was called on ranks [0, 1]: save on rank 0 only"
    assert "still initialised on ranks [0, 1]" in fails["[W=2] teardown destroys the process group"]
    # The parts that are right still earn their marks.
    assert report.score == 6 and report.max_score == 10


def test_wrong_learning_rate_breaks_parity_with_numbers(graded):
    fails = failed(graded["wrong_lr"])
    assert list(fails) == ["[W=2] matches single-process training"]
    msg = fails["[W=2] matches single-process training"]
    assert "weights differ from one process trained on the same global batches of 2x32" in msg
    assert "max abs difference" in msg and "use SGD with lr=0.2" in msg
