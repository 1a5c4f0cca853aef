"""Exercise 10's observations: the typed contract between the ranks (``probes``) and the grader.

Each rank returns one :class:`ForwardRing` per file: its forward ring (the output shard), with the
backward's (:class:`BackwardRing`: the ``dq, dk, dv``) inside; each ring with every send and receive
(a :class:`P2PCall`, with its peer and what a receive got), the collectives, and what it raised. The
grader reads them in a :class:`Run`, next to the single-process references."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ...rank.observation import Observation
from ...rank.spies import P2PCall  # the spy's record of one send or receive, shared with exercise 7
from .reference import BATCH, HEAD_DIM, HEADS, SEQ, key_sources, shard, whole


@dataclass
class Ring(Observation):
    """One rank's run of one of the learner's functions: one ring (the forward's or the backward's)."""

    rank: int
    world: int
    error: str | None = None          # what it raised (not NotImplementedError), as ``rank.raised`` puts it
    where: str | None = None          # the learner's line that raised ("" if none of theirs)
    not_implemented: str | None = None  # where it raised NotImplementedError, or that the file lacks the function
    returned_none: bool = False       # it returned None and raised nothing
    collectives: list[str] = field(default_factory=list)  # the kinds of collective it ran (sorted), sends aside
    p2p: list[P2PCall] = field(default_factory=list)      # every send and receive of this ring
    flops: int = 0                    # of its matrix products (SDPA's included), by their shapes


@dataclass
class BackwardRing(Ring):
    """One rank's ``ring_attention_backward``, given the exact ``out``, ``lse`` and ``dout``."""

    grads: dict[str, torch.Tensor | None] | None = None  # by gradient ("dq", "dk", "dv"); None: not three tensors


@dataclass
class ForwardRing(Ring):
    """One rank's observation of one file: its ``ring_attention``, and the backward's ring."""

    out: torch.Tensor | None = None   # its rows of the output (None: not a tensor)
    out_large: torch.Tensor | None = None  # its rows on queries times reference.LARGE (None: not run or no tensor)
    backward: BackwardRing | None = None  # the backward's ring (set once it has run: always, in what a rank sends)


@dataclass
class Run:
    """One file's ring attention on ``world`` ranks, and each rank's rows of the whole sequence's attention;
    :meth:`backward` is the same view of its backward ring, with autograd's gradients (``grads``)."""

    ranks: list[Ring]
    reference: list[torch.Tensor]
    grads: list[dict[str, torch.Tensor]] = field(default_factory=list)
    large: list[torch.Tensor] = field(default_factory=list)  # the reference on queries times reference.LARGE

    @classmethod
    def from_wire(cls, ranks: list[dict], reference: list[torch.Tensor],
                  grads: list[dict[str, torch.Tensor]], large: list[torch.Tensor] | None = None) -> Run:
        """The run of one file from what its ranks sent (``launch_files``: one wire record per rank)."""
        return cls([ForwardRing.from_wire(r) for r in ranks], reference, grads, large or [])

    def backward(self) -> Run:
        """The backward's ring as a ``Run`` of its own (each rank's ``grads``, sends, receives, collectives,
        errors): the protocol's causes read it as they read the forward's."""
        return Run([r.backward for r in self.ranks], self.reference, self.grads)

    @property
    def world(self) -> int:
        return len(self.ranks)

    def p2p(self, rank: int, op: str) -> list[P2PCall]:
        return [c for c in self.ranks[rank].p2p if c.op == op]

    def errors(self) -> list[Ring]:
        return [r for r in self.ranks if r.error]

    def not_implemented(self) -> str | None:
        """Where the function still raises ``NotImplementedError`` (the learner's line), if it does."""
        return next((r.not_implemented for r in self.ranks if r.not_implemented), None)

    def bytes_moved(self, rank: int, op: str) -> int:
        """The bytes of this rank's sends (or receives): shapes as recorded, float32."""
        return sum(4 * torch.Size(c.shape).numel() for c in self.p2p(rank, op))

    def blocks(self, rank: int) -> float:
        """The scores this rank computed, in blocks of ``c x c`` (``c = S / 2W``, a chunk) per head: its matrix
        products' FLOPs over what one score costs, ``2 D`` in ``q k^T`` and ``2 D`` in ``p v`` (the backward's
        five products: ``q k^T``, ``dout v^T``, ``ds k``, ``ds^T q``, ``p^T dout``)."""
        c = SEQ // (2 * self.world)
        per_score = (10 if isinstance(self.ranks[rank], BackwardRing) else 4) * BATCH * HEADS * HEAD_DIM
        return self.ranks[rank].flops / (per_score * c * c)

    def shard_bytes(self) -> int:
        return shard(whole()[0], 0, self.world).nbytes

    def sources(self, rank: int) -> list[int | None]:
        """Per receive of this rank, the rank whose key shard it held (``None``: no key shard in it): is the
        ring forwarding what it received?"""
        keys = key_sources(self.world)
        size = next(iter(keys)).__len__() // 4  # float32 values per key shard
        found = []
        for c in self.p2p(rank, "recv"):
            value = c.value
            if value is None or value.dtype != torch.float32 or value.numel() % size:
                found.append(None)
                continue
            hits = [keys.get(piece.numpy().tobytes()) for piece in value.flatten().split(size)]
            found.append(min((s for s in hits if s is not None), default=None))
        return [s for s in found if s is not None] or found
