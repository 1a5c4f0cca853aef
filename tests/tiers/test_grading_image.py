"""The grading image's whole flow, without Docker: ``docker/grade.sh mark`` as root on a hostile class.

Needs root (skipped otherwise): it creates a real unprivileged learner user,
as the image has ``student``, and an interpreter that user can read. Six
learners submitted exercise 7 (the cheapest to grade: one launch at 2 ranks;
this test is about the sandbox, not the exercise); all but one are hostile
(tests/helpers/hostile.py):

* honest    the reference solution                                   -> full marks
* writer    at import, writes the gradebook, another learner's file
            and the grader's code                                    -> 0, nothing written
* rewriter  a daemon that rewrites every report it can find          -> 0
* forkbomb  forks up to the learner's process limit                  -> 0
* membomb   reserves memory up to the learner's address-space limit  -> 0
* spew      prints 256 MiB, more than the grader keeps of any output -> 0

Pass: those scores; a line for each hostile learner in
``nbgrader_problems.txt``; the bombs stopped by the learner's limits, not
by the machine's; the gradebook, the other learners' files and the grader's
code untouched; no process of the learner user left; the run bounded (by
grade.sh's own time limit, and this test's).
"""
from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from autograder.nbgrader.course import main as nbgrader_main
from autograder.grader.registry import exercises
from tests.helpers import REPO, hostile
from tests.helpers.learner_user import learner_processes, learner_user, readable_install, world_readable_dir

pytestmark = [pytest.mark.timeout(1200), pytest.mark.nbgrader, pytest.mark.root, pytest.mark.slow]
EX = exercises()[7]
ASSIGNMENT = Path(EX.filename).stem
MAX_PROCS, MAX_MEMORY = 512, 4 << 30  # the learner's rlimits in this test (distlab.runtime.sandbox)
HOSTILE = {"writer": (hostile.WRITER,), "rewriter": (hostile.FAKE_REPORTS, hostile.BROKEN),
           "forkbomb": (hostile.FORK_BOMB,), "membomb": (hostile.MEMORY_BOMB,), "spew": (hostile.SPEW,)}


def digest(paths) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in paths if p.is_file()}


def submit(course: Path, drop: Path) -> None:
    """Every learner's folder in ``submitted/``, made from the released assignment."""
    released = course / "release" / ASSIGNMENT
    for name in ("honest", *HOSTILE):
        folder = course / "submitted" / name / ASSIGNMENT
        shutil.copytree(released, folder)
        if name == "honest":
            shutil.copy(REPO / "solutions" / EX.filename, folder)
            continue
        targets = [str(course / "gradebook.db"), str(course / "submitted" / "honest" / ASSIGNMENT / EX.filename),
                   str(REPO / "distlab" / "__init__.py")]
        hostile.submission(folder, drop, *HOSTILE[name], filename=EX.filename, targets=targets)


def scores(db: Path) -> dict[str, float]:
    with sqlite3.connect(db) as con:
        rows = con.execute(
            "SELECT sa.student_id, COALESCE(g.manual_score, g.auto_score) FROM grade g "
            "JOIN submitted_notebook sn ON g.notebook_id = sn.id "
            "JOIN submitted_assignment sa ON sn.assignment_id = sa.id").fetchall()
    return dict(rows)


@pytest.fixture(scope="module")
def graded():
    user = learner_user()
    python, repo = readable_install()
    root = world_readable_dir("distlab-image-")
    course, drop = root / "course", root / "drop"
    course.mkdir()
    drop.mkdir()
    drop.chmod(0o1777)  # where the hostile modules note the pids they start
    shutil.copy(REPO / "nbgrader" / "nbgrader_config.py", course)
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}  # kernels behave as in class
    env.update(PYTHONPATH=str(repo), JUPYTER_DATA_DIR=str(root / "jupyter"), DISTLAB_STUDENT_USER=user,
               DISTLAB_COURSE=str(course), DISTLAB_PYTHON=python, DISTLAB_KERNELS=str(root / "kernels"),
               JUPYTER_RUNTIME_DIR=str(root / "runtime"), DISTLAB_TIME_LIMIT="900",
               DISTLAB_STUDENT_MAX_PROCS=str(MAX_PROCS), DISTLAB_STUDENT_MAX_MEMORY=str(MAX_MEMORY))
    start = time.perf_counter()
    try:
        # On the instructor's machine (make nbgrader STEP=generate), here in this process: no learner code runs.
        assert nbgrader_main(["generate", "--course-dir", str(course), "--exercise", str(EX.number)]) == 0
        print(f"[grading image] generate done at {time.perf_counter() - start:.1f} s", flush=True)
        submit(course, drop)
        protected = [*(course / "submitted").rglob("*.py"), *(repo / "distlab").rglob("*.py"),
                     *(repo / "autograder").rglob("*.py")]
        before = digest(protected)
        done = subprocess.run([str(repo / "docker" / "grade.sh"), "mark", "--exercise", str(EX.number)], cwd=repo,
                              env=env, capture_output=True, text=True, timeout=1100)
        print(done.stdout[-20000:], done.stderr[-5000:], sep="\n")  # shown when a test fails
        print(f"[grading image] grade.sh mark done at {time.perf_counter() - start:.1f} s", flush=True)
        yield {"done": done, "course": course, "before": before, "after": digest(protected), "drop": drop}
    finally:
        from distlab.runtime.process import kill_user_processes

        kill_user_processes(user)
        shutil.rmtree(root, ignore_errors=True)


def test_the_honest_learner_gets_full_marks_and_the_hostile_ones_zero(graded):
    assert graded["done"].returncode == 0, graded["done"].stdout[-3000:] + graded["done"].stderr[-3000:]
    got = scores(graded["course"] / "gradebook.db")
    assert got == {"honest": EX.max_score, **{name: 0.0 for name in HOSTILE}}, got


def test_each_hostile_learner_has_a_line_for_the_instructor(graded):
    notes = (graded["course"] / "nbgrader_problems.txt").read_text()
    for name in HOSTILE:
        assert f"{name} / {ASSIGNMENT}: 0 points, the submission did not run: " in notes, (name, notes)
    assert "honest" not in notes


def test_the_bombs_were_stopped_by_the_learners_limits(graded):
    reached = hostile.recorded(graded["drop"])
    assert 0 < int(reached.get("forkbomb", 0)) <= MAX_PROCS, reached  # a fork failed, at the learner's limit
    assert 0 < int(reached.get("membomb", 0)) <= MAX_MEMORY, reached  # address space when memory ran out
    assert int(reached.get("spew", 0)) == 256 << 20, reached  # all of it was printed before the module failed


def test_nothing_of_the_instructor_or_other_learners_was_written(graded):
    assert graded["after"] == graded["before"]
    assert b"HACKED" not in (graded["course"] / "gradebook.db").read_bytes()


def test_no_process_of_the_learner_is_left_and_no_daemon_survived(graded, wait_for):
    assert wait_for(lambda: learner_processes() == [], timeout=10), learner_processes()
    started = hostile.started(graded["drop"])
    assert started.get("daemon"), "the report-rewriting daemon never started"
    assert wait_for(lambda: hostile.alive(started["daemon"]) == [], timeout=10)
