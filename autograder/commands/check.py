"""The grader from a notebook cell: ``from autograder import check; check(1)``.

Runs exactly what ``make grade`` (``python -m autograder grade --exercise N``) runs: the same
subprocess, checks and score. While it runs, the cell shows one line as each launch or scenario
starts and ends; then the feedback, as a table (criterion, points, message) in JupyterLab and as
plain text elsewhere. Raises :class:`ExerciseFailed` when the exercise is not fully correct, so an
nbgrader test cell calling it scores 0. Everything the ranks print stays in the grading
subprocess, so nothing reaches the cell's stderr (nbgrader fails a test cell on any stderr output).

Hints come in three tiers per criterion (the package's ``hints.py``, :func:`autograder.grader.registry.hints`):
``check(N, hint=1)`` adds, under each failed criterion's feedback, a nudge towards the concept; ``hint=2``
the mechanism; ``hint=3`` the API to use. Tiers, not one full hint: the learner asks for as much help as
they need, after a failure has told them what went wrong (the feedback names the cause; the hint helps
find the fix). Without ``hint`` one line says that a hint exists.
"""
from __future__ import annotations

import html
import time
from pathlib import Path

from ..grader.hints import check_tier, hint_lines
from ..grader.registry import exercises, hints
from ..grader.report import ExerciseReport
from ..grader.supervise import DEFAULT_DIR, grade_one


class ExerciseFailed(AssertionError):
    """The exercise scored less than full marks; the message is the feedback."""


class Feedback:
    """A report as IPython shows it: an HTML table in JupyterLab, the text feedback elsewhere."""

    def __init__(self, report: ExerciseReport):
        self.report = report

    def __repr__(self) -> str:
        r = self.report
        return f"score {r.score:g}/{r.max_score:g}\n{r.feedback}"

    def _repr_html_(self) -> str:
        r = self.report
        rows = "".join(
            f'<tr class="{"pass" if c.earned >= c.points else "fail"}">'
            f'<td>{"✔" if c.earned >= c.points else "✘"} {html.escape(c.name)}</td>'
            f'<td style="text-align:right">{c.earned:.3g}/{c.points:.3g}</td>'
            f'<td style="text-align:left;white-space:pre-wrap">{html.escape(c.feedback)}</td></tr>'
            for c in r.criteria)
        notes = "".join(f"<p>{html.escape(n)}</p>" for n in r.notes)
        return (f"<p><b>exercise {r.exercise} ({html.escape(r.name)}): {r.score:g}/{r.max_score:g}</b></p>"
                '<table class="distlab-feedback"><thead><tr><th>criterion</th><th>points</th>'
                f"<th>message</th></tr></thead><tbody>{rows}</tbody></table>{notes}")


def _show(report: ExerciseReport) -> None:
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        get_ipython = None
    if get_ipython is not None and get_ipython() is not None:
        display(Feedback(report))  # text/html and text/plain: nbgrader's feedback keeps both
    else:
        print(repr(Feedback(report)), flush=True)


def check(exercise: int, directory: str | Path | None = None, *, raise_on_fail: bool = True,
          hint: int | None = None) -> ExerciseReport:
    """Grade exercise ``exercise`` from ``directory`` (default: the repo's ``exercises/``).

    ``hint`` (1, 2 or 3): after the feedback, that tier of the hint of each failed criterion.
    """
    ex = exercises()[exercise]
    check_tier(hint)  # a wrong tier is said before a grading, not after it
    known = hints(exercise)
    folder = Path(directory) if directory is not None else DEFAULT_DIR
    start = time.monotonic()
    print(f"grading exercise {exercise} ({ex.name}) from {folder / ex.filename} ...", flush=True)
    report = grade_one(ex, folder, on_progress=lambda line: print(f"  {line}", flush=True))
    print(f"graded in {time.monotonic() - start:.0f} s", flush=True)
    _show(report)
    for line in hint_lines(report, known, hint):
        print(line, flush=True)
    if raise_on_fail and not report.passed:
        raise ExerciseFailed(f"exercise {exercise}: {report.score:g}/{report.max_score:g}; see the feedback above")
    return report
