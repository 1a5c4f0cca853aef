"""Rank-side instruments of the exercise 10 check: run the learner's ``ring_attention`` on this rank's
shard of the grader's ``q, k, v``, then its ``ring_attention_backward`` on the same shards with the exact
``out``, ``lse`` and ``dout`` (so a wrong forward costs the backward nothing), and record every send and
receive of each (also those posted through ``dist.batch_isend_irecv``), every collective, and the FLOPs of
its matrix products (``FlopCounterMode``: the attention work this rank did).

Each file runs in a process group of its own (``rank.own_rendezvous``): a ring whose sends and
receives do not match (every rank in a blocking ``send``, a receive from the wrong neighbour) times out
after ``p2p_timeout_s`` (gloo), the error is caught here and returned with the rest, and the next ring
starts clean. The backward runs in the forward's group where the forward left it clean on every rank,
and in a fresh one otherwise, so that no stale message of the forward meets the backward's receives.
"""
from __future__ import annotations

import json
import os
from collections import Counter
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

import distlab
from distlab.measure.comm import CollectiveRecorder
from distlab.measure.flops import flop_counter
from distlab.runtime.process import time_scale

from ...rank import CapturedPrints, P2PSpy, attempt, echo, learner_frame, load_learner, own_rendezvous, raised
from ...rank.parts import Parts
from .observations import BackwardRing, ForwardRing, P2PCall
from .reference import GRADS, LARGE, backward_inputs, shard, whole

P2P_TIMEOUT_S = 3.0  # x DISTLAB_TIME_SCALE: a healthy ring waits milliseconds for its neighbour


def rank_main(paths: list[str], p2p_timeout_s: float, outdir: str, skip: dict[str, list[str]]) -> list[dict]:
    """Runs on every rank: each learner file's two rings in turn, each file in its own process group, each ring
    kept as it returns (``rank.parts``: a ring whose message aborts gloo costs its own marks only; ``skip``: the
    rings of each file an earlier launch kept or ended). A file whose two functions both raise
    ``NotImplementedError`` raises it (nothing was graded). Returns per file ``{"forward": ForwardRing,
    "backward": BackwardRing}`` as plain data, those that ran."""
    observed = []
    for i, path in enumerate(paths):
        kept, forward, backward = Parts(outdir, i, skip), None, None
        with P2PSpy() as p2p:  # before the import: the functions it binds are spied on too
            learner = load_learner(path)
            with own_rendezvous(f"file{i}"):
                if kept.starts("forward"):
                    forward = _ring(p2p, *_observe(learner, path, p2p, p2p_timeout_s, backward=False))
                same_group = forward is None or _matched_everywhere(forward, forward.p2p)
                if forward is not None:
                    if same_group:
                        _large(learner, p2p, forward)
                    kept.keep("forward", forward.to_wire())
                if same_group and kept.starts("backward"):
                    backward, b_calls = _observe(learner, path, p2p, p2p_timeout_s, backward=True)
            if not same_group and kept.starts("backward"):
                with own_rendezvous(f"file{i}/backward"):
                    backward, b_calls = _observe(learner, path, p2p, p2p_timeout_s, backward=True)
        if backward is not None:
            kept.keep("backward", _ring(p2p, backward, b_calls).to_wire())
        if forward is not None and backward is not None and forward.not_implemented and backward.not_implemented:
            raise NotImplementedError(forward.not_implemented)
        kept.finished()
        observed.append(kept.ran)
    return observed


def _ring(p2p: P2PSpy, ring: ForwardRing | BackwardRing, calls: list[dict]) -> ForwardRing | BackwardRing:
    """``ring`` with its sends and receives, each receive's value settled (what its buffer holds now)."""
    p2p.settle()
    ring.p2p = [P2PCall.from_spy(c) for c in calls]
    return ring


def _matched_everywhere(forward: ForwardRing, calls: list[P2PCall]) -> bool:
    """Whether, on every rank, the forward raised nothing and each of its sends had its receive on the peer:
    the group can then carry the backward (a second group's set-up and teardown cost about half a second a
    file). Agreed through the file's store, which outlives a timed-out gloo pair, so every rank decides alike."""
    world = int(os.environ["WORLD_SIZE"])
    mine = {"ok": not forward.error and dist.is_initialized(), "sent": Counter(), "recv": Counter()}
    for c in calls:
        mine["sent" if c.op == "send" else "recv"][str(c.peer)] += 1
    every = _every_rank("forward", mine)
    return all(e["ok"] for e in every) and all(
        every[a]["sent"].get(str(b), 0) == every[b]["recv"].get(str(a), 0) for a in range(world) for b in range(world))


