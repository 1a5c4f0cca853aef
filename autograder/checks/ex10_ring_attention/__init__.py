"""Exercise 10 check: the balanced causal ring by hand, forward and backward, graded at 2 and 4 ranks.

The grader makes the whole sequence's ``q, k, v`` (seeded), gives each rank its zig-zag shard (chunks ``r``
and ``2W - 1 - r`` of ``S / 2W`` positions; Llama 3's layout, and ring-flash-attention's ``zigzag_ring``) and
runs the learner's ``ring_attention`` on it, then its ``ring_attention_backward`` on the same shards with
the exact ``out``, ``lse`` and a seeded ``dout`` (graded apart: a wrong forward costs the backward
nothing), each ring with every send and receive recorded (the harness's ``P2PSpy``:
``dist.send/recv/isend/irecv`` and the ops of ``dist.batch_isend_irecv``, with their peers and what
each receive got), every collective (``CollectiveRecorder``) and the FLOPs of its matrix products
(``FlopCounterMode``). Each file runs in a process group of its own, so a ring that deadlocks times out
(gloo) and costs only that file's marks; each ring is kept as it returns, so one whose message aborts gloo
(larger than its receive buffer) costs its own ring's marks only (``grader.parts``). The grading process
checks, against the single-process reference (Liu et al. 2023, "Ring Attention with Blockwise Transformers";
the reference is ``F.scaled_dot_product_attention(is_causal=True)`` on the whole sequence):

* parity: each rank's output is its rows of the whole sequence's causal attention;
* the ring: each rank sent to one neighbour and received from the other, ``W - 1`` key/value shards
  of the recorded bytes, the shards it received came from every other rank (it forwards what it
  receives), and no collective ran;
* the work: every rank computed the same number of scores (its matrix products' FLOPs, in blocks of
  ``c x c``), and no more than the causal ring needs (``2W + 2`` blocks: its own shard whole and half of
  each other one), judged once the output is right;
* the backward (FlashAttention-2's backward, Dao 2023, per block; the reference is autograd through the
  same ``F.scaled_dot_product_attention`` on the whole sequence): each rank's ``dq``, and its own shards'
  ``dk, dv``; its ring: ``k, v`` with their ``dk, dv`` ``W - 1`` times and ``dk, dv`` once more, home,
  ``4 W - 2`` shards of bytes to one neighbour and from the other, every other rank's keys received,
  no collective; its work the same on every rank.

| mistake | message |
|---|---|
| a function still raises NotImplementedError | "ring_attention_backward is not implemented yet (... line 92 ...)" |
| every rank sends before it receives: a deadlock | "all 4 ranks were waiting in a blocking dist.send at once ..." |
| each shard sent straight to every rank, not passed round the ring | "rank 0 sent to ranks 1, 2, 3 in turn, ..." |
| each step's shard received into the tensor it is sent from | "at step 1 rank 0 received into the tensor it was ..." |
| sends to and receives from the same neighbour | "rank 0 sent to rank 1 and also waited for a shard from rank 1 ..." |
| forwards its own shard instead of the one it received | "rank 2 received rank 1's keys at each of its 3 ..." |
| k and v packed along the batch, read back as k and v | "rank 0 sent k and v as one tensor of shape [4, 2, 16, 8] ...|
| a fully masked shard merged: NaN | "rank 0's output is NaN in 16 of its 32 (batch, head, position) rows: ..." |
| partial outputs averaged instead of weighed by their log-sum-exp | "rank 3's output is (out + block_out) / 2 ..." |
| max of the log-sum-exps without rescaling | "rank 3's output is what the merge gives with lse = max(lse, ...)" |
| lse replaced by the merged one before out is rescaled | "rank 3's output is what the merge gives when lse ..." |
| the merged lse never kept | "rank 3's output is what the merge gives when lse stays the first block's ..." |
| log-sum-exps merged without the max: overflow on large scores | "with the queries times 40 ... inf or NaN ..." |
| causal mask by each shard's own indices | "rank 3's output is what a causal mask by each block's own indices ..." |
| the contiguous layout's mask or skip on zig-zag shards | "rank 2's output is what the contiguous layout's ..." |
| shards computed whole: work hidden by the mask, unbalanced | "the ranks computed rank 0 16, rank 1 14, ..." |
| the shard's two chunks taken in the other order | "rank 0's output is what a ring gives that takes ..." |
| no causal mask | "rank 0's output is the non-causal attention (every key seen) ..." |
| the forward's scores not scaled by 1/sqrt(head_dim) | "rank 1's output is the causal attention of q @ k^T ..." |
| a later rank's shard: its early chunk alone | "rank 0's output is what the ring gives when the late chunk ..." |
| the shard in hand taken for the one from the other side of the ring | "rank 1's output is what a ring gives ..." |
| gathered the whole sequence with a collective | "the ring called all_gather: a collective that gathers ..." |
| a receive never waited on | "rank 0 never waited on 3 of its 3 receives, the first from rank 3 ..." |
| a send/recv deadlock in the ring | (gloo's "Timed out waiting 3000ms for send") "every rank waited for ..." |
| dk, dv left one or more hops from their owner | "every rank r returned the dk, dv of rank (r + 1) % W's shard ..." |
| D computed per block instead of from the merged output | "rank 3's dq and dk are what D = rowsum(dout * p @ v) ..." |
| lse of the block instead of the merged lse | "rank 3's gradients are what p = exp(s - logsumexp(s)) ..." |
| the causal mask dropped in the backward | "rank 3's gradients are what a backward with no causal mask gives ..." |
| scale missing in dq or dk | "rank 0's dq and dk are sqrt(head_dim) = sqrt(8) = 2.83x autograd's ..." |
| a gradient returned in another one's place | "rank 0's returned dk is autograd's dv of this rank's shard ..." |
| a gradient never accumulated: all zeros | "rank 0's dk is zero in every value, where autograd's is not ..." |
| NaN in the backward | "rank 0's dq, dk, dv hold NaN: where every key of a block is after the query ..." |
| a function that returns nothing | "rank 0's ring_attention returned None and raised nothing, where ..." |
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ...grader.diagnosis import diagnose, translate
from ...grader.launches import each_world_size, launch_timeout, side_by_side
from ...grader.parity import parity
from ...grader.parts import Parted, judge_parts, launch_parts
from ...grader.registry import Exercise
from ...grader.report import ExerciseReport, Verdict, criterion, failed, passed
from .causes import (BACKWARD_RING, GRADIENTS, KNOWN_ERRORS, OUTPUT, PROTOCOL, gathered, large_scores_overflow,
                     never_waited, not_home, unwritten)
from .observations import BackwardRing, ForwardRing, Run
from .probes import P2P_TIMEOUT_S, rank_main
from .reference import ATOL, GRADS, LARGE, RTOL, causal_reference, grad_reference
from .work import backward_work_balanced, work_balanced

__all__ = ["CRITERIA", "EXERCISE", "KNOWN_ERRORS", "grade"]

EXERCISE = Exercise(number=10, name="ring_attention", filename="ex10_ring_attention.py", max_score=10,
                    time_limit=90)
WORLD_SIZES = (2, 4)


def _raised(run: Run) -> str:
    """What the ranks raised that no cause explains, with the learner's line and the known translation."""
    out, crashed = [], [r.rank for r in run.errors() if not translate(r.error, KNOWN_ERRORS)]
    for r in run.errors():
        known = translate(r.error, KNOWN_ERRORS)
        if known and crashed:  # not a deadlock of the ring's: its neighbour had raised and would never answer
            out.append(f" (rank {r.rank} timed out waiting for its neighbour" + (f" at {r.where}" if r.where else "")
                       + f", after rank {crashed[0]} raised)")
            continue
        out.append(f" (rank {r.rank} raised {r.error}" + (f" at {r.where}" if r.where else "")
                   + (f": {known}" if known else "") + ")")
    return "".join(out)


