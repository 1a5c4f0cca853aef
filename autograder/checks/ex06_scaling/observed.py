"""Exercise 6's observations: one file's launch at one world size (:class:`Run`: the synthetic step's
times, the learner's figure, clock reads and collectives, the real step's DDP counts), and its launches
at every world size (:class:`Benchmark`), with the truth that follows from the recorded step times.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .probes import SYNTH

REAL = dict(batch_size=128, hidden=256, warmup=5, iters=30, lr=0.01)


@dataclass
class Run:
    """One file's launch at one world size: every rank's observation, in rank order."""

    ranks: list[dict]
    real: dict = field(default_factory=lambda: dict(REAL))  # the real benchmark's settings it ran with

    @property
    def world(self) -> int:
        return len(self.ranks)

    def truth(self) -> dict:
        """What a correct measurement reports, and what the classic mistakes report, from the step logs."""
        b, n, k = SYNTH["batch_size"], SYNTH["iters"], SYNTH["warmup"]
        times = [r["times"] for r in self.ranks]
        samples = self.world * b * n
        window = max(t[-1, 1] for t in times) - max(t[k, 0] for t in times)
        rank0_alone = times[0][-1, 1] - times[0][k, 0]
        with_warmup = max(t[-1, 1] for t in times) - min(t[0, 0] for t in times)
        return {"truth": samples / window.item(), "window": window.item(), "rank0_alone": rank0_alone.item(),
                "with_warmup": with_warmup.item(), "samples": samples}

    def ratio(self) -> float:
        """Rank 0's figure over the truth."""
        return self.ranks[0]["reported"] / self.truth()["truth"]

    def events(self, kind: str | None = None) -> list[dict]:
        """Rank 0's clock reads and collectives in ``measure_throughput``, in order (``kind``: one of them)."""
        return [e for e in self.ranks[0].get("method", []) if kind is None or e["kind"] == kind]


@dataclass
class Benchmark:
    """One file's launches at every world size, in order; ``kept``: its results folder outlives grading."""

    runs: list[Run]
    kept: bool

    @property
    def last(self) -> dict:
        """Rank 0's observation in the last launch: the efficiency and the files it wrote."""
        return self.runs[-1].ranks[0]

    @property
    def figures(self) -> dict[int, float]:
        """The real model's throughput at each world size where the learner's step ran."""
        return {run.world: run.ranks[0]["real"] for run in self.runs if "real" in run.ranks[0]}
