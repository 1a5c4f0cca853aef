"""Exercise 8's observations: one file's step at one world size (what each rank's layers hold, the output,
the gradients, every collective with its phase and layer), and the unsplit block's figures to compare with.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .probes import STAGES, shard, unsplit_step


@dataclass
class Run:
    """One file's step at one world size: every rank's observation (rank order)."""

    ranks: list[dict]

    @property
    def world(self) -> int:
        return len(self.ranks)

    @property
    def ref(self) -> dict:
        return unsplit_step()

    def expected(self, part: str, rank: int, of: str = "weights") -> torch.Tensor:
        """Rank ``rank``'s shard of the unsplit block's ``part`` (``of="grads"``: of its gradient)."""
        return shard(self.ref[of][part], part, rank, self.world)

    def partial(self, rank: int) -> torch.Tensor:
        """What rank ``rank``'s row layer should hand to the all-reduce: its hidden features times its columns."""
        cols = self.ref["hidden"].double().chunk(self.world, dim=1)[rank]
        return cols @ self.expected("row.weight", rank).double().T

    def calls(self, rank: int, phase: str, kind: str | None = None) -> list[dict]:
        return [c for c in self.ranks[rank]["comm"] if c["phase"] == phase and kind in (None, c["kind"])]

    def failure(self, stage: str) -> dict | None:
        """The first rank whose step raised at ``stage`` or before it."""
        return next((r for r in self.ranks if r["error"] and STAGES.index(r["stage"]) <= STAGES.index(stage)), None)
