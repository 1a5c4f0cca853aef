"""The one DDP comm hook that observes buckets: what DDP hands to each all-reduce, and when.

DDP's reducer runs in C++ (Li et al., 2020, "PyTorch Distributed", VLDB, section 3.2): wrapping
``torch.distributed.all_reduce`` sees none of its gradient all-reduces, while a comm hook
(``DistributedDataParallel.register_comm_hook``) is called once for every bucket, when the bucket's
last gradient is ready. :class:`BucketLog` is such a hook. It records each bucket (its index, its
bytes, the storage it lives in, the time it was handed over) and then reduces it exactly as DDP's
built-in path does, ``default_hooks.allreduce_hook``: divide by the world size, all-reduce (one
Python call per bucket more, nothing else changes).

The reducer launches the buckets of one backward in index order, so bucket 0 opens each
*round* (one backward that synchronises; none under ``no_sync()``): the rounds are counted from the
buckets themselves, without the caller numbering its iterations.

Used by the labs (``accumulation``: rounds per optimizer step; ``comm_volume``: bytes per step;
``ddp_overlap``: the buckets of every iteration) and by exercise 2's grader (rounds per micro-step).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks


@dataclass(frozen=True)
class Bucket:
    """One bucket DDP handed to the hook: the round (0-based backward) it belongs to, its index in
    that round, its bytes, the ``data_ptr`` of the storage it lives in, and ``time.perf_counter()``."""

    round: int
    index: int
    nbytes: int
    storage: int
    time: float


class BucketLog:
    """A DDP comm hook that records every bucket, then all-reduces it as DDP's default does.

        log = BucketLog().register(ddp)    # or ddp.register_comm_hook(None, log.hook)
        train(...)
        log.rounds, log.bytes_per_round(), log.buckets

    The state DDP passes (the ``state`` given to ``register_comm_hook``: a process group, or
    ``None`` for the default one) is handed on to ``allreduce_hook`` unchanged.
    """

    def __init__(self) -> None:
        self.buckets: list[Bucket] = []
        self.rounds = 0  # backwards that synchronised so far (buckets with index 0)

    def register(self, ddp: torch.nn.parallel.DistributedDataParallel, state=None) -> "BucketLog":
        """Make this the comm hook of ``ddp`` (DDP takes one hook, registered before the first step)."""
        ddp.register_comm_hook(state, self.hook)
        return self

    def hook(self, state, bucket):  # a method (DDP logs the hook's __name__), unannotated (DDP checks them)
        """Record ``bucket`` (a ``dist.GradBucket``), then return ``allreduce_hook``'s future."""
        buf = bucket.buffer()
        if bucket.index() == 0:
            self.rounds += 1
        self.buckets.append(Bucket(self.rounds - 1, bucket.index(), buf.numel() * buf.element_size(),
                                   buf.untyped_storage().data_ptr(), time.perf_counter()))
        return default_hooks.allreduce_hook(state, bucket)

    def in_round(self, r: int) -> list[Bucket]:
        """The buckets of round ``r`` (negative: from the end), in the order DDP handed them over."""
        r = r if r >= 0 else self.rounds + r
        return [b for b in self.buckets if b.round == r]

    def bytes_per_round(self) -> list[list[int]]:
        """The bytes of every bucket, round by round."""
        return [[b.nbytes for b in self.in_round(r)] for r in range(self.rounds)]

    def total_bytes(self) -> int:
        """Bytes handed to the all-reduce so far (every gradient once per round, whatever the buckets)."""
        return sum(b.nbytes for b in self.buckets)
