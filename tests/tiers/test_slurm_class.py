"""course/slurm/grade_class.sbatch as a real Slurm job array, on the two-node cluster of
distlab/runtime/slurm_cluster.py.

Four learners of exercise 7 (two correct, the stub, nothing), two array tasks: each grades its slice
(``--slice K/2``) with real launches, and the last to finish merges the slices. Pass: both tasks
COMPLETED, one merged CSV with every learner's grade, and nothing of the job left running.
"""
from __future__ import annotations

import csv
import os
import shutil
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, SOLUTIONS, session_processes

pytestmark = [pytest.mark.slurm, pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(400)]
FILE = "ex07_pipeline.py"


def test_a_job_array_grades_the_class_in_slices_and_merges_them(cluster, tmp_path, wait_for):
    root, out = tmp_path / "class", tmp_path / "out"
    for name in ("ann", "ben", "cat", "dan"):
        (root / name).mkdir(parents=True)
    for name in ("ann", "dan"):
        shutil.copy(SOLUTIONS / FILE, root / name / FILE)
    shutil.copy(REPO / "exercises" / FILE, root / "ben" / FILE)
    env = cluster.env(PATH=f"{Path(sys.executable).parent}{os.pathsep}{cluster.env()['PATH']}",
                      DISTLAB_EXERCISES="7", DISTLAB_REPO=str(REPO),
                      DISTLAB_VENV=str(Path(sys.executable).parent.parent))
    job_id = cluster.sbatch("--array=0-1", str(REPO / "course" / "slurm" / "grade_class.sbatch"), str(root), str(out),
                            cwd=tmp_path, env=env)
    for task in (0, 1):
        job = cluster.wait(f"{job_id}_{task}", timeout=300)
        log = tmp_path / f"distlab-grade-{job_id}_{task}.out"
        text = log.read_text() if log.exists() else "(no output file)"
        assert (job.get("JobState"), job.get("ExitCode")) == ("COMPLETED", "0:0"), f"{job}\n{text}\n{cluster.logs()}"
    assert wait_for(lambda: (out / "grades.csv").exists(), timeout=30)
    with open(out / "grades.csv") as f:
        rows = list(csv.reader(f))
    assert rows == [["learner", "ex07_pipeline", "total"], ["ann", "10", "10"], ["ben", "stub", "0"],
                    ["cat", "missing", "0"], ["dan", "10", "10"]]
    daemons = set(cluster.pids().values())
    assert wait_for(lambda: {p.pid for p in session_processes()} <= daemons, timeout=30), \
        [(p.pid, p.name()) for p in session_processes() if p.pid not in daemons]
