"""Rank-side instruments of the exercise 9 check: run the learner's ``train`` on each rank's batches and
record every collective each rank makes, checked against its peers' *before* it runs.

A job that skips a collective on one rank hangs (or, on gloo, pairs collectives of different
steps and computes garbage). So that one launch can grade a fixed job, a hanging one and the
ones in between, the :class:`Ledger` (the one recorder of collectives,
``distlab.measure.comm.CollectiveRecorder``, whose ``tag`` sees each op before it runs) writes
every op's fingerprint (its step, kind, shapes and the learner's line) to the job's store and
waits until every peer has written its op of the same number, or has returned from ``train``
with fewer. Where they differ it raises on every rank at once, before any rank enters the real
collective, and names where each rank is: what ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` compares
(its fingerprints, without the step) and what a stack dump of every rank shows (the lines),
with the process group left in step for the next file.
"""
from __future__ import annotations

import json
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

from distlab.measure.comm import CollectiveRecorder
from distlab.models import cpu_state
from distlab.runtime.distributed import default_timeout, init_distributed

from ...rank import CapturedPrints, attempt, echo, learner_frame, load_learner, raised
from .observations import LR, STEPS, Backward, Collective, Fingerprint, Parting, RankObservation, batch, model

RTOL, ATOL = 1e-5, 1e-6        # all-reduced sums in another order than one process's


class Batches:
    """This rank's batches, recording which step the learner's loop is at (the last batch it took)."""

    def __init__(self, rank: int):
        self.rank, self.step = rank, None

    def __len__(self) -> int:
        return STEPS

    def __iter__(self):
        for step in range(STEPS):
            self.step = step
            yield batch(self.rank, step)


class Mismatch(RuntimeError):
    """Raised on every rank when their collectives differ: where a real job would hang (``parting`` says
    where; the message is it as JSON)."""

    def __init__(self, parting: Parting):
        super().__init__(json.dumps(parting.to_wire()))
        self.parting = parting


class Ledger(CollectiveRecorder):
    """Records every op with its step, its learner line and the sum of |input| (before it runs), and
    holds it until every peer has made its op of the same number, or has returned with fewer."""

    def __init__(self, tag: str, batches: Batches, path: str):
        super().__init__()
        self.key, self.batches, self.path = tag, batches, str(Path(path).resolve())
        self.store = dist.distributed_c10d._get_default_store()
        self.rank, self.nprocs = dist.get_rank(), dist.get_world_size()
        self.made = 0

    def _at(self) -> str | None:
        mine = [f for f in traceback.extract_stack() if str(Path(f.filename).resolve()) == self.path]
        return f"{Path(mine[-1].filename).name}:{mine[-1].lineno} ({(mine[-1].line or '').strip()})" if mine else None

    def tag(self, kind: str, tensors: list[torch.Tensor]) -> dict:
        """The grader's tags of the op (the :class:`Collective` fields beyond its kind and shape)."""
        self.made += 1
        mine = Fingerprint(n=self.made, step=self.batches.step, kind=kind, shapes=[list(t.shape) for t in tensors],
                           at=self._at())
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
            if self.store.check([done_key]):
                made = int(self.store.get(done_key))
                raise Mismatch(Parting(rank=self.rank, mine=mine, peer=peer, peer_done=made))
            if time.monotonic() > deadline:
                raise Mismatch(Parting(rank=self.rank, mine=mine, peer=peer, peer_done=None))
            time.sleep(0.002)
        theirs = Fingerprint.from_wire(json.loads(self.store.get(op_key)))
        if (theirs.step, theirs.kind, theirs.shapes) != (mine.step, mine.kind, mine.shapes):
            raise Mismatch(Parting(rank=self.rank, mine=mine, peer=peer, theirs=theirs))

    def done(self) -> None:
        self.store.set(f"{self.key}/done/{self.rank}", str(self.made))

    @property
    def calls(self) -> list[Collective]:
        return [Collective(kind=op.kind, shape=list(op.shape), **op.tags) for op in self.ops]


class Backwards:
    """Every gradient a backward accumulated into the model's parameters: the step the loop was at, how many
    collectives the rank had made by then, and the sum of |grad| (``register_post_accumulate_grad_hook``)."""

    def __init__(self, net: torch.nn.Module, batches: Batches, ledger: Ledger):
        self.seen: list[Backward] = []
        self.handles = [p.register_post_accumulate_grad_hook(
            lambda p: self.seen.append(Backward(step=batches.step, after=ledger.made,
                                                grad_abs=float(p.grad.detach().abs().sum()))))
            for p in net.parameters()]

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def rank_main(paths: list[str]) -> list[dict]:
    """Runs on every rank: each file's ``train`` in turn, under its own :class:`Ledger`."""
    init_distributed()
    return [_observe(path, f"ex09/file{i}").to_wire() for i, path in enumerate(paths)]


def _observe(path: str, tag: str) -> RankObservation:
    rank = dist.get_rank()
    net, batches = model(), Batches(rank)
    learner, error = attempt(load_learner, path)
    ledger = Ledger(tag, batches, path)
    backwards = Backwards(net, batches, ledger)
    with CapturedPrints() as out:
        if error is None:
            with ledger:
                trained, error = attempt(learner.train, net, batches, lr=LR)
    ledger.done()
    backwards.remove()
    echo(out.lines)
    mismatch = error.parting if isinstance(error, Mismatch) else None
    return RankObservation(
        rank=rank, final=cpu_state(net), calls=ledger.calls, counts=ledger.counts(), mismatch=mismatch,
        error=None if mismatch else raised(error, path),
        where=str(learner_frame(error, path) or "") if error is not None and not mismatch else "",
        backwards=backwards.seen,
        traceback=None if error is None or mismatch else "".join(traceback.format_exception(error))[-2000:])
