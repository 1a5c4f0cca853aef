"""Rank-side instruments of the exercise 10 check: run the learner's ``ring_attention`` on this rank's
shard of the grader's ``q, k, v``, and record every send and receive it makes (also those posted through
``dist.batch_isend_irecv``) and every collective.

Each file runs in a process group of its own (``harness.own_rendezvous``): a ring whose sends and
receives do not match (every rank in a blocking ``send``, a receive from the wrong neighbour) times out
after ``p2p_timeout_s`` (gloo), the error is caught here and returned with the rest, and the next file
starts clean.
"""
from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

import distlab
from distlab.measure.comm import CollectiveRecorder
from distlab.runtime.process import time_scale

from ...harness import CapturedPrints, P2PSpy, echo, learner_frame, load_learner, own_rendezvous, raised
from .reference import shard, whole

P2P_TIMEOUT_S = 3.0  # x DISTLAB_TIME_SCALE: a healthy ring waits milliseconds for its neighbour


def rank_main(paths: list[str], p2p_timeout_s: float = P2P_TIMEOUT_S) -> list[dict]:
    """Runs on every rank: each learner file's ring in turn, each in its own process group."""
    observed = []
    for i, path in enumerate(paths):
        with own_rendezvous(f"file{i}"):
            observed.append(_observe(path, p2p_timeout_s))
    return observed


def _observe(path: str, p2p_timeout_s: float) -> dict:
    short = timedelta(seconds=p2p_timeout_s * time_scale()) if distlab.backend() == "gloo" else None
    dev = distlab.init_distributed(timeout=short)
    rank, world = dist.get_rank(), dist.get_world_size()
    q, k, v = (shard(t, rank, world).to(dev) for t in whole())
    out = error = where = None
    with P2PSpy() as p2p:  # before the import: the functions it binds are spied on too
        learner = load_learner(path)
        dist.barrier()
        with CapturedPrints() as printed, CollectiveRecorder() as comm:
            try:
                out = learner.ring_attention(q.clone(), k.clone(), v.clone())
            except NotImplementedError:
                raise
            except Exception as exc:  # noqa: BLE001 - reported, so the other criteria are still judged
                error, where = raised(exc), str(learner_frame(exc, path) or "")
    echo(printed.lines)
    return {"rank": rank, "world": world, "error": error, "where": where, "p2p": p2p.calls,
            "collectives": sorted({op.kind for op in comm.ops} - {"send", "recv"}),
            "out": out.detach().cpu().clone() if isinstance(out, torch.Tensor) else None}
