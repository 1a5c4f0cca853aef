"""Exercise 10's observations: one file's two rings on every rank (the output shard, or the ``dq, dk, dv``;
every send and receive with its peer, the collectives, what it raised), and the single-process references."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .reference import key_sources, shard, whole


@dataclass
class Run:
    """One file's ring attention on ``world`` ranks, and each rank's rows of the whole sequence's attention;
    :meth:`backward` is the same view of its backward ring, with autograd's gradients (``grads``)."""

    ranks: list[dict]
    reference: list[torch.Tensor]
    grads: list[dict[str, torch.Tensor]] = field(default_factory=list)

    def backward(self) -> "Run":
        """The backward's ring as a ``Run`` of its own (each rank's ``grads``, sends, receives, collectives,
        errors): the protocol's causes read it as they read the forward's."""
        return Run([r["backward"] for r in self.ranks], self.reference, self.grads)

    @property
    def world(self) -> int:
        return len(self.ranks)

    def p2p(self, rank: int, op: str) -> list[dict]:
        return [c for c in self.ranks[rank]["p2p"] if c["op"] == op]

    def errors(self) -> list[dict]:
        return [r for r in self.ranks if r["error"]]

    def not_implemented(self) -> str | None:
        """Where the function still raises ``NotImplementedError`` (the learner's line), if it does."""
        return next((r["not_implemented"] for r in self.ranks if r["not_implemented"]), None)

    def bytes_moved(self, rank: int, op: str) -> int:
        """The bytes of this rank's sends (or receives): shapes as recorded, float32."""
        return sum(4 * torch.Size(c["shape"]).numel() for c in self.p2p(rank, op))

    def shard_bytes(self) -> int:
        return shard(whole()[0], 0, self.world).nbytes

    def sources(self, rank: int) -> list[int | None]:
        """Per receive of this rank, the rank whose key shard it held (``None``: no key shard in it): is the
        ring forwarding what it received?"""
        keys = key_sources(self.world)
        size = next(iter(keys)).__len__() // 4  # float32 values per key shard
        found = []
        for c in self.p2p(rank, "recv"):
            value = c["value"]
            if value is None or value.dtype != torch.float32 or value.numel() % size:
                found.append(None)
                continue
            hits = [keys.get(piece.numpy().tobytes()) for piece in value.flatten().split(size)]
            found.append(min((s for s in hits if s is not None), default=None))
        return [s for s in found if s is not None] or found
