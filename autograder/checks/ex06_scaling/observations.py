"""Exercise 6's observations: the typed contract between the ranks (``probes``) and the grading process.

Each rank returns, for each file, one :class:`RankObservation`: the synthetic step's times, the learner's
figure and the clock reads and collectives it made (:class:`MethodEvent`), the real step's DDP counts,
and in the first launch rank 0's observation of the α-β part (``alphabeta.observations``). The grader's
views: one file's launch at one world size (:class:`Run`), and its launches at every world size
(:class:`Benchmark`), with the truth that follows from the recorded step times and clock reads.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ...rank.observation import Observation
from .alphabeta.observations import ModelObservation

SYNTH = dict(batch_size=32, warmup=2, iters=8)  # the synthetic step's measure_throughput arguments
# lr: not the 0.01 of bench_rank and the notebook, which a make_ddp_step that ignores its lr would use
REAL = dict(batch_size=128, hidden=256, warmup=5, iters=30, lr=0.05)


def real_batch(rank: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s batch of the real step, ``(x, y)`` on the CPU: its own, from a generator seeded by the
    rank (the probes hand it to ``make_ddp_step``; the reference replays it)."""
    gen = torch.Generator().manual_seed(rank)
    return torch.randn(batch_size, 64, generator=gen), torch.randint(0, 10, (batch_size,), generator=gen)


@dataclass
class MethodEvent(Observation):
    """One clock the learner's file read, or one collective it called, while a run was watched."""

    kind: str      # "clock" or "collective"
    name: str      # the function: "perf_counter", "process_time", ..., "barrier", "all_reduce", ...
    steps: int     # the steps done at that moment
    in_step: bool  # whether a step was running
    op: str | None = None  # an all_reduce's op ("SUM", "MAX", ...); None for the others
    before: float | None = None  # the grader's clock just before the call (the learner's reading lies between)
    after: float | None = None   # and just after it


@dataclass
class RankObservation(Observation):
    """One rank's observation of one file: the synthetic method run, then the real benchmark (filled in
    after), and rank 0's of the α-β part in the first launch."""

    rank: int
    backend: str     # the process group's backend ("gloo", "nccl")
    reported: float | None  # the figure measure_throughput returned on the synthetic step (None: nothing)
    returned: float  # the grader's clock when it returned (no correct window ends later, on this rank)
    times: torch.Tensor  # float64 (calls, 2): each synthetic step's start and end on the grader's clock
    method: list[MethodEvent] = field(default_factory=list)  # the learner's clock reads and collectives there
    reported_type: str = ""  # the type of what measure_throughput returned where it is no Python number ("Tensor")
    # The real model's benchmark:
    initial: dict[str, torch.Tensor] = field(default_factory=dict)  # the model's state before, by name
    final: dict[str, torch.Tensor] = field(default_factory=dict)    # and after the benchmark
    step_error: str | None = None  # what make_ddp_step raised, at the learner's line
    real: float | None = None      # the figure measure_throughput returned (None: no step, or nothing returned)
    driven: bool = False           # the grader's loop ran the real step: measure_throughput had ended a launch
    real_method: list[MethodEvent] = field(default_factory=list)  # the clock reads and collectives there
    real_steps: int | None = None  # the step() calls (None: make_ddp_step returned no step, or raised)
    opt_steps: int | None = None   # every optimizer step during them (None: no step ran)
    opt_steps_without_grad: int = 0  # those with no gradient on any parameter
    opt_lr: float | None = None  # the learning rate of the first optimizer step (None: none ran)
    opt_other: str = ""  # what the first step's optimizer is beyond SGD(lr): "momentum=0.9", "Adam" ("": plain SGD)
    ddp_wrapped: int = 0        # the DistributedDataParallel wrappers built, in make_ddp_step and the steps
    ddp_forwards: int = 0       # the forwards that went through a wrapper
    ddp_built_in_make: int = 0  # the wrappers make_ddp_step built
    ddp_built_in_step: int = 0  # the wrappers built while a step() ran
    ddp_rounds: int | None = None  # DDP's gradient all-reduce rounds (None: not counted)
    model: ModelObservation | None = None  # the α-β part (rank 0, first launch only)


# What the real benchmark fills in (the part "real", kept apart from the synthetic method's: ``rank.parts``).
REAL_FIELDS = ("backend", "initial", "final", "step_error", "real", "real_method", "real_steps", "opt_steps",
               "opt_steps_without_grad", "opt_lr", "opt_other", "ddp_wrapped", "ddp_forwards", "ddp_built_in_make",
               "ddp_built_in_step", "ddp_rounds", "driven")