@criterion("[W={world}] each rank's output matches causal attention on the whole sequence", points=6)
def output_matches(run: Run) -> Verdict:
    if todo := unwritten(run, "ring_attention"):
        return failed(todo)
    if race := never_waited(run):  # whatever the output: it is a race's outcome, and a grade is the code's
        return failed(race)
    worst = None
    for obs in run.ranks:
        ref, out = run.reference[obs.rank], obs.out
        if out is None or tuple(out.shape) != tuple(ref.shape):
            got = "nothing" if out is None else f"shape {tuple(out.shape)}"
            return failed(diagnose(OUTPUT, run) or f"rank {obs.rank} returned {got}; expected this rank's "
                          f"{tuple(ref.shape)} rows of the output" + _raised(run))
        p = parity(out, ref, rtol=RTOL, atol=ATOL)
        if not p.ok:
            return failed(diagnose(OUTPUT, run) or f"rank {obs.rank}'s output differs from its rows of the "
                          f"whole sequence's causal attention (max abs difference {p.max_abs_diff:.3g}, rtol={RTOL}, "
                          f"atol={ATOL}): compare each block (which keys each chunk of queries saw, the scale, "
                          "the mask, the merge) with a single-process replay"
                          + _raised(run))
        worst = max(worst or 0.0, p.max_abs_diff)
    if why := large_scores_overflow(run):
        return failed(why)
    large = all(getattr(obs, "out_large", None) is not None for obs in run.ranks) and run.large
    return passed(f"max abs difference {worst:.2g}" + (", and on scores past exp's float32 range" if large else ""),
                  **{f"W{run.world}_max_abs_diff": worst})


