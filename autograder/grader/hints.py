"""Hints in three tiers per criterion (a check package's ``hints.py``, read by
:func:`autograder.grader.registry.hints`): which tier to show under which failed criterion, and how to ask
for the next. The CLI (``--hint K``) and ``check(N, hint=K)`` print the same lines.
"""
from __future__ import annotations

from .registry import Hints
from .report import ExerciseReport

TIERS = ("why it matters", "the mechanism", "the API to use")


def check_tier(tier: int | None) -> None:
    if tier is not None and tier not in (1, 2, 3):
        raise ValueError(f"hint={tier!r}: the tiers are 1 ({TIERS[0]}), 2 ({TIERS[1]}) and 3 ({TIERS[2]})")


def _failed(report: ExerciseReport, known: Hints) -> dict[str, int]:
    """criterion key -> the index of its first failed criterion (a criterion judged at two world sizes fails
    twice; a criterion "not checked: needs ... first" gets no hint: the hint of the one it needs is the one)."""
    failed: dict[str, int] = {}
    for i, c in enumerate(report.criteria):
        if c.earned < c.points and c.key in known and not c.feedback.startswith("not checked"):
            failed.setdefault(c.key, i)
    return failed


def under_criteria(report: ExerciseReport, known: Hints, tier: int | None) -> dict[int, str]:
    """criterion index -> the hint line to show under it: tier ``tier`` of each failed criterion, once."""
    check_tier(tier)
    if tier is None:
        return {}
    return {i: f"hint {tier}/3 ({TIERS[tier - 1]}) for '{report.criteria[i].name}': {known[key][tier - 1]}"
            for key, i in _failed(report, known).items()}


def closing_line(report: ExerciseReport, known: Hints, tier: int | None, *,
                 ask: str = "check({exercise}, hint={tier})") -> str:
    """How to ask for the next tier (``tier=None``: for the first), if a failed criterion has hints; else "".
    ``ask`` is how the caller's user asks for a tier (the CLI's is ``--exercise N --hint K``)."""
    check_tier(tier)
    if not _failed(report, known):
        return ""
    if tier is None:
        return f"hints: {ask.format(exercise=report.exercise, tier=1)} gives {TIERS[0]} for each failed criterion"
    return (f"next: {ask.format(exercise=report.exercise, tier=tier + 1)} gives {TIERS[tier]}" if tier < 3
            else "that was the last tier: the docstring of the function you write holds the contract")


def feedback_with_hints(report: ExerciseReport, known: Hints, tier: int | None, *,
                        ask: str = "check({exercise}, hint={tier})") -> str:
    """``report.feedback`` with tier ``tier`` of each failed criterion's hint under it, and the closing line."""
    under = under_criteria(report, known, tier)
    lines = []
    for i, c in enumerate(report.criteria):
        lines += [c.line] + ([f"  {under[i]}"] if i in under else [])
    closing = closing_line(report, known, tier, ask=ask)
    return "\n".join(lines + report.notes + ([closing] if closing else []))
