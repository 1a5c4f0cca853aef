"""What grading costs, against the targets of the check-shape issue (measured, never asserted in tests).

| measure                                                   | target          |
|-----------------------------------------------------------|-----------------|
| grading exercise 1 (W=2 and W=4), as the CLI does         | <= 15 s         |
| grading all seven reference solutions (make grade DIR=solutions) | <= 90 s on 2 cores |
| the nbgrader cycle test (tests/tiers/test_nbgrader.py)          | <= 60 s         |

Each is one run of what a learner or an instructor runs (the CLI's subprocess per exercise, the
nbgrader test as pytest runs it), beside the launch floor of ``bench_launch`` in the same table.
"""
from __future__ import annotations

import os
import resource
import subprocess
import sys
import time

from autograder.grader.registry import exercises
from autograder.grader.supervise import grade, grade_one
from benchmarks import Row
from distlab.runtime.importing import REPO_ROOT

TARGETS_S = {"ex01": 15.0, "solutions": 90.0, "nbgrader": 60.0}


def _verdict(seconds: float, target: float) -> str:
    return f"target <= {target:g} s: {'met' if seconds <= target else 'NOT met'}"


def _timed(fn):
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def _children_cpu_s() -> float:
    """CPU seconds (user + system) of every finished process this one started, and theirs, and of the
    jobs the warm launch server forked for them (it outlives them, so RUSAGE_CHILDREN misses those)."""
    from distlab.runtime import warm

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime + warm.server_cpu_s()


def _floor(cpu_s: float) -> str:
    """The wall-time floor that ``cpu_s`` of work sets on this machine's cores."""
    cores = os.cpu_count() or 1
    return f"{cpu_s:.0f} CPU-s in its processes: no less than {cpu_s / cores:.0f} s on {cores} cores"


def rows() -> list[Row]:
    solutions = REPO_ROOT / "solutions"
    cpu_before = _children_cpu_s()
    report, ex01_s = _timed(lambda: grade_one(exercises()[1], solutions))
    ex01_cpu_s = _children_cpu_s() - cpu_before
    assert report.passed, report.feedback  # a fast grade of a wrong answer would mean nothing
    cpu_before = _children_cpu_s()
    reports, all_s = _timed(lambda: grade(solutions))
    all_cpu_s = _children_cpu_s() - cpu_before
    assert all(r.passed for r in reports), [r.feedback for r in reports if not r.passed]
    done, cycle_s = _timed(lambda: subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/tiers/test_nbgrader.py"],
        cwd=REPO_ROOT, capture_output=True, text=True))
    assert done.returncode == 0, done.stdout[-2000:]
    return [
        Row("grading", "grade exercise 1 (solution, W=2 and W=4), one grading subprocess", ex01_s, "s",
            f"{_verdict(ex01_s, TARGETS_S['ex01'])}; {_floor(ex01_cpu_s)}"),
        Row("grading", f"grade all {len(reports)} reference solutions (make grade DIR=solutions)", all_s, "s",
            f"{_verdict(all_s, TARGETS_S['solutions'])}; one grading subprocess each, in turn; {_floor(all_cpu_s)}"),
        Row("grading", "the nbgrader cycle test (pytest tests/tiers/test_nbgrader.py)", cycle_s, "s",
            _verdict(cycle_s, TARGETS_S["nbgrader"])),
    ]
