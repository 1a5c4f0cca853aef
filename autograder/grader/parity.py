"""Parity of a distributed result with a single-process reference, with numbers for feedback.

Every distributed check compares with ``torch.testing.assert_close``; the
grader also needs *how far* and *where*, to tell the learner
"max abs difference 3e-2 in 'net.0.weight'" rather than just "wrong".
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Parity:
    ok: bool               # assert_close passed at the given tolerance
    max_abs_diff: float    # over every tensor compared (inf when shapes or keys disagree)
    worst: str             # the key (or "tensor") where it is largest, or what did not match

    def __bool__(self) -> bool:
        return self.ok


def _as_dict(x) -> dict:
    return x if isinstance(x, dict) else {"tensor": x}


def parity(got, expected, *, rtol: float | None = None, atol: float | None = None) -> Parity:
    """Compare tensors or dicts of tensors; ``rtol``/``atol`` default to assert_close's for the dtype."""
    got, expected = _as_dict(got), _as_dict(expected)
    if set(got) != set(expected):
        missing = sorted(set(expected) - set(got)) or sorted(set(got) - set(expected))
        return Parity(False, float("inf"), f"keys differ (e.g. {missing[0]!r})")
    diffs = {}
    for k in expected:
        a, b = torch.as_tensor(got[k]), torch.as_tensor(expected[k])
        if a.shape != b.shape:
            return Parity(False, float("inf"), f"{k!r} has shape {tuple(a.shape)}, expected {tuple(b.shape)}")
        diffs[k] = (a.double() - b.double()).abs().max().item() if a.numel() else 0.0
    worst = max(diffs, key=diffs.get) if diffs else ""
    try:
        torch.testing.assert_close(got, expected, rtol=rtol, atol=atol)
        ok = True
    except AssertionError:
        ok = False
    return Parity(ok, diffs.get(worst, 0.0), worst)
