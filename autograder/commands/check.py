"""The grader from a notebook cell: ``from autograder import check; check(1)``.

Runs exactly what ``make grade`` (``python -m autograder grade --exercise N``) runs: the same
subprocess, checks and score. While it runs, the cell shows one line as each launch or scenario
starts and ends; then the feedback, as a table (criterion, points, message) in JupyterLab and as
plain text elsewhere. Raises :class:`ExerciseFailed` when the exercise is not fully correct, so an
nbgrader test cell calling it scores 0. Everything the ranks print stays in the grading
subprocess, so nothing reaches the cell's stderr (nbgrader fails a test cell on any stderr output).

Hints come in three tiers per criterion (the package's ``hints.py``, :func:`autograder.grader.registry.hints`):
``check(N, hint=1)`` adds, under each failed criterion's feedback, why it matters; ``hint=2``
the mechanism; ``hint=3`` the API to use. Tiers, not one full hint: the learner asks for as much help as
they need, after a failure has told them what went wrong (the feedback names the cause; the hint helps
find the fix). Without ``hint`` one line says that a hint exists.
"""
from __future__ import annotations

import hashlib
import html
import time
from pathlib import Path

from ..grader.hints import check_tier, closing_line, feedback_with_hints, under_criteria
from ..grader.registry import Hints, exercises, hints
from ..grader.report import ExerciseReport
from ..grader.supervise import DEFAULT_DIR, grade_one


class ExerciseFailed(AssertionError):
    """The exercise scored less than full marks; the message is the score, the feedback is above it."""

    def _render_traceback_(self) -> list[str]:
        # IPython's hook for an exception's own rendering: the learner reads one line under the feedback,
        # not a traceback through the grader's code (nbgrader still sees the cell's error, and scores it 0)
        return [f"{type(self).__name__}: {self}"]


class Feedback:
    """A report as IPython shows it: an HTML table in JupyterLab, the text feedback elsewhere; with ``tier``,
    that tier of each failed criterion's hint under it (``known``: the exercise's hints)."""

    def __init__(self, report: ExerciseReport, known: Hints | None = None, tier: int | None = None):
        self.report, self.known, self.tier = report, known or {}, tier

    def __repr__(self) -> str:
        r = self.report
        return f"score {r.score:g}/{r.max_score:g}\n{feedback_with_hints(r, self.known, self.tier)}"

    def _repr_html_(self) -> str:
        r = self.report
        under = under_criteria(r, self.known, self.tier)
        rows = "".join(
            f'<tr class="{"pass" if c.earned >= c.points else "fail"}">'
            f'<td>{"✔" if c.earned >= c.points else "✘"} {html.escape(c.name)}</td>'
            f'<td style="text-align:right">{c.earned:.3g}/{c.points:.3g}</td>'
            f'<td style="text-align:left;white-space:pre-wrap">{html.escape(c.feedback)}'
            + (f'<br><i>{html.escape(under[i])}</i>' if i in under else "") + "</td></tr>"
            for i, c in enumerate(r.criteria))
        closing = closing_line(r, self.known, self.tier)
        notes = "".join(f"<p>{html.escape(n)}</p>" for n in [*r.notes, *([closing] if closing else [])])
        return (f"<p><b>exercise {r.exercise} ({html.escape(r.name)}): {r.score:g}/{r.max_score:g}</b></p>"
                '<table class="distlab-feedback"><thead><tr><th>criterion</th><th>points</th>'
                f"<th>message</th></tr></thead><tbody>{rows}</tbody></table>{notes}")


def _show(feedback: Feedback) -> None:
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        get_ipython = None
    if get_ipython is not None and get_ipython() is not None:
        display(feedback)  # text/html and text/plain: nbgrader's feedback keeps both
    else:
        print(repr(feedback), flush=True)


# This process's last grading of each exercise's file: (its path, its bytes' digest, the report). Asking for a
# hint right after a grading shows that grading again with the tier, instead of grading the same file again.
_LAST: dict[int, tuple[Path, str, ExerciseReport]] = {}


def _digest(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return ""


def check(exercise: int, directory: str | Path | None = None, *, raise_on_fail: bool = True,
          hint: int | None = None) -> ExerciseReport:
    """Grade exercise ``exercise`` from ``directory`` (default: the repo's ``exercises/``).

    ``hint`` (1, 2 or 3): under each failed criterion's feedback, that tier of its hint. Asked right after
    a grading of the same file, unchanged since, it shows that grading with the hint instead of grading again.
    """
    ex = exercises()[exercise]
    check_tier(hint)  # a wrong tier is said before a grading, not after it
    known = hints(exercise)
    folder = Path(directory) if directory is not None else DEFAULT_DIR
    path, digest = (folder / ex.filename).resolve(), _digest(folder / ex.filename)
    last = _LAST.get(exercise)
    if hint is not None and last and last[:2] == (path, digest) and digest:
        report = last[2]
        print(f"{folder / ex.filename} is unchanged since its last grading here: that grading, with hint {hint}",
              flush=True)
    else:
        start = time.monotonic()
        print(f"grading exercise {exercise} ({ex.name}) from {folder / ex.filename} ...", flush=True)
        report = grade_one(ex, folder, on_progress=lambda line: print(f"  {line}", flush=True))
        print(f"graded in {time.monotonic() - start:.0f} s", flush=True)
        _LAST[exercise] = (path, digest, report)
    _show(Feedback(report, known, hint))
    if raise_on_fail and not report.passed:
        raise ExerciseFailed(f"exercise {exercise}: {report.score:g}/{report.max_score:g}; see the feedback above")
    return report
