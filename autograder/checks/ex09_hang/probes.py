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
from torch import nn

from distlab.measure.comm import CollectiveRecorder
from distlab.models import cpu_state
from distlab.runtime.distributed import default_timeout, init_distributed

from ...harness import CapturedPrints, attempt, echo, load_learner, raised

D, H, C, B = 8, 16, 4, 6   # features, hidden, classes, local batch
STEPS, LR, SEED = 6, 0.5, 9
EMPTY = {0: (4,), 1: (1, 4)}   # rank -> the steps at which it keeps no sample (step 4: no rank does)
RTOL, ATOL = 1e-5, 1e-6        # all-reduced sums in another order than one process's


def model() -> nn.Module:
    """The same initial weights in every process."""
    with torch.random.fork_rng():
        torch.manual_seed(SEED)
        return nn.Sequential(nn.Linear(D, H), nn.Tanh(), nn.Linear(H, C))


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s batch at ``step`` (the grading process rebuilds every rank's for the reference)."""
    gen = torch.Generator().manual_seed(1000 * SEED + 10 * step + rank)
    x, y = torch.randn(B, D, generator=gen), torch.randint(0, C, (B,), generator=gen)
    keep = torch.rand(B, generator=gen) > 0.4
    keep[0] = True                          # at least one sample to keep ...
    if step in EMPTY.get(rank, ()):
        keep[:] = False                     # ... except where this rank has none
    return x, y, keep


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
    """Raised on every rank when their collectives differ: where a real job would hang."""


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
        self.made += 1
        mine = {"n": self.made, "step": self.batches.step, "kind": kind, "shapes": [list(t.shape) for t in tensors],
                "at": self._at()}
        self.store.set(f"{self.key}/op/{self.rank}/{self.made}", json.dumps(mine))
        for peer in range(self.nprocs):
            if peer != self.rank:
                self._agree(mine, peer)
        return {"step": mine["step"], "at": mine["at"],
                "input_abs": float(sum(t.detach().abs().sum() for t in tensors if t.is_floating_point()))}

    def _agree(self, mine: dict, peer: int) -> None:
        deadline = time.monotonic() + default_timeout().total_seconds()
        op_key, done_key = f"{self.key}/op/{peer}/{mine['n']}", f"{self.key}/done/{peer}"
        while not self.store.check([op_key]):
            if self.store.check([done_key]):
                made = int(self.store.get(done_key))
                raise Mismatch(json.dumps({"rank": self.rank, "mine": mine, "peer": peer, "peer_done": made}))
            if time.monotonic() > deadline:
                raise Mismatch(json.dumps({"rank": self.rank, "mine": mine, "peer": peer, "peer_done": None}))
            time.sleep(0.002)
        theirs = json.loads(self.store.get(op_key))
        if [theirs[k] for k in ("step", "kind", "shapes")] != [mine[k] for k in ("step", "kind", "shapes")]:
            raise Mismatch(json.dumps({"rank": self.rank, "mine": mine, "peer": peer, "theirs": theirs}))

    def done(self) -> None:
        self.store.set(f"{self.key}/done/{self.rank}", str(self.made))

    @property
    def calls(self) -> list[dict]:
        return [{"kind": op.kind, "shape": list(op.shape), **op.tags} for op in self.ops]


def rank_main(paths: list[str]) -> list[dict]:
    """Runs on every rank: each file's ``train`` in turn, under its own :class:`Ledger`."""
    init_distributed()
    return [_observe(path, f"ex09/file{i}") for i, path in enumerate(paths)]


def _observe(path: str, tag: str) -> dict:
    rank = dist.get_rank()
    net, batches = model(), Batches(rank)
    learner, error = attempt(load_learner, path)
    ledger = Ledger(tag, batches, path)
    with CapturedPrints() as out:
        if error is None:
            with ledger:
                trained, error = attempt(learner.train, net, batches, lr=LR)
    ledger.done()
    echo(out.lines)
    mismatch = json.loads(str(error)) if isinstance(error, Mismatch) else None
    return {"rank": rank, "final": cpu_state(net), "calls": ledger.calls, "counts": ledger.counts(),
            "mismatch": mismatch, "error": None if mismatch else raised(error),
            "traceback": None if error is None or mismatch else "".join(traceback.format_exception(error))[-2000:]}