def _ring_faults(run: Run, causes) -> str | None:
    """Why the ring did not finish, or the collective it called; ``None`` if neither."""
    if run.errors():
        return diagnose(causes, run) or "the ring did not finish" + _raised(run)
    return gathered(run)


def _forwarded(run: Run, r: int, causes) -> str | None:
    """Unless rank ``r`` received the keys of every other rank (judged only where a received message holds a
    key shard as it is: k, or k stacked with v and more), why not."""
    others, seen = sorted(set(range(run.world)) - {r}), sorted({s for s in run.sources(r) if s is not None})
    if seen and seen != others:
        return diagnose(causes, run) or (f"rank {r} received the keys of ranks {seen}, not of every other rank "
                                         f"{others}: forward the shard you have just received")
    return None


def _neighbours_ok(run: Run, r: int) -> bool:
    sent = {c.peer for c in run.p2p(r, "send")}
    got = {c.peer for c in run.p2p(r, "recv")}
    nxt, prev = (r + 1) % run.world, (r - 1) % run.world
    return (sent, got) in (({nxt}, {prev}), ({prev}, {nxt}))


@criterion("[W={world}] key/value shards passed round the ring, point to point", points=4)
def ring_communication(run: Run) -> Verdict:
    if todo := unwritten(run, "ring_attention"):
        return failed(f"not checked: {todo}")
    if race := never_waited(run):  # what it forwarded is a race's outcome too
        return failed(race)
    if why := _ring_faults(run, PROTOCOL):
        return failed(why)
    want = (run.world - 1) * 2 * run.shard_bytes()
    for r in range(run.world):
        sent, got = run.bytes_moved(r, "send"), run.bytes_moved(r, "recv")
        if not _neighbours_ok(run, r):
            peers = sorted({c.peer for c in run.p2p(r, "send")}), sorted({c.peer for c in run.p2p(r, "recv")})
            return failed(diagnose(PROTOCOL, run) or f"rank {r} sent to ranks {peers[0]} and received from ranks "
                          f"{peers[1]}: in a ring it sends to (rank + 1) % W = {(r + 1) % run.world} and receives "
                          f"from (rank - 1) % W = {(r - 1) % run.world}")
        if sent != want or got != want:
            return failed(f"rank {r} sent {sent:,} B and received {got:,} B; W - 1 = {run.world - 1} key/value "
                          f"shards are {want:,} B: pass the shard in hand on at each of W - 1 steps")
        if why := _forwarded(run, r, PROTOCOL):
            return failed(why)
    shards = f"{run.world - 1} key/value shard{'s' if run.world > 2 else ''}"
    return passed(f"{shards} of {2 * run.shard_bytes():,} B sent per rank, to its neighbour",
                  **{f"W{run.world}_bytes_sent_per_rank": want})


def _grads_match(run: Run, names: tuple[str, ...], what: str) -> Verdict:
    """Every rank's gradients ``names`` against autograd's shards of them, or the named cause."""
    b = run.backward()
    if todo := unwritten(b, "ring_attention_backward"):
        return failed(todo)
    if race := never_waited(b):
        return failed(race)
    worst = 0.0
    for obs in b.ranks:
        ref, got = b.grads[obs.rank], obs.grads
        bad = [g for g in names if got is None or got[g] is None or tuple(got[g].shape) != tuple(ref[g].shape)]
        if bad:
            shapes = "nothing" if got is None else ", ".join(
                f"{g} {'nothing' if got[g] is None else tuple(got[g].shape)}" for g in GRADS)
            return failed(diagnose(GRADIENTS, b) or f"rank {obs.rank}'s backward returned {shapes}; expected "
                          f"(dq, dk, dv), each {tuple(ref['dq'].shape)}" + _raised(b))
        for g in names:
            p = parity(got[g], ref[g], rtol=RTOL, atol=ATOL)
            if not p.ok:
                return failed(diagnose(GRADIENTS if g == "dq" else [*GRADIENTS, not_home], b)
                              or f"rank {obs.rank}'s {g} differs from autograd's {what} (max abs difference "
                              f"{p.max_abs_diff:.3g}, rtol={RTOL}, atol={ATOL}): replay your backward on one process "
                              "against torch.autograd through F.scaled_dot_product_attention" + _raised(b))
            worst = max(worst, p.max_abs_diff)
    return passed(f"max abs difference {worst:.2g}", **{f"W{run.world}_{'_'.join(names)}_max_abs_diff": worst})


@criterion("[W={world}] backward: each rank's dq matches autograd on the whole sequence", points=4)
def dq_matches(run: Run) -> Verdict:
    return _grads_match(run, ("dq",), "for this rank's queries")


