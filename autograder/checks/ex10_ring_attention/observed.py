"""Exercise 10's observations: one file's ring on every rank (the output shard, every send and receive with
its peer, the collectives, what it raised), and the single-process references."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .reference import shard, whole


@dataclass
class Run:
    """One file's ring attention on ``world`` ranks, and each rank's rows of the whole sequence's attention."""

    ranks: list[dict]
    reference: list[torch.Tensor]

    @property
    def world(self) -> int:
        return len(self.ranks)

    def p2p(self, rank: int, op: str) -> list[dict]:
        return [c for c in self.ranks[rank]["p2p"] if c["op"] == op]

    def errors(self) -> list[dict]:
        return [r for r in self.ranks if r["error"]]

    def bytes_moved(self, rank: int, op: str) -> int:
        """The bytes of this rank's sends (or receives): shapes as recorded, float32."""
        return sum(4 * torch.Size(c["shape"]).numel() for c in self.p2p(rank, op))

    def shard_bytes(self) -> int:
        return shard(whole()[0], 0, self.world).nbytes

    def sources(self, rank: int) -> list[int | None]:
        """Per receive of this rank, the rank whose key shard it held (``None``: no key shard in it): is the
        ring forwarding what it received?"""
        k = whole()[1]
        keys = [shard(k, s, self.world).flatten() for s in range(self.world)]
        found = []
        for c in self.p2p(rank, "recv"):
            value = c["value"]
            if value is None or value.numel() % keys[0].numel():
                found.append(None)
                continue
            pieces = value.flatten().split(keys[0].numel())
            found.append(next((s for s, key in enumerate(keys) for p in pieces if torch.equal(p, key)), None))
        return [s for s in found if s is not None] or found
