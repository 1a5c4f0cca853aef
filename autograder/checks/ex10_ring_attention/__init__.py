"""Exercise 10 check: causal ring attention by hand, graded at 2 and 4 ranks.

The grader makes the whole sequence's ``q, k, v`` (seeded), gives each rank its contiguous shard and
runs the learner's ``ring_attention`` on it, with every send and receive recorded (the harness's ``P2PSpy``:
``dist.send/recv/isend/irecv`` and the ops of ``dist.batch_isend_irecv``, with their peers and what
each receive got) and every collective (``CollectiveRecorder``). Each file runs in a process group of
its own, so a ring that deadlocks times out (gloo) and costs only that file's marks. The grading
process checks, against the single-process reference (Liu et al. 2023, "Ring Attention with Blockwise
Transformers"; the reference is ``F.scaled_dot_product_attention(is_causal=True)`` on the whole sequence):

* parity: each rank's output is its rows of the whole sequence's causal attention;
* the ring: each rank sent to one neighbour and received from the other, ``W - 1`` key/value shards
  of the recorded bytes, the shards it received came from every other rank (it forwards what it
  receives), and no collective ran.

| mistake | message |
|---|---|
| every rank sends before it receives: a deadlock | "all 4 ranks were waiting in a blocking dist.send at once ..." |
| sends to and receives from the same neighbour | "rank 0 sent to rank 1 and also waited for a shard from rank 1 ..." |
| forwards its own shard instead of the one it received | "rank 2 received rank 1's keys at each of its 3 ..." |
| a fully masked shard merged: NaN | "rank 0's output is NaN in 16 of its 16 (head, position) rows: ..." |
| partial outputs averaged instead of weighed by their log-sum-exp | "rank 3's output is (out + block_out) / 2 ..." |
| max of the log-sum-exps without rescaling | "rank 3's output is what the merge gives with lse = max(lse, ...)" |
| causal mask by each shard's own indices | "rank 3's output is what a causal mask by each block's own indices ..." |
| no causal mask | "rank 0's output is the non-causal attention (every key seen) ..." |
| gathered the whole sequence with a collective | "the ring called all_gather: a collective that gathers ..." |
| a send/recv deadlock in the ring | (gloo's "Timed out waiting 3000ms for send") "every rank waited for ..." |
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ...diagnosis import diagnose, translate
from ...grading import launch_files, launch_timeout
from ...parity import parity
from ...registry import Exercise
from ...report import ExerciseReport, Verdict, criterion, failed, passed
from .causes import KNOWN_ERRORS, OUTPUT, PROTOCOL, gathered
from .observed import Run
from .probes import P2P_TIMEOUT_S, rank_main
from .reference import causal_reference

__all__ = ["CRITERIA", "EXERCISE", "KNOWN_ERRORS", "grade"]

EXERCISE = Exercise(number=10, name="ring_attention", filename="ex10_ring_attention.py", max_score=10,
                    time_limit=90)
WORLD_SIZES = (2, 4)
RTOL, ATOL = 1e-4, 1e-5


def _raised(run: Run) -> str:
    """What the ranks raised that no cause explains, with the learner's line and the known translation."""
    out = []
    for r in run.errors():
        known = translate(r["error"], KNOWN_ERRORS)
        out.append(f" (rank {r['rank']} raised {r['error']}" + (f" at {r['where']}" if r["where"] else "")
                   + (f": {known}" if known else "") + ")")
    return "".join(out)


