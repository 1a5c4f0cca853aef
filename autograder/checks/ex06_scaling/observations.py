"""Exercise 6's observations: one file's launch at one world size (:class:`Run`: the synthetic step's
times, the learner's figure, clock reads and collectives, the real step's DDP counts), and its launches
at every world size (:class:`Benchmark`, with the α-β fit and prediction made in the first), with the
truth that follows from the recorded step times and clock reads.
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

    def window(self) -> float:
        """The window rank 0's figure implies: every rank's timed samples over it."""
        return self.truth()["samples"] / self.ranks[0]["reported"]

    def _ends(self) -> tuple[float, float]:
        """When the last rank finished its warm-up, and its timed steps."""
        k = SYNTH["warmup"]
        return (max(r["times"][k - 1, 1].item() for r in self.ranks),
                max(r["times"][-1, 1].item() for r in self.ranks))

    def read_windows(self) -> tuple[float, float] | None:
        """The shortest and the longest window a correct method timed with the clock reads the ranks made:
        a read after the warm-up and after every rank's warm-up ended, to a read after the last step and
        after every rank's last step ended (the spies' ``before``/``after`` bracket each reading). These
        follow from the order of events, not from how fast a loaded machine ran them. ``(0, 0)``: reads
        were made there, but none in time; ``None``: no rank read a clock there (one the spies cannot see)."""
        k, n = SYNTH["warmup"], SYNTH["iters"]
        warm_end, timed_end = self._ends()
        seen, lo, hi = False, float("inf"), 0.0
        for r in self.ranks:
            reads = [e for e in r.get("method", []) if e["kind"] == "clock" and "before" in e]
            starts = [e for e in reads if e["steps"] == k]
            stops = [e for e in reads if e["steps"] == k + n]
            seen = seen or bool(starts and stops)
            starts = [e for e in starts if e["before"] >= warm_end]
            stops = [e for e in stops if e["before"] >= timed_end]
            if starts and stops:
                lo = min(lo, min(e["before"] for e in stops) - max(e["after"] for e in starts))
                hi = max(hi, max(e["after"] for e in stops) - min(e["before"] for e in starts))
        return (lo, hi) if hi else ((0.0, 0.0) if seen else None)

    def step_windows(self) -> tuple[float, float]:
        """Without clock reads: the shortest window that covers every rank's timed steps (the truth's), and
        the longest one between the last rank's warm-up and the last return of ``measure_throughput``."""
        warm_end, _ = self._ends()
        return self.truth()["window"], max(r.get("returned", 0.0) for r in self.ranks) - warm_end

    def own_ratio(self) -> float:
        """Rank 0's figure over all timed samples per the window rank 0's own clock reads span (last read at
        the warm-up's end to last read after the last step): exact factors for miscounted samples or summed
        clocks, however loaded the machine. Falls back to :meth:`ratio` without such reads."""
        k, n = SYNTH["warmup"], SYNTH["iters"]
        reads = [e for e in self.events("clock") if "before" in e]
        starts, stops = [e for e in reads if e["steps"] <= k], [e for e in reads if e["steps"] == k + n]
        if not starts or not stops:
            return self.ratio()
        own = (stops[-1]["before"] + stops[-1]["after"] - starts[-1]["before"] - starts[-1]["after"]) / 2
        return self.ranks[0]["reported"] * own / self.truth()["samples"]

    def events(self, kind: str | None = None) -> list[dict]:
        """Rank 0's clock reads and collectives in ``measure_throughput``, in order (``kind``: one of them)."""
        return [e for e in self.ranks[0].get("method", []) if kind is None or e["kind"] == kind]


@dataclass
class Benchmark:
    """One file's launches at every world size, in order."""

    runs: list[Run]

    @property
    def model(self) -> dict:
        """Rank 0's observation of the α-β part in the first launch: the fits and the predictions."""
        return self.runs[0].ranks[0].get("model", {"fits": [], "predictions": []})

    @property
    def figures(self) -> dict[int, float]:
        """The real model's throughput at each world size where the learner's step ran."""
        return {run.world: run.ranks[0]["real"] for run in self.runs if "real" in run.ranks[0]}
