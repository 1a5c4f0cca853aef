"""Exercise 7's 1F1B: whom each stage sends to and receives from. A stage of a pipeline talks to its neighbours
only, ``s - 1`` and ``s + 1``; at 2 stages a stage has one, and code written for 2 stages (the numbers 0 and 1, a
receive with no ``src``) passes there unseen: both are judged at ``Run.deeper``'s 4 stages, where stages 1 and 2
have two neighbours each.
"""
from __future__ import annotations

from ...grader.diagnosis import mistake
from .observations import Run


def _near(stage: int, p: int) -> list[int]:
    """Stage ``stage``'s neighbours among ``p``: ``s - 1`` and ``s + 1``, where they exist."""
    return [n for n in (stage - 1, stage + 1) if 0 <= n < p]


@mistake("1F1B: neighbours' ranks written as numbers (src=0, dst=1)")
def fixed_peer(step: Run, part: str = "") -> str | None:
    """A send or receive with a rank that is not a neighbour of the stage's (``s - 1``, ``s + 1``): at 2 stages
    the numbers 0 and 1 are the neighbours, at 4 they are not."""
    p = len(step.ranks)
    for r in step.ranks:
        near = _near(r.rank, p)
        if bad := next((c for c in r.p2p if c.peer is not None and c.peer not in near), None):  # None: unread
            said = " and ".join(f"rank {n}" for n in near)
            return (f"stage {r.rank} of {p} {'sent to' if bad.op == 'send' else 'received from'} rank {bad.peer} "
                    f"({bad.where}), but a stage sends to and receives from its neighbours only, {said}: write "
                    "them as rank - 1 and rank + 1 (rank = dist.get_rank()), not as the numbers that are right for "
                    "2 stages")
    return None


@mistake("1F1B: a receive that names no src")
def any_source(step: Run, part: str = "") -> str | None:
    """``dist.recv(buf)`` with no ``src`` takes the next message of any rank: a stage with two neighbours gets
    whichever of an activation (from ``s - 1``) and a gradient (from ``s + 1``) arrives first."""
    p = len(step.ranks)
    for r in step.ranks:
        near = _near(r.rank, p)
        unnamed = [c for c in r.p2p if c.op == "recv" and c.peer is None]
        if len(near) < 2 or not unnamed:
            continue
        came = sorted({c.source for c in unnamed if c.source is not None})
        fro = f", and took messages from ranks {' and '.join(map(str, came))} there" if len(came) > 1 else ""
        return (f"stage {r.rank} of {p} received with no src ({unnamed[0].where}){fro}: a receive without src "
                f"takes the next message of any rank, and stage {r.rank} has two neighbours, so stage {near[0]}'s "
                f"activations and stage {near[1]}'s gradients race for it. Name the peer: src=rank - 1 for an "
                "activation, src=rank + 1 for a gradient")
    return None
