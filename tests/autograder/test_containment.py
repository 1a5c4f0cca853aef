"""Learners' code is contained: whatever it starts ends with its grading, and cannot touch the verdict.

These run as the current user (a learner grading their own work); the
grading image's path, as root with a learner user, is in tests/distlab/test_sandbox.py.
Each submission is the reference solution plus a few lines at import
(tests/helpers/hostile.py), as a learner's module would do it.
"""
from __future__ import annotations

import pytest

from autograder.checks.ex07_pipeline import EXERCISE
from autograder.grader.supervise import grade_one
from tests.helpers import hostile

# Each test grades exercise 7 (a launch of 2 ranks, then its 1F1B step's of 4: a cheap full grading); what is
# contained is the same for every exercise, since every launch goes through the one supervisor.
pytestmark = pytest.mark.slow
FILE = EXERCISE.filename


@pytest.fixture
def pids(tmp_path):
    folder = tmp_path / "pids"
    folder.mkdir()
    return folder


def test_background_helpers_cost_no_marks_and_do_not_survive(tmp_path, pids, wait_for, leftover_processes):
    # Before containment, the detached child kept the output pipe open and the correct solution
    # scored 0 at the job's time limit; the scrubbed daemon outlived the grading.
    hostile.submission(tmp_path / "sub", pids, hostile.DETACHED, hostile.DAEMON, filename=FILE)
    report = grade_one(EXERCISE, tmp_path / "sub")
    assert report.score == report.max_score, report.feedback
    started = hostile.started(pids)
    assert len(started["detached"]) == 2 and len(started["daemon"]) == 2  # by rank 0 of each launch
    assert wait_for(lambda: hostile.alive(started["detached"] + started["daemon"]) == [], timeout=10)
    assert leftover_processes() == []


def test_a_daemon_that_rewrites_reports_changes_nothing(tmp_path, pids, wait_for):
    hostile.submission(tmp_path / "sub", pids, hostile.FAKE_REPORTS, hostile.BROKEN, filename=FILE)
    report = grade_one(EXERCISE, tmp_path / "sub")
    assert report.score == 0 and "RuntimeError: this submission does not work" in report.feedback
    started = hostile.started(pids)
    assert started["daemon"], "the report-rewriting daemon never started"
    assert wait_for(lambda: hostile.alive(started["daemon"]) == [], timeout=10)


def test_sys_exit_at_import_is_named(tmp_path, pids):
    hostile.submission(tmp_path / "sub", pids, hostile.EXIT_AT_IMPORT, filename=FILE)
    report = grade_one(EXERCISE, tmp_path / "sub")
    assert report.score == 0
    assert "your code called sys.exit() on rank" in report.feedback
    assert f"(sys.exit(0) was called) at {FILE} line" in report.feedback
    assert "the grader imports your file and calls its functions" in report.feedback
    assert "the grader could not finish" not in report.feedback
