"""The grader from a notebook cell: ``from autograder.commands.check import check; check(1)``.

Runs exactly what ``make grade`` (``python -m autograder --exercise N``) runs: the same
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

from ..grader.registry import Hints, exercises, hints
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


TIERS = ("a nudge towards the concept", "the mechanism", "the API to use")


def check_tier(tier: int | None) -> None:
    if tier is not None and tier not in (1, 2, 3):
        raise ValueError(f"hint={tier!r}: the tiers are 1 ({TIERS[0]}), 2 ({TIERS[1]}) and 3 ({TIERS[2]})")


def hint_lines(report: ExerciseReport, known: Hints, tier: int | None, *,
               ask: str = "check({exercise}, hint={tier})") -> list[str]:
    """The hint lines for ``report``'s failed criteria: tier ``tier`` (1-3) of each, once per criterion
    function (a criterion judged at two world sizes fails twice), and how to ask for the next tier.
    A criterion "not checked: needs ... first" gets none: the hint of the one it needs is the one to read.

    ``tier=None``: one line saying how to ask for the first tier, if a failed criterion has hints.
    ``ask`` is how the caller's user asks for a tier (the CLI's is ``--exercise N --hint K``).
    """
    check_tier(tier)
    failed = {c.key: c.name for c in report.criteria
              if c.earned < c.points and c.key in known and not c.feedback.startswith("not checked")}
    if not failed:
        return []
    if tier is None:
        return [f"hints: {ask.format(exercise=report.exercise, tier=1)} gives {TIERS[0]} for each failed criterion"]
    lines = [f"hint {tier}/3 ({TIERS[tier - 1]}) for '{name}': {known[key][tier - 1]}" for key, name in failed.items()]
    lines.append(f"next: {ask.format(exercise=report.exercise, tier=tier + 1)} gives {TIERS[tier]}" if tier < 3
                 else "that was the last tier: the docstring of the function you write holds the contract")
    return lines


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
