"""Exercise 9's observations: one file's run on every rank, and what follows from them (each rank's
collectives by step, the mismatch where the ranks parted, the single-process reference)."""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import nn

from .probes import EMPTY, LR, STEPS, batch, model


@dataclass
class Run:
    """One file's run: every rank's observation (``probes._observe``), in rank order."""

    ranks: list[dict]

    @property
    def world(self) -> int:
        return len(self.ranks)

    @property
    def mismatch(self) -> dict | None:
        """The first rank's report of where the ranks' collectives parted (``None``: they never did)."""
        return next((r["mismatch"] for r in self.ranks if r["mismatch"]), None)

    def at_step(self, rank: int, step: int, kind: str = "all_reduce") -> list[dict]:
        return [c for c in self.ranks[rank]["calls"] if c["step"] == step and c["kind"] == kind]

    def grad_reduces(self, rank: int, step: int) -> list[dict]:
        """The all-reduces of ``rank`` at ``step`` of more than one number (gradients, not counts or flags)."""
        return [c for c in self.at_step(rank, step) if c["shape"]]

    @functools.cached_property
    def param_shapes(self) -> list[list[int]]:
        return [list(p.shape) for p in model().parameters()]

    def count_reduces(self, rank: int, step: int) -> list[dict]:
        """The all-reduces of ``rank`` at ``step`` of a tensor shaped like no parameter (a count, a flag)."""
        return [c for c in self.at_step(rank, step) if c["shape"] not in self.param_shapes]

    def backwards(self, rank: int, step: int) -> list[dict]:
        """The gradients a backward accumulated into ``rank``'s parameters at ``step`` (``probes.Backwards``)."""
        return [b for b in self.ranks[rank]["backwards"] if b["step"] == step]

    @functools.cached_property
    def unchanged(self) -> bool:
        """Whether every rank's weights came back as they started (no update was applied)."""
        start = model().state_dict()
        return all(torch.equal(r["final"][k], v) for r in self.ranks for k, v in start.items())

    def kept(self, rank: int, step: int) -> int:
        return int(batch(rank, step)[2].sum())

    def empty_steps(self) -> list[tuple[int, int]]:
        """``(rank, step)`` where that rank kept no sample while another rank kept some."""
        return [(r, s) for r in range(self.world) for s in EMPTY.get(r, ())
                if any(self.kept(o, s) for o in range(self.world))]

    @functools.cached_property
    def reference(self) -> dict:
        """One process, SGD on the mean cross-entropy over the kept samples of each global batch."""
        net = model()
        opt = torch.optim.SGD(net.parameters(), lr=LR)
        for step in range(STEPS):
            parts = [batch(r, step) for r in range(self.world)]
            x = torch.cat([x[k] for x, _, k in parts])
            y = torch.cat([y[k] for _, y, k in parts])
            if len(y) == 0:
                continue  # no sample on any rank: nothing to learn
            opt.zero_grad()
            nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
        return {k: v.detach().clone() for k, v in net.state_dict().items()}
