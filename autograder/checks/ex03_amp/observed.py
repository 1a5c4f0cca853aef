"""Exercise 3's observations: one file's parts (the float32, bf16 and fp16 runs, the scaler's order,
the measuring functions on the simulated and the real workloads), run on one rank.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from .probes import ANSWERS

BF16_TENSOR_CORES = (8, 0)  # Ampere and newer: bf16 matmuls on tensor cores


@dataclass
class Run:
    """One file's observations (one rank: mixed precision is not about several processes)."""

    obs: dict

    def kind(self, kind: str) -> dict:
        """The ``fp32``, ``bf16`` or ``fp16`` run's observations (the error, where the runs raised as a whole)."""
        p = self.obs["parity"]
        return p.get(kind, p)

    @cached_property
    def copied(self) -> dict[str, str]:
        """For each graded measuring function, why it is the runtime's copy ("" if it is the learner's own)."""
        answers = self.obs.get("answers", {})
        return {fn: ANSWERS.feedback(fn, answers.get("is", {}), answers.get("calls", [])) for fn in ANSWERS.graded}

    @property
    def capability(self) -> tuple[int, ...]:  # the GPU's compute capability; () where the rank ran on a CPU
        return tuple(self.obs.get("capability") or ())

    @property
    def gpu_speedup_graded(self) -> bool:  # never on a CPU: () < BF16_TENSOR_CORES
        return self.capability >= BF16_TENSOR_CORES