def _every_rank(key: str, mine) -> list:
    """Every rank's ``mine`` (plain data), in rank order, exchanged through the file's store, which outlives a
    timed-out gloo pair: what each rank decides from it, every rank decides alike."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False,
                          timeout=timedelta(seconds=60))
    store.set(f"distlab/ex10/{key}/{rank}", json.dumps(mine))
    return [json.loads(store.get(f"distlab/ex10/{key}/{r}")) for r in range(world)]


def _large(learner, p2p: P2PSpy, forward: ForwardRing) -> None:
    """The forward ring again, on queries times ``LARGE`` (scores past float32's exp range): its output only, its
    sends and receives not graded (the first ring's are). Run only where, on every rank, the forward raised
    nothing and returned a tensor (agreed through the file's store, as the backward is)."""
    rank, world, dev = forward.rank, forward.world, distlab.device()
    ok = forward.out is not None and not (forward.error or forward.not_implemented)
    if not all(_every_rank("large", ok)):
        return
    q, k, v = whole()
    dist.barrier()
    with CapturedPrints():
        result, exc = attempt(learner.ring_attention, *[shard(t, rank, world).to(dev) for t in (q * LARGE, k, v)])
    attempt(p2p.drain, wait=exc is None)
    forward.out_large = _cpu(result) if exc is None else None


def _observe(learner, path: str, p2p: P2PSpy, p2p_timeout_s: float,
             backward: bool) -> tuple[ForwardRing | BackwardRing, list[dict]]:
    """One ring of one function on this rank, and the spy's records of its sends and receives (the list
    the spy fills: a receive's value is known once the spy is left)."""
    short = timedelta(seconds=p2p_timeout_s * time_scale()) if distlab.backend() == "gloo" else None
    dev = distlab.init_distributed(timeout=short)
    rank, world = dist.get_rank(), dist.get_world_size()
    if backward:
        given = {name: t.to(dev) for name, t in backward_inputs(rank, world).items()}
        fn, args = getattr(learner, "ring_attention_backward", None), [given[n].clone() for n in
                                                                       ("q", "k", "v", "out", "lse", "dout")]
    else:
        fn, args = getattr(learner, "ring_attention", None), [shard(t, rank, world).to(dev) for t in whole()]
    obs = (BackwardRing if backward else ForwardRing)(rank=rank, world=world)
    if fn is None:  # an older copy of the exercise: graded as the stub would be
        obs.not_implemented = f"{Path(path).name} has no function of that name"
        return obs, []
    dist.barrier()
    first = len(p2p.calls)
    with CapturedPrints() as printed, CollectiveRecorder() as comm, flop_counter() as work:
        result, exc = attempt(fn, *args)
    # What a function that returned never waited on is waited on here (the group is clean for the next ring);
    # after an error, what it could not wait on is the error's doing, not a race of its own.
    unwaited, stuck = attempt(p2p.drain, wait=exc is None)
    if exc is not None:
        for call in unwaited:
            del call["waited"]
    exc = exc or stuck
    calls = p2p.calls[first:]
    echo(printed.lines)
    if isinstance(exc, NotImplementedError):
        obs.not_implemented = str(learner_frame(exc, path) or "NotImplementedError")
    elif exc is not None:  # reported, so the other criteria are still judged
        obs.error, obs.where = raised(exc), str(learner_frame(exc, path) or "")
    if backward:
        obs.grads = _grads(result)
    else:
        obs.out = _cpu(result)
    obs.returned_none = exc is None and result is None
    obs.collectives = sorted({op.kind for op in comm.ops} - {"send", "recv"})
    obs.flops = work.get_total_flops()
    return obs, calls


def _cpu(t) -> torch.Tensor | None:
    return t.detach().cpu().clone() if isinstance(t, torch.Tensor) else None


def _grads(result) -> dict[str, torch.Tensor | None] | None:
    """``{"dq": ..., "dk": ..., "dv": ...}`` from what the backward returned; ``None`` if not three tensors."""
    if not isinstance(result, (tuple, list)) or len(result) != len(GRADS):
        return None
    return dict(zip(GRADS, map(_cpu, result)))
