"""Rank-side instruments of the exercise 10 check: run the learner's ``ring_attention`` on this rank's
shard of the grader's ``q, k, v``, and record every send and receive it makes (also those posted through
``dist.batch_isend_irecv``) and every collective.

Each file runs in a process group of its own (``harness.own_rendezvous``): a ring whose sends and
receives do not match (every rank in a blocking ``send``, a receive from the wrong neighbour) times out
after ``p2p_timeout_s`` (gloo), the error is caught here and returned with the rest, and the next file
starts clean.
"""
from __future__ import annotations

import functools
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import distlab
from distlab.measure.comm import CollectiveRecorder
from distlab.runtime.process import time_scale

from ...harness import CapturedPrints, P2PSpy, echo, learner_frame, load_learner, own_rendezvous, raised
from .reference import shard, whole

P2P_TIMEOUT_S = 3.0  # x DISTLAB_TIME_SCALE: a healthy ring waits milliseconds for its neighbour


class RingSpy(P2PSpy):
    """:class:`~autograder.harness.P2PSpy`, and the sends and receives a ``dist.batch_isend_irecv`` posts.
    ``dist.P2POp`` checks that its ``op`` *is* ``isend`` or ``irecv``, and under the spy ``dist.isend`` is
    the spy's stand-in: so ``P2POp`` is replaced too, by a subclass that stores the real function, and the
    batch's stand-in records each op (its peer, shape, and what a receive got) before the real batch runs."""

    def __init__(self):
        super().__init__()
        self.targets[(dist, "P2POp")] = self._p2p_op
        self.targets[(dist, "batch_isend_irecv")] = self._batch

    def _unspied(self, fn):
        """The real ``isend``/``irecv`` behind ``fn`` when ``fn`` is the spy's stand-in for it."""
        for name in ("isend", "irecv"):
            real = self.real.get((dist, name))
            if real is not None and fn is self._stand_ins.get(id(real)):
                return real
        return fn

    def _p2p_op(self, real_cls):
        spy = self

        class P2POp(real_cls):
            def __new__(cls, op, *args, **kwargs):
                return real_cls.__new__(cls, spy._unspied(op), *args, **kwargs)

            def __init__(self, op, *args, **kwargs):
                super().__init__(spy._unspied(op), *args, **kwargs)

        return P2POp

    def _batch(self, real):
        def spy(ops):
            now, isend = time.perf_counter(), self.real[(dist, "isend")]
            calls = []
            for op in ops:
                send = self._unspied(op.op) is isend
                calls.append({"op": "send" if send else "recv", "async": True, "peer": op.peer,
                              "shape": list(op.tensor.shape), "t0": now, "t1": None, "value": None})
                if not send:
                    self._async_recv.append((calls[-1], op.tensor))
            self.calls.extend(calls)
            works = real(ops)
            for call in calls:
                call["t1"] = time.perf_counter()
            return works

        return functools.wraps(real)(spy)


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
    with RingSpy() as p2p:  # before the import: the functions it binds are spied on too
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
