"""Exercise 4's observations: one file's run at one world size (every rank's shards, bytes held and peak
memory in the measured step, the trained weights, the export), and the byte counts that follow.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from distlab.lab.fsdp_memory import unsharded_bytes

PARTS = ("params", "grads", "optimizer")  # what each rank holds: the bytes of each, against 1/W of the whole


@dataclass
class Run:
    """One file's run at one world size: every rank's observation (rank order)."""

    ranks: list[dict]

    @property
    def world(self) -> int:
        return self.ranks[0]["world"]

    @property
    def stepped(self) -> bool:
        """Whether the measured step ran at all (else there is nothing to judge)."""
        return "before" in self.ranks[0]

    def block_bytes(self, blocks: list[int]) -> int:
        """The unsharded float32 bytes of the parameters of ``blocks``."""
        return sum(4 * math.prod(shape) for name, shape in self.ranks[0]["shapes"].items()
                   if name.split(".")[:2] in [["blocks", str(i)] for i in blocks])

    def bytes_summary(self) -> str:
        r0 = self.ranks[0]
        total = sum(r0["expected"][p] for p in PARTS)
        unsharded = unsharded_bytes(r0["shapes"])
        pad = max(r["expected"]["padding"] for r in self.ranks)
        return (f"rank 0 holds {sum(r0['after'][p] for p in PARTS)} B of params+grads+Adam state (expected "
                f"{total} B; padding up to {pad} B per rank in params and again in grads) vs {unsharded} B "
                f"unsharded (1/W would be {unsharded // self.world} B)")
