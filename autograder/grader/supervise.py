"""Grade exercises, each in its own subprocess with its own time limit.

Whatever happens in one exercise's grading (a hang, a crash of the
interpreter, a report that is not valid JSON) it scores 0 with one clear
line, every process it started is ended, and the other exercises are still
graded.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from distlab.runtime import warm
from distlab.runtime.importing import REPO_ROOT, with_repo_on_path
from distlab.runtime.process import PROGRESS_VAR, TIME_SCALE_VAR, Budget, ProgressLimit
from distlab.runtime.sandbox import SCRATCH_VAR, STUDENT_USER_VAR, SandboxError, preflight

from .progress import Callback, relay
from .registry import Exercise, exercises
from .report import ExerciseReport
from ..grader.stubs import untouched

DEFAULT_DIR = REPO_ROOT / "exercises"


def grade_one(ex: Exercise, directory: Path, time_limit: float | None = None, *,
              on_progress: Callback = None, learner: str | None = None) -> ExerciseReport:
    """Grade ``ex`` from the file in ``directory`` in a subprocess limited to ``time_limit`` nominal seconds
    (default the exercise's), at this machine's scale: the one :class:`~distlab.runtime.process.Budget` of
    the grading, whose scale the subprocess and its launches are handed rather than read again.

    The grading subprocess (``autograder.grader.main``, forked from the warm server: :func:`warm.run_module`)
    runs as this process's user and never imports the learner's file; only the torchrun ranks it launches
    do, as the learner user in the grading image (:mod:`distlab.runtime.sandbox`). Its report goes to a
    private folder that nothing of the learner's ever learns the name of, and that the learner user cannot
    enter; the ranks get a separate scratch folder as their ``TMPDIR``. ``on_progress`` receives a line as
    each launch or scenario starts and ends (:mod:`autograder.grader.progress`). ``learner``: in the sandbox,
    the user this grading's ranks run as (default ``DISTLAB_STUDENT_USER``; :mod:`autograder.commands.classroom`
    gives each concurrent grading its own).
    """
    budget = Budget.read(time_limit or ex.time_limit)
    limit_s = budget.limit_s
    report = ex.new_report()
    path = Path(directory) / ex.filename
    if not path.is_file():
        return report.nothing_handed_in(f"{ex.filename} not found in {directory}: nothing to grade", "missing")
    if stub := untouched(path, REPO_ROOT / "solutions" / ex.filename):
        return report.nothing_handed_in(stub, "stub")  # the released stub, unchanged: no job to start to know that
    try:
        preflight()  # once per process; the grading subprocess inherits that it was done
    except SandboxError as exc:
        return report.did_not_run(f"the grader is not set up: {exc}")
    with tempfile.TemporaryDirectory(prefix="autograder-") as private, \
            tempfile.TemporaryDirectory(prefix="autograder-scratch-", ignore_cleanup_errors=True) as scratch:
        out = Path(private) / "report.json"
        # Everything the grading subprocess and its ranks put in temp files lands in the scratch folder
        # and goes with it, even when they are killed before they can clean up after themselves.
        warm.available()  # the server is up, and named in env below: the grading process launches through it too
        progress = Path(private) / "progress"  # the launches count their ranks' advances here
        env = {**os.environ, "TMPDIR": scratch, SCRATCH_VAR: scratch, PROGRESS_VAR: str(progress),
               "PYTHONPATH": with_repo_on_path(os.environ), **({STUDENT_USER_VAR: learner} if learner else {}),
               **budget.env()}
        limit = ProgressLimit(str(progress), limit_s, recent_s=budget.scaled(5))
        # Forked from this process's warm server (torch imported once, for every grading and launch of the
        # process: a notebook kernel's check(N), a class), or a new interpreter where there can be none.
        finished = warm.run_module("autograder.grader.main", [str(ex.number), str(path.resolve()), str(out)],
                                   timeout=limit_s, env=env, cwd=REPO_ROOT, on_line=relay(on_progress),
                                   should_stop=limit)
        if finished.timed_out and limit.advancing:  # slow is not wrong: the code is not scored
            return report.machine_too_slow(
                f"this machine was too slow for this grading: it was still advancing "
                f"{finished.wall_s - limit_s:.0f} s past its {limit_s:g} s limit "
                f"(grade again with {TIME_SCALE_VAR}=2)")
        if finished.timed_out:
            return report.did_not_run(
                f"grading took longer than its {limit_s:g} s limit and was stopped: an endless loop "
                f"in your code? (If this machine is just slow or busy, {TIME_SCALE_VAR}=2 allows twice as long.)")
        try:
            return ExerciseReport.from_dict(json.loads(out.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            tail = "\n".join(finished.lines[-8:])
            return report.did_not_run(f"the grader could not finish (exit code {finished.returncode}):\n{tail}")


def grade(directory: Path = DEFAULT_DIR, only: list[int] | None = None, *,
          on_progress: Callback = None) -> list[ExerciseReport]:
    """Grade the exercises numbered ``only`` (default: every exercise whose file is in ``directory``)."""
    known = exercises()
    if only is None:
        only = [n for n, ex in known.items() if (Path(directory) / ex.filename).is_file()]
    reports = []
    for n in only:
        if on_progress:
            on_progress(f"exercise {n} ({known[n].filename})")
        reports.append(grade_one(known[n], Path(directory), on_progress=on_progress))
    return reports
