"""Hints in three tiers per criterion (a check package's ``hints.py``, read by
:func:`autograder.grader.registry.hints`): which tier to show under which failed criterion, and how to ask
for the next. The CLI (``--hint K``) and ``check(N, hint=K)`` print the same lines.
"""
from __future__ import annotations

from .registry import Hints
from .report import ExerciseReport

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
