"""The grader from a notebook cell: ``from autograder.notebook import check; check(1)``.

Runs exactly what ``python -m autograder --exercise N`` runs (same subprocess,
same checks, same score) and prints the feedback. Raises
:class:`ExerciseFailed` when the exercise is not fully correct, so an
nbgrader test cell calling it scores 0. Everything the ranks print stays in
the grading subprocess, so nothing reaches the cell's stderr (nbgrader
fails a test cell on any stderr output).
"""
from __future__ import annotations

from pathlib import Path

from .registry import exercises
from .report import ExerciseReport
from .runner import DEFAULT_DIR, grade_one


class ExerciseFailed(AssertionError):
    """The exercise scored less than full marks; the message is the feedback."""


def check(exercise: int, directory: str | Path | None = None, *, raise_on_fail: bool = True) -> ExerciseReport:
    """Grade exercise ``exercise`` from ``directory`` (default: the repo's ``exercises/``)."""
    ex = exercises()[exercise]
    folder = Path(directory) if directory is not None else DEFAULT_DIR
    print(f"grading exercise {exercise} ({ex.name}) from {folder / ex.filename} ...", flush=True)
    report = grade_one(ex, folder)
    print(f"score {report.score:g}/{report.max_score:g}\n{report.feedback}", flush=True)
    if raise_on_fail and not report.passed:
        raise ExerciseFailed(f"exercise {exercise}: {report.score:g}/{report.max_score:g}; see the feedback above")
    return report