@criterion("[W={world}] each rank's output matches causal attention on the whole sequence", points=6)
def output_matches(run: Run) -> Verdict:
    worst = None
    for obs in run.ranks:
        ref, out = run.reference[obs["rank"]], obs["out"]
        if out is None or tuple(out.shape) != tuple(ref.shape):
            got = "nothing" if out is None else f"shape {tuple(out.shape)}"
            return failed(diagnose(OUTPUT, run) or f"rank {obs['rank']} returned {got}; expected this rank's "
                          f"{tuple(ref.shape)} rows of the output" + _raised(run))
        p = parity(out, ref, rtol=RTOL, atol=ATOL)
        if not p.ok:
            return failed(diagnose(OUTPUT, run) or f"rank {obs['rank']}'s output differs from its rows of the "
                          f"whole sequence's causal attention (max abs difference {p.max_abs_diff:.3g}, rtol={RTOL}, "
                          f"atol={ATOL}): check the merge and the mask against a single-process replay"
                          + _raised(run))
        worst = max(worst or 0.0, p.max_abs_diff)
    return passed(f"max abs difference {worst:.2g}", **{f"W{run.world}_max_abs_diff": worst})


def _neighbours_ok(run: Run, r: int) -> bool:
    sent = {c["peer"] for c in run.p2p(r, "send")}
    got = {c["peer"] for c in run.p2p(r, "recv")}
    nxt, prev = (r + 1) % run.world, (r - 1) % run.world
    return (sent, got) in (({nxt}, {prev}), ({prev}, {nxt}))


@criterion("[W={world}] key/value shards passed round the ring, point to point", points=4)
def ring_communication(run: Run) -> Verdict:
    if run.errors():
        return failed(diagnose(PROTOCOL, run) or "the ring did not finish" + _raised(run))
    if why := gathered(run):
        return failed(why)
    want = (run.world - 1) * 2 * run.shard_bytes()
    for r in range(run.world):
        sent, got = run.bytes_moved(r, "send"), run.bytes_moved(r, "recv")
        if not _neighbours_ok(run, r):
            peers = sorted({c["peer"] for c in run.p2p(r, "send")}), sorted({c["peer"] for c in run.p2p(r, "recv")})
            return failed(diagnose(PROTOCOL, run) or f"rank {r} sent to ranks {peers[0]} and received from ranks "
                          f"{peers[1]}: in a ring it sends to (rank + 1) % W = {(r + 1) % run.world} and receives "
                          f"from (rank - 1) % W = {(r - 1) % run.world}")
        if sent != want or got != want:
            return failed(f"rank {r} sent {sent:,} B and received {got:,} B; W - 1 = {run.world - 1} key/value "
                          f"shards are {want:,} B: pass the shard in hand on at each of W - 1 steps")
        # judged only where a received message holds a key shard as it is (k, or k stacked with v)
        others, seen = sorted(set(range(run.world)) - {r}), sorted({s for s in run.sources(r) if s is not None})
        if seen and seen != others:
            return failed(diagnose(PROTOCOL, run) or f"rank {r} received the keys of ranks {seen}, not of every "
                          f"other rank {others}: forward the shard you have just received")
    shards = f"{run.world - 1} key/value shard{'s' if run.world > 2 else ''}"
    return passed(f"{shards} of {2 * run.shard_bytes():,} B sent per rank, to its neighbour",
                  **{f"W{run.world}_bytes_sent_per_rank": want})


CRITERIA = [output_matches, ring_communication]


def grade(paths: Sequence[Path], world_sizes: tuple[int, ...] = WORLD_SIZES,
          p2p_timeout_s: float = P2P_TIMEOUT_S) -> list[ExerciseReport]:
    """Grade the files at ``paths``, one launch per world size (tests pass fewer ``world_sizes`` and a
    shorter ``p2p_timeout_s``); one report each. Each world size's criteria get an equal share."""
    reports = [EXERCISE.new_report() for _ in paths]
    timeout = launch_timeout(EXERCISE, files=len(paths), launches=len(world_sizes))
    for world in world_sizes:
        runs, wall_s = launch_files(rank_main, paths, world=world, timeout=timeout, args=(p2p_timeout_s,))
        for report, ranks in zip(reports, runs):
            report.judge(CRITERIA, Run(ranks, causal_reference(world)), world=world)
            report.measurements[f"W{world}_launch_s"] = round(wall_s, 2)
    return [r.scale_to() for r in reports]
