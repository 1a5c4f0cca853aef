"""Exercise 11's sort_by_expert on the inputs its contract names beyond the routed step's, on each rank alone (no
communication): what it returned on each (``EdgeCase``), judged by ``causes.edge_case_missed``; and ``as_ints``,
the contract's list of Python ints.
"""
from __future__ import annotations

import torch

from ...rank import attempt, raised
from .observations import EdgeCase


def valid_perm(perm, expert: torch.Tensor, keep: torch.Tensor) -> bool:
    """Whether ``perm`` lists exactly the kept slots, in expert order."""
    if not isinstance(perm, torch.Tensor) or perm.dtype != torch.int64 or perm.dim() != 1:
        return False
    if sorted(perm.tolist()) != keep.nonzero().squeeze(1).tolist():
        return False
    return bool((expert[perm].diff() >= 0).all()) if len(perm) > 1 else True


# The inputs sort_by_expert's contract names beyond the routed step's: an expert with none (the last one, which a
# count of the experts present leaves out), no slot kept, every slot to one expert, an expert with one slot (where
# a per-expert nonzero().squeeze() gives a 0-d tensor); as (name, expert, keep) at W.
def edge_cases(world: int) -> list[tuple[str, list[int], list[bool]]]:
    return [("the last expert gets no slot", [w % (world - 1) for w in range(6)], [True] * 6),
            ("no slot is kept", [w % world for w in range(5)], [False] * 5),
            ("every slot goes to the last expert", [world - 1] * 4, [True, False, True, True]),
            ("an expert gets a single kept slot", [0] + [world - 1] * 3, [True] * 4)]


def observe_edges(learner, world: int) -> list[EdgeCase]:
    out = []
    for name, expert, keep in edge_cases(world):
        e, k = torch.tensor(expert, dtype=torch.int64), torch.tensor(keep)
        got, exc = attempt(learner.sort_by_expert, e, k, world)
        case = EdgeCase(name=name, expert=expert, keep=keep, error=raised(exc) if exc is not None else "")
        if isinstance(got, tuple) and len(got) == 2:
            case.send = as_ints(got[1]) if as_ints(got[1]) is not None else repr(got[1])[:80]
            case.perm_ok = valid_perm(got[0], e, k)
        out.append(case)
    return out


def as_ints(value) -> list | None:
    """A list of Python ints, as the contract asks, or None (a tensor, a list of tensors, anything else)."""
    ok = isinstance(value, (list, tuple)) and all(type(v) is int for v in value)
    return list(value) if ok else None
