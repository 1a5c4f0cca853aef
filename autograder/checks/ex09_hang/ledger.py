"""The rank-side instrument of both parts of exercise 9: every collective a rank makes, checked against its
peers' *before* it runs.

A job that skips a collective on one rank hangs (or, on gloo, pairs collectives of different
steps and computes garbage). So that one launch can grade a fixed job, a hanging one and the
ones in between, the :class:`Ledger` (the one recorder of collectives,
``distlab.measure.comm.CollectiveRecorder``, whose ``tag`` sees each op before it runs) writes
every op's fingerprint (its step, kind, shapes, dtypes and the learner's line) to the job's store and
waits until every peer has written its op of the same number, or has returned from the learner's function
with fewer. Where they differ it raises on every rank at once, before any rank enters the real
collective, and names where each rank is: what ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` compares
(its fingerprints, without the step) and what a stack dump of every rank shows (the lines),
with the process group left in step for the next file.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch
import torch.distributed as dist

from distlab.measure.comm import CollectiveRecorder
from distlab.runtime.distributed import default_timeout

from ...rank.spies import learner_line
from .observations import Collective
from .partings import Fingerprint, Parting


class Mismatch(RuntimeError):
    """Raised on every rank when their collectives differ: where a real job would hang (``parting`` says
    where; the message is it as JSON)."""

    def __init__(self, parting: Parting):
        super().__init__(json.dumps(parting.to_wire()))
        self.parting = parting


class Runaway(RuntimeError):
    """Raised on every rank at once (at the same op: the ranks' ops matched until then) when a rank has made more
    collectives than the job can need: a loop that never ends would otherwise run until the launch's timeout."""


class Ledger(CollectiveRecorder):
    """Records every op with its step, its learner line and the sum of |input| (before it runs), and
    holds it until every peer has made its op of the same number, or has returned with fewer.

    ``batches`` says the step the learner's loop is at (``.step``). ``compare_steps=False`` compares what DETAIL
    does, the kind and the shapes only (part 2: a rank out of data shadows the others' steps at none of its own);
    past ``limit`` ops (``None``: no limit) every rank raises :class:`Runaway`. ``parting`` keeps the
    :class:`~.partings.Parting` raised, which an error raised inside DDP's reducer may not carry out as a
    :class:`Mismatch`."""

    def __init__(self, tag: str, batches, path: str, *, compare_steps: bool = True, limit: int | None = None):
        super().__init__()
        self.key, self.batches, self.path = tag, batches, Path(path).resolve()
        self.compare_steps, self.limit = compare_steps, limit
        self.store = dist.distributed_c10d._get_default_store()
        self.rank, self.nprocs = dist.get_rank(), dist.get_world_size()
        self.made = 0
        self.parting: Parting | None = None

    def _at(self) -> str | None:
        """The learner's innermost line on the stack, ``"ex09_hang.py:78 (code)"``."""
        found = learner_line(self.path)
        return f"{Path(found[0]).name}:{found[1]} ({found[2]})" if found else None

    def tag(self, kind: str, tensors: list[torch.Tensor]) -> dict:
        """The grader's tags of the op (the :class:`Collective` fields beyond its kind and shape)."""
        self.made += 1
        if self.limit is not None and self.made > self.limit:
            raise Runaway(f"{self.made - 1} collectives made, more than the job can need ({self.limit}): "
                          "the loop did not end")
        mine = Fingerprint(n=self.made, step=self.batches.step, kind=kind, shapes=[list(t.shape) for t in tensors],
                           at=self._at(), dtypes=[str(t.dtype).removeprefix("torch.") for t in tensors])
        self.store.set(f"{self.key}/op/{self.rank}/{self.made}", json.dumps(mine.to_wire()))
        for peer in range(self.nprocs):
            if peer != self.rank:
                self._agree(mine, peer)
        return {"step": mine.step, "at": mine.at, "n": self.made,
                "input_abs": float(sum(t.detach().abs().sum() for t in tensors if t.is_floating_point()))}

    def _agree(self, mine: Fingerprint, peer: int) -> None:
        deadline = time.monotonic() + default_timeout().total_seconds()
        op_key, done_key = f"{self.key}/op/{peer}/{mine.n}", f"{self.key}/done/{peer}"
        while not self.store.check([op_key]):
            # A peer writes its op before it can be done: once done, look for the op again, since the peer may
            # have written it (and then raised, and been done) between this loop's two checks.
            if self.store.check([done_key]) and not self.store.check([op_key]):
                made = int(self.store.get(done_key))
                self._part(Parting(rank=self.rank, mine=mine, peer=peer, peer_done=made))
            if time.monotonic() > deadline:
                self._part(Parting(rank=self.rank, mine=mine, peer=peer, peer_done=None))
            time.sleep(0.0005)
        theirs = Fingerprint.from_wire(json.loads(self.store.get(op_key)))
        differ = (theirs.kind, theirs.shapes, theirs.dtypes) != (mine.kind, mine.shapes, mine.dtypes)
        if differ or (self.compare_steps and theirs.step != mine.step):
            self._part(Parting(rank=self.rank, mine=mine, peer=peer, theirs=theirs))

    def _part(self, parting: Parting) -> None:
        self.parting = parting
        raise Mismatch(parting)

    def done(self) -> None:
        self.store.set(f"{self.key}/done/{self.rank}", str(self.made))

    @property
    def calls(self) -> list[Collective]:
        return [Collective(kind=op.kind, shape=list(op.shape), **op.tags) for op in self.ops]
