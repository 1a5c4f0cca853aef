"""A whole class graded in parallel gets the same grades as graded one at a time (autograder.commands.classroom).

Six learners for exercise 7 (one 2-rank launch each, the cheapest full grading): one correct,
the stub, a file that does not import, a missing file, a mutant that never sends the gradients back, and a hostile
one (correct too) that leaves a daemon and a detached helper. Three of them launch, so the parallel grading
runs launches side by side; more learners would only repeat those cases at 30 s of CPU each. Graded with
--jobs 1 and --jobs 4, the two CSVs are identical, and nothing either run started is left.
"""
from __future__ import annotations

import csv
import shutil

import pytest

from autograder.__main__ import main
from autograder.grader.registry import exercises
from tests.helpers import REPO, SOLUTIONS, hostile, mutant

pytestmark = pytest.mark.slow
FILE = "ex07_pipeline.py"


@pytest.fixture
def classroom(tmp_path):
    root = tmp_path / "class"
    (root / "ada").mkdir(parents=True)
    shutil.copy(SOLUTIONS / FILE, root / "ada" / FILE)
    (root / "cy").mkdir()
    shutil.copy(REPO / "exercises" / FILE, root / "cy" / FILE)  # the stub, untouched
    (root / "di").mkdir()
    (root / "di" / FILE).write_text("def broken(:\n")
    (root / "ed").mkdir()  # submitted nothing
    (root / "fa").mkdir()
    mutant(root / "fa", FILE, {"        dist.send(act.grad.contiguous(), dst=0)\n": ""})
    pids = tmp_path / "pids"
    pids.mkdir()
    hostile.submission(root / "hu", pids, hostile.DETACHED, hostile.DAEMON, filename=FILE)
    return root, pids


def _grades(path) -> list[list[str]]:
    with open(path) as f:
        return list(csv.reader(f))


def test_a_class_graded_four_at_a_time_gets_the_grades_of_one_at_a_time(classroom, tmp_path, wait_for,
                                                                         leftover_processes, capsys):
    root, pids = classroom
    assert main(["class", str(root), "-e", "7", "--jobs", "1", "--csv", str(tmp_path / "one.csv")]) == 0
    assert main(["class", str(root), "-e", "7", "--jobs", "4", "--csv", str(tmp_path / "four.csv"),
                 "--json", str(tmp_path / "four.json")]) == 0
    one, four = _grades(tmp_path / "one.csv"), _grades(tmp_path / "four.csv")
    assert one == four
    assert one[0] == ["learner", "ex07_pipeline", "total"]
    scores = {row[0]: row[1] for row in one[1:]}
    assert {k: scores[k] for k in ("ada", "cy", "di", "ed", "hu")} == \
        {"ada": "10", "cy": "stub", "di": "0", "ed": "missing", "hu": "10"}
    assert float(scores["fa"]) < 10  # the mutant loses marks
    assert "[6/6 learners]" in capsys.readouterr().err
    started = hostile.started(pids)
    assert wait_for(lambda: hostile.alive(started["detached"] + started["daemon"]) == [], timeout=10)
    assert leftover_processes() == []


@pytest.mark.timeout(300)
def test_a_slurm_array_grades_slices_and_the_last_task_merges_them(tmp_path):
    """course/slurm/grade_class.sbatch run as two array tasks (by bash, as Slurm would run them), on
    learners whose files need no launch (stubs, nothing): every learner in one merged CSV."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root, out = tmp_path / "class", tmp_path / "out"
    for name in ("ann", "ben", "cat"):
        (root / name).mkdir(parents=True)
    shutil.copy(REPO / "exercises" / FILE, root / "ben" / FILE)
    script = REPO / "course" / "slurm" / "grade_class.sbatch"
    for task in (1, 0):
        env = {**os.environ, "SLURM_ARRAY_TASK_ID": str(task), "SLURM_ARRAY_TASK_COUNT": "2",
               "DISTLAB_VENV": str(Path(sys.executable).parent.parent), "DISTLAB_REPO": str(REPO)}
        done = subprocess.run(["bash", str(script), str(root), str(out)], env=env, capture_output=True, text=True,
                              timeout=240)
        assert done.returncode == 0, done.stderr
    assert (out / "grades.csv").exists() and "merged 3 learners" in done.stdout
    rows = _grades(out / "grades.csv")
    assert [r[0] for r in rows[1:]] == ["ann", "ben", "cat"] and len(rows[0]) == 2 + len(exercises())  # learner, total
    assert {r[-1] for r in rows[1:]} == {"0"}
