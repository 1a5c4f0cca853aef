"""What grading costs, against the targets of the check-shape issue (measured, never asserted in tests).

| measure                                                   | target          |
|-----------------------------------------------------------|-----------------|
| grading exercise 1 (W=2 and W=4), as the CLI does         | <= 15 s         |
| grading all seven reference solutions (make grade DIR=solutions) | <= 90 s on 2 cores |
| the nbgrader cycle test (tests/test_nbgrader.py)          | <= 60 s         |

Each is one run of what a learner or an instructor runs (the CLI's subprocess per exercise, the
nbgrader test as pytest runs it), beside the launch floor of ``bench_launch`` in the same table.
"""
from __future__ import annotations

import subprocess
import sys
import time

from autograder.registry import exercises
from autograder.runner import grade, grade_one
from benchmarks import Row
from distlab.importing import REPO_ROOT

TARGETS_S = {"ex01": 15.0, "solutions": 90.0, "nbgrader": 60.0}


def _verdict(seconds: float, target: float) -> str:
    return f"target <= {target:g} s: {'met' if seconds <= target else 'NOT met'}"


def _timed(fn):
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def rows() -> list[Row]:
    solutions = REPO_ROOT / "solutions"
    report, ex01_s = _timed(lambda: grade_one(exercises()[1], solutions))
    assert report.passed, report.feedback  # a fast grade of a wrong answer would mean nothing
    reports, all_s = _timed(lambda: grade(solutions))
    assert all(r.passed for r in reports), [r.feedback for r in reports if not r.passed]
    done, cycle_s = _timed(lambda: subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_nbgrader.py"],
        cwd=REPO_ROOT, capture_output=True, text=True))
    assert done.returncode == 0, done.stdout[-2000:]
    return [
        Row("grading", "grade exercise 1 (solution, W=2 and W=4), one grading subprocess", ex01_s, "s",
            _verdict(ex01_s, TARGETS_S["ex01"])),
        Row("grading", f"grade all {len(reports)} reference solutions (make grade DIR=solutions)", all_s, "s",
            _verdict(all_s, TARGETS_S["solutions"]) + "; one grading subprocess each, in turn"),
        Row("grading", "the nbgrader cycle test (pytest tests/test_nbgrader.py)", cycle_s, "s",
            _verdict(cycle_s, TARGETS_S["nbgrader"])),
    ]
