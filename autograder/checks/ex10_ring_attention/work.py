"""Exercise 10's work criteria: every rank of the causal ring computes the same number of scores, and none for a
pair of chunks the mask hides entirely (the reason for the zig-zag layout), counted from the FLOPs of each rank's
matrix products (``distlab.measure.flops``; ``Run.blocks``: in blocks of ``c x c`` scores), forward and backward,
judged once the ring computes the right thing; and the named way to get it wrong (``computed_whole``).
"""
from __future__ import annotations

from typing import Callable

from ...grader.diagnosis import diagnose, mistake
from ...grader.parity import parity
from ...grader.report import Verdict, criterion, failed, passed
from .causes import grads_close, never_waited, unwritten
from .observations import Ring, Run
from .reference import ATOL, RTOL, SEQ

# The forward's work (``Run.blocks``: each rank's scores in blocks of c x c, a chunk against a chunk)

_WHOLE = {(4, 4): "every other rank's shard was computed whole, n x n = 4 blocks, where 2 of them are visible: "
                  "the pairs of chunks whose every key is after every query were computed and masked",
          (4, 2): "an earlier rank's shard was computed whole, n x n = 4 blocks, though its late chunk is after "
                  "every query here: only its early chunk (2 blocks) is visible",
          (2, 4): "a later rank's shard was computed whole, n x n = 4 blocks, though this rank's early chunk of "
                  "queries sees none of it: only the late chunk's queries (2 blocks) see its keys"}


@mistake("shards computed whole: work hidden by the mask, unbalanced")
def computed_whole(run: Run) -> str | None:
    """Each rank's blocks are ``own + earlier * r + later * (W - 1 - r)`` for a ring that computes ``earlier``
    blocks of each earlier rank's shard and ``later`` of each later one's (2 is what the mask leaves visible);
    forward or backward (``run`` may be ``Run.backward()``: five products a block)."""
    blocks = [round(b, 1) for b in map(run.blocks, range(run.world))]
    blocks = [round(b) if abs(b - round(b)) < 0.25 else b for b in blocks]  # a backward's small products aside
    for (earlier, later), why in _WHOLE.items():
        for own in (4, 3):  # the diagonal shard whole, or its hidden pair of chunks skipped
            if blocks == [own + earlier * r + later * (run.world - 1 - r) for r in range(run.world)]:
                counts = ", ".join(f"rank {r} {b:g}" for r, b in enumerate(blocks))
                return (f"the ranks computed {counts} blocks of c x c scores per head: {why}. Skip those pairs and "
                        f"every rank computes the same {own + 2 * (run.world - 1)} blocks")
    return None


WORK = [computed_whole]


def _blocks(run: Run) -> list[float]:
    return [round(run.blocks(r), 3) for r in range(run.world)]


def _counts(blocks: list[float]) -> str:
    return ", ".join(f"rank {r} {b:g}" for r, b in enumerate(blocks))


def _not_judged(run: Run, name: str, right: Callable[[Ring], bool], wrong: str) -> str | None:
    """Why the work of ``run``'s ring (function ``name``'s) is not judged: not written, a race, a ring that did not
    finish, or a wrong result on some rank (``right``, per rank); ``None`` when it is judged."""
    if todo := unwritten(run, name):
        return f"not checked: {todo}"
    if race := never_waited(run):  # what it computed is a race's outcome, and so is whether it was right
        return race
    if run.errors():
        return f"not judged: the ring did not finish on rank {run.errors()[0].rank}"
    if not all(map(right, run.ranks)):
        return f"not judged: {wrong} (the work of a ring is judged once it computes the right thing)"
    return None


@criterion("[W={world}] every rank computes the same attention work, none of it hidden by the mask", points=2)
def work_balanced(run: Run) -> Verdict:
    def right(o: Ring) -> bool:
        ref = run.reference[o.rank]
        return o.out is not None and o.out.shape == ref.shape and parity(o.out, ref, rtol=RTOL, atol=ATOL).ok

    if why := _not_judged(run, "ring_attention", right, "the output differs from the whole sequence's"):
        return failed(why)
    blocks, c, most = _blocks(run), SEQ // (2 * run.world), 2 * run.world + 2
    if len(set(blocks)) > 1:
        return failed(diagnose(WORK, run) or f"the ranks computed different numbers of scores, in blocks of c x c = "
                      f"{c} x {c} per head: {_counts(blocks)}. Each step of the ring waits for its busiest rank; in "
                      "the zig-zag layout every rank has the same work once it skips what the mask hides entirely")
    if blocks[0] > most:
        return failed(diagnose(WORK, run) or f"every rank computed {blocks[0]:g} blocks of c x c = {c} x {c} scores "
                      f"per head, more than the {most} the causal ring needs (its own shard, n x n = 4 blocks, and "
                      "2 for each other shard): pairs of chunks whose every key is after every query were computed")
    return passed(f"{blocks[0]:g} blocks of {c} x {c} scores per head on every rank (at most {most})",
                  **{f"W{run.world}_blocks_per_rank": blocks[0]})


# The backward's five products a block, written another way (autograd through a block, D by einsum), may cost
# a little more: a quarter's slack, where the hidden blocks computed too cost a third more at W = 2, 60% at 4.
BACKWARD_SLACK = 1.25


@criterion("[W={world}] backward: every rank computes the same work, none of it hidden by the mask", points=1)
def backward_work_balanced(run: Run) -> Verdict:
    b = run.backward()
    if why := _not_judged(b, "ring_attention_backward", lambda o: grads_close(o.grads, b.grads[o.rank]),
                          "the gradients differ from autograd's"):
        return failed(why)
    blocks, c, most = _blocks(b), SEQ // (2 * run.world), 2 * run.world + 2
    if len(set(blocks)) > 1 or blocks[0] > BACKWARD_SLACK * most:
        return failed(diagnose(WORK, b) or f"the ranks' backwards did matrix products worth {_counts(blocks)} blocks "
                      f"of c x c = {c} x {c} scores per head (five products a block), where the forward's blocks are "
                      f"{most} on every rank: compute the blocks the forward computes, skipping the same ones")
    return passed(f"matrix products worth {blocks[0]:g} blocks of {c} x {c} scores per head on every rank (five "
                  "products a block)", **{f"W{run.world}_backward_blocks_per_rank": blocks[0]})