@criterion("[W={world}] backward: each rank ends with its own shards' dk, dv, as autograd's", points=4)
def dk_dv_match(run: Run) -> Verdict:
    return _grads_match(run, ("dk", "dv"), "for this rank's own keys and values (summed over every later query)")


def _backward_bytes(shards: float, world: int) -> str:
    """What ``shards`` shards' worth of bytes sent per rank says about the backward's ring."""
    known = {4 * world - 4: "k, v, dk, dv travelled W - 1 hops but dk, dv never took the last hop home",
             4 * world: "k, v took the last hop home too, which only dk, dv need",
             2 * world - 2: "only k, v travelled: dk, dv are summed on the way round, so they travel with them"}
    return known.get(int(shards), "each hop carries k, v and their dk, dv, and the last one dk, dv alone") \
        if shards == int(shards) else "each message should hold whole shards of k, v, dk or dv"


@criterion("[W={world}] backward: k, v and their dk, dv passed round the ring, and home", points=2)
def backward_ring(run: Run) -> Verdict:
    b = run.backward()
    if todo := unwritten(b, "ring_attention_backward"):
        return failed(f"not checked: {todo}")
    if race := never_waited(b):
        return failed(race)
    if why := _ring_faults(b, BACKWARD_RING):
        return failed(why)
    shard, want = b.shard_bytes(), (4 * run.world - 2) * b.shard_bytes()
    for r in range(run.world):
        sent, got = b.bytes_moved(r, "send"), b.bytes_moved(r, "recv")
        if not _neighbours_ok(b, r):
            return failed(diagnose(BACKWARD_RING, b) or f"rank {r}'s backward sent to ranks "
                          f"{sorted({c.peer for c in b.p2p(r, 'send')})} and received from ranks "
                          f"{sorted({c.peer for c in b.p2p(r, 'recv')})}: the backward's ring is the forward's, "
                          "one neighbour to send to and the other to receive from")
        if sent != want or got != want:
            return failed(diagnose([not_home], b) or f"rank {r}'s backward sent {sent:,} B ({sent / shard:g} "
                          f"shards) and received {got:,} B; the ring moves 4 W - 2 = {4 * run.world - 2} shards of "
                          f"{shard:,} B: {_backward_bytes(sent / shard, run.world)}")
        if why := _forwarded(b, r, BACKWARD_RING):
            return failed(why)
    return passed(f"{4 * run.world - 2} shards of {shard:,} B sent per rank, to its neighbour",
                  **{f"W{run.world}_backward_bytes_sent_per_rank": want})


FORWARD_CRITERIA = [output_matches, ring_communication, work_balanced]
BACKWARD_CRITERIA = [dq_matches, dk_dv_match, backward_ring, backward_work_balanced]
CRITERIA = [*FORWARD_CRITERIA, *BACKWARD_CRITERIA]
RINGS = {"forward": ("ring_attention", FORWARD_CRITERIA), "backward": ("ring_attention_backward", BACKWARD_CRITERIA)}


def _run(file: Parted, world: int) -> Run:
    """The file's run at ``world`` ranks: each rank's forward ring with its backward's inside, as the criteria
    read them (a ring that ended its launch stands as an empty one; its criteria are not judged)."""
    forward, backward = (file.part(name) or [Ring(rank=r, world=world).to_wire() for r in range(world)]
                         for name, Ring in (("forward", ForwardRing), ("backward", BackwardRing)))
    ranks = [{**f, "backward": b} for f, b in zip(forward, backward)]
    return Run.from_wire(ranks, causal_reference(world), grad_reference(world), causal_reference(world, LARGE))


def grade(paths: Sequence[Path], world_sizes: tuple[int, ...] = WORLD_SIZES,
          p2p_timeout_s: float = P2P_TIMEOUT_S) -> list[ExerciseReport]:
    """Grade the files at ``paths``, one launch per world size (one more for each ring that ends one:
    ``grader.parts``; tests pass fewer ``world_sizes`` and a shorter ``p2p_timeout_s``); one report each. Each
    world size's criteria get an equal share."""
    reports = [EXERCISE.new_report() for _ in paths]
    # side by side on the CPU (grader.launches.side_by_side), where a hang's wait is paid once
    timeout = launch_timeout(EXERCISE, files=len(paths), launches=1 if side_by_side() else len(world_sizes))

    def launch(world: int):
        return launch_parts(rank_main, paths, world=world, timeout=timeout, parts=list(RINGS), args=(p2p_timeout_s,),
                            known=KNOWN_ERRORS)

    for world, (parted, wall_s) in each_world_size(launch, list(world_sizes)):
        for report, file in zip(reports, parted):
            judge_parts(report, RINGS, file.ended, _run(file, world), world=world)
            if wall_s is not None:
                report.measurements[f"W{world}_launch_s"] = round(wall_s, 2)
    return [r.scale_to() for r in reports]