@dataclass(frozen=True)
class Truth:
    """What a correct measurement reports, and the windows the classic mistakes time, from the step logs."""

    truth: float        # every rank's timed samples over the window (samples/s)
    window: float       # from the last rank's first timed step to the last rank's last step (s)
    rank0_alone: float  # rank 0's own timed steps (s)
    with_warmup: float  # from the first rank's first step, warm-up included, to the last one's end (s)
    samples: int        # every rank's timed samples


@dataclass
class Run:
    """One file's launch at one world size: every rank's observation, in rank order."""

    ranks: list[RankObservation]
    real: dict = field(default_factory=lambda: dict(REAL))  # the real benchmark's settings it ran with

    @property
    def world(self) -> int:
        return len(self.ranks)

    def truth(self) -> Truth:
        """What a correct measurement reports, and what the classic mistakes report, from the step logs."""
        b, n, k = SYNTH["batch_size"], SYNTH["iters"], SYNTH["warmup"]
        times = [r.times for r in self.ranks]
        samples = self.world * b * n
        window = max(t[-1, 1] for t in times) - max(t[k, 0] for t in times)
        rank0_alone = times[0][-1, 1] - times[0][k, 0]
        with_warmup = max(t[-1, 1] for t in times) - min(t[0, 0] for t in times)
        return Truth(truth=samples / window.item(), window=window.item(), rank0_alone=rank0_alone.item(),
                     with_warmup=with_warmup.item(), samples=samples)

    def ratio(self) -> float:
        """Rank 0's figure over the truth."""
        return self.ranks[0].reported / self.truth().truth

    def window(self) -> float:
        """The window rank 0's figure implies: every rank's timed samples over it."""
        return self.truth().samples / self.ranks[0].reported

    def _ends(self) -> tuple[float, float]:
        """When the last rank finished its warm-up, and its timed steps."""
        k = SYNTH["warmup"]
        return (max(r.times[k - 1, 1].item() for r in self.ranks),
                max(r.times[-1, 1].item() for r in self.ranks))

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
            reads = [e for e in r.method if e.kind == "clock" and e.before is not None]
            starts = [e for e in reads if e.steps == k]
            stops = [e for e in reads if e.steps == k + n]
            seen = seen or bool(starts and stops)
            starts = [e for e in starts if e.before >= warm_end]
            stops = [e for e in stops if e.before >= timed_end]
            if starts and stops:
                lo = min(lo, min(e.before for e in stops) - max(e.after for e in starts))
                hi = max(hi, max(e.after for e in stops) - min(e.before for e in starts))
        return (lo, hi) if hi else ((0.0, 0.0) if seen else None)

    def step_windows(self) -> tuple[float, float]:
        """Without clock reads: the shortest window that covers every rank's timed steps (the truth's), and
        the longest one between the last rank's warm-up and the last return of ``measure_throughput``."""
        warm_end, _ = self._ends()
        return self.truth().window, max(r.returned for r in self.ranks) - warm_end

    def own_ratio(self) -> float:
        """Rank 0's figure over all timed samples per the window rank 0's own clock reads span (last read at
        the warm-up's end to last read after the last step): exact factors for miscounted samples or summed
        clocks, however loaded the machine. Falls back to :meth:`ratio` without such reads."""
        k, n = SYNTH["warmup"], SYNTH["iters"]
        reads = [e for e in self.events("clock") if e.before is not None]
        starts, stops = [e for e in reads if e.steps <= k], [e for e in reads if e.steps == k + n]
        if not starts or not stops:
            return self.ratio()
        own = (stops[-1].before + stops[-1].after - starts[-1].before - starts[-1].after) / 2
        return self.ranks[0].reported * own / self.truth().samples

    def events(self, kind: str | None = None) -> list[MethodEvent]:
        """Rank 0's clock reads and collectives in ``measure_throughput``, in order (``kind``: one of them)."""
        return [e for e in self.ranks[0].method if kind is None or e.kind == kind]


@dataclass
class Benchmark:
    """One file's launches at every world size, in order."""

    runs: list[Run]

    @property
    def model(self) -> ModelObservation:
        """Rank 0's observation of the α-β part in the first launch: the fits and the predictions."""
        return self.runs[0].ranks[0].model or ModelObservation()

    @property
    def figures(self) -> dict[int, float]:
        """The real model's throughput at each world size where the learner's step ran."""
        return {run.world: run.ranks[0].real for run in self.runs if run.ranks[0].real is not None}
