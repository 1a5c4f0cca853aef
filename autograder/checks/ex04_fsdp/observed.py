"""Exercise 4's observations: one file's run at one world size (every rank's shards, bytes held and peak
memory in the measured step, the trained weights, the export), and the byte counts that follow; for
part 1 (ZeRO-1), each rank's shard, gradient and weights read against the flat reference.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from distlab.lab.fsdp_memory import unsharded_bytes

from .reference import zero1_reference

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
        """Whether part 2's measured step ran at all (else there is nothing of it to judge)."""
        return "before" in self.ranks[0]

    # Part 1, ZeRO-1 -------------------------------------------------------------------------------------

    @property
    def z1(self) -> list[dict]:
        """Every rank's part 1 observation (rank order)."""
        return [r["zero1"] for r in self.ranks]

    @functools.cached_property
    def z1_ref(self) -> dict:
        return zero1_reference(self.world)

    def z1_slice(self, s: int) -> tuple[int, int]:
        """Rank ``s``'s slice ``[s * c, (s + 1) * c)`` of the padded flat parameters."""
        c = self.z1_ref["c"]
        return s * c, (s + 1) * c

    def z1_shard_of(self, rank: int) -> int | None:
        """Whose slice of the initial flat parameters rank ``rank``'s shard copies (``None``: no one's)."""
        shard = self.z1[rank]["holdings"].get("shard")
        initial = self.z1_ref["initial"]
        if shard is None or shard.numel() != self.z1_ref["c"]:
            return None
        return next((s for s in range(self.world) if torch.equal(shard.float(), initial[slice(*self.z1_slice(s))])),
                    None)

    def z1_grad_ratio(self, rank: int) -> float | None:
        """Rank ``rank``'s gradient at its first step / the mean gradient of its slice (least squares), when
        one is a multiple of the other (``None`` otherwise)."""
        got = self.z1[rank]["first_grad"]
        ref = self.z1_ref["first_grad"][slice(*self.z1_slice(rank))]
        if got is None or got.shape != ref.shape or not float(ref @ ref):
            return None
        ratio = float(got.double() @ ref.double() / (ref.double() @ ref.double()))
        return ratio if torch.allclose(got, ratio * ref, rtol=1e-3, atol=1e-6) else None

    def z1_final(self, rank: int) -> torch.Tensor:
        """Rank ``rank``'s flat parameters after the last step, zero-padded as the reference's."""
        final = self.z1[rank]["final"]
        return torch.nn.functional.pad(final, (0, self.world * self.z1_ref["c"] - final.numel()))

    def z1_stale(self, rank: int) -> list[int]:
        """The ranks' slices of rank ``rank``'s final parameters still equal to their initial values."""
        final, initial, numel = self.z1_final(rank), self.z1_ref["initial"], self.z1_ref["numel"]
        return [s for s in range(self.world)
                if torch.equal(final[slice(*self.z1_slice(s))][:max(0, numel - s * self.z1_ref["c"])],
                               initial[slice(*self.z1_slice(s))][:max(0, numel - s * self.z1_ref["c"])])]

    def z1_counts(self, rank: int = 0) -> list[dict[str, int]]:
        """Per step, rank ``rank``'s collectives by kind."""
        out = []
        for ops in self.z1[rank]["steps"]:
            counts: dict[str, int] = {}
            for kind, _, _ in ops:
                counts[kind] = counts.get(kind, 0) + 1
            out.append(counts)
        return out

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
