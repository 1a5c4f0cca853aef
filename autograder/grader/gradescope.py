"""A grading as Gradescope reads it: the reports of one submission mapped to ``results.json``.

Gradescope's autograder specification (gradescope-autograders.readthedocs.io, "Autograder Specifications"):
``run_autograder`` writes ``/autograder/results/results.json``, an object with an optional top-level ``score``
(it overrides the tests' total), ``execution_time`` (seconds), ``output`` (text for the whole submission),
``visibility``, ``stdout_visibility``, ``extra_data``, and ``tests``: each with ``score``, ``max_score``,
``status`` (``passed`` or ``failed``), ``name``, ``number``, ``output``, ``tags``, ``visibility`` and
``extra_data``. A visibility is one of :data:`VISIBILITIES`.

What this grader writes:

* one test per criterion of every graded exercise, named ``Exercise N (name): criterion``, numbered
  ``N.i``, with its points as ``max_score``, what it earned as ``score``, and as ``output`` its feedback line
  (what the learner reads from ``check(N)``) with, under a failed criterion, the first tier of its hint
  (why it matters: :mod:`autograder.grader.hints`);
* a top-level ``score``, the exercises' total; ``execution_time``; an ``output`` with each exercise's
  score, its notes and how to ask for the next tier of the hints in the course's notebook;
  ``stdout_visibility`` ``hidden`` (the grading's progress is for the instructor).

**A grading the machine could not finish** (:attr:`ExerciseReport.not_graded`: still advancing when its time
ran out) has no valid ``results.json``. Gradescope requires a score (at the top level or on every test) and
would record any number written, 0 included, as the grade; otter-grader reports its own failures as 0. Here
:func:`unfinished` names such gradings and ``run_autograder`` writes no ``results.json`` at all: Gradescope
then shows the submission as "The autograder failed to execute correctly", with no score, its stdout
(:func:`unfinished_message`) tells the instructor why, and "Rerun Autograder" grades it again.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Callable

from .hints import closing_line, under_criteria
from .registry import Hints
from .report import ExerciseReport

VISIBILITIES = ("hidden", "after_due_date", "after_published", "visible")
RESULTS = "results.json"
ASK = "check({exercise}, hint={tier}) in the course's notebook"


def _round(x: float) -> float:
    return round(float(x), 2)


def criterion_tests(report: ExerciseReport, known: Hints, visibility: str = "visible") -> list[dict]:
    """One Gradescope test per criterion of ``report``: its feedback, and the tier-1 hint under a failed one."""
    hints = under_criteria(report, known, 1)
    tests = []
    for i, c in enumerate(report.criteria):
        ok = c.earned >= c.points
        output = c.feedback or ("passed" if ok else "failed")
        if i in hints:
            output += f"\n{hints[i]}"
        tests.append({"name": f"Exercise {report.exercise} ({report.name}): {c.name}",
                      "number": f"{report.exercise}.{i + 1}", "score": _round(c.earned),
                      "max_score": _round(c.points), "status": "passed" if ok else "failed",
                      "output": output, "visibility": visibility})
    return tests


def summary(report: ExerciseReport, known: Hints) -> str:
    """The exercise's lines of the top-level output: its score, why it did not run, its notes, the next tier."""
    lines = [f"Exercise {report.exercise} ({report.name}): {report.score:g}/{report.max_score:g}"
             + ("" if report.handed_in == "file" else f" ({report.handed_in})")]
    lines += [f"  {note}" for note in report.notes]
    if closing := closing_line(report, known, 1, ask=ASK):
        lines.append(f"  {closing}")
    return "\n".join(lines)


def results(reports: list[ExerciseReport], hints_of: Callable[[int], Hints], execution_time: float,
            visibility: str = "visible") -> dict:
    """``results.json`` for the graded ``reports`` (none unfinished: see :func:`unfinished`); ``hints_of(N)`` is
    exercise N's hints (:func:`autograder.grader.registry.hints`), ``visibility`` every test's."""
    if visibility not in VISIBILITIES:
        raise ValueError(f"visibility {visibility!r}: one of {', '.join(VISIBILITIES)}")
    if left := unfinished(reports):
        raise ValueError(f"exercise {left[0].exercise} was not graded: such a grading has no results.json")
    tests = [t for r in reports for t in criterion_tests(r, hints_of(r.exercise), visibility)]
    total = sum(r.score for r in reports)
    return {"score": _round(total), "execution_time": int(round(execution_time)),
            "output": "\n".join([f"Score: {total:g}/{sum(r.max_score for r in reports):g}",
                                 *(summary(r, hints_of(r.exercise)) for r in reports)]),
            "stdout_visibility": "hidden", "tests": tests}


def unfinished(reports: list[ExerciseReport]) -> list[ExerciseReport]:
    """The reports whose grading the machine could not finish (not scored: grade them again)."""
    return [r for r in reports if r.not_graded]


def unfinished_message(reports: list[ExerciseReport]) -> str:
    """What ``run_autograder`` prints (the instructor's stdout) instead of writing a ``results.json``."""
    lines = ["NOT GRADED: this machine could not finish the grading of "
             + ", ".join(f"exercise {r.exercise}" for r in unfinished(reports)) + ", so no results.json is "
             "written and Gradescope records no score (not a 0). Rerun the autograder on this submission; if it "
             "happens again, give the autograder more CPUs (Autograder Settings) or rebuild the zip with a "
             "larger --time-scale."]
    lines += [f"  exercise {r.exercise}: {r.not_graded}" for r in unfinished(reports)]
    return "\n".join(lines)


def write_results(doc: dict, folder: str | os.PathLike) -> Path:
    """Write ``doc`` as ``folder/results.json`` whole (a temporary file renamed: never half a file)."""
    folder = Path(folder)
    fd, tmp = tempfile.mkstemp(prefix=".results-", suffix=".json", dir=folder)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=2)
        os.chmod(tmp, 0o644)
        os.replace(tmp, folder / RESULTS)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return folder / RESULTS
