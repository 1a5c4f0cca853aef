"""Exercise 3's typed rank -> grader contract: one file's parts (the float32, bf16 and fp16 runs, the
scaler's order, the measuring functions on the simulated and the real workloads, and ``accumulated_step``,
``accumulation.observations``), run on one rank; and :class:`Run`, the grading process's view of them.

Each part is observed on its own: one that raised is its record with ``error`` set ("Type: message (line
N: code)") and the rest of it left at its defaults. Imported by the probes (rank side) and the grading
process alike: nothing here imports either.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import torch

from ...rank.observation import Observation
from .accumulation.observations import Accumulation
from ...rank.runtime_copies import Answers
from .answers import ANSWERS

BF16_TENSOR_CORES = (8, 0)  # Ampere and newer: bf16 matmuls on tensor cores


@dataclass
class Autocast(Observation):
    """One bf16 ``train_step`` under hooks: the dtypes inside autocast and at ``optimizer.step()``."""

    linear_out: list[str] = field(default_factory=list)    # each nn.Linear output's dtype ("torch.bfloat16")
    param_dtypes: list[str] = field(default_factory=list)  # the parameters' dtypes at optimizer.step()
    grad_dtypes: list[str] = field(default_factory=list)   # their gradients' dtypes there (parameters with one)
    error: str = ""                                        # what train_step raised ("" if it ran)


@dataclass
class PrecisionRun(Observation):
    """``STEPS`` ``train_step`` calls of one kind (float32, bf16 or fp16), on its own model."""

    losses: list[float] = field(default_factory=list)      # the loss train_step returned, per step
    leftover: list[float] = field(default_factory=list)    # per backward, the gradient norm in .grad as it began
    step_norms: list[float] = field(default_factory=list)  # per optimizer.step(), the gradient norm it stepped with
    steps: list[int] = field(default_factory=list)         # per train_step, its optimizer.step() calls
    state: dict[str, torch.Tensor] | None = None           # float32 only: the final weights, by parameter name
    error: str = ""                                        # what a step raised ("" if all ran)


@dataclass
class Parity(Observation):
    """The float32, bf16 and fp16 runs, each on its own (one that raises does not hide the others)."""

    runs: dict[str, PrecisionRun] = field(default_factory=dict)  # keyed by kind: "fp32", "bf16", "fp16"
    error: str = ""                                              # why no run was made at all ("" if they were)


@dataclass
class Scaler(Observation):
    """One fp16 step under a recording GradScaler, then (on its own) a step with an inf in its batch."""

    # the first step's calls in order: "scale", "backward", "unscale_", "step", "optimizer.step", "update"
    events: list[str] = field(default_factory=list)
    grad_norm: float = float("nan")      # the gradient norm the optimizer stepped with (nan: it never stepped)
    inf_error: str = ""                  # what the inf step raised ("" if it ran)
    scale_before_inf: float = 0.0        # the scaler's scale before the inf step
    scale_after_inf: float = 0.0         # and after it
    inf_params_unchanged: bool = False   # whether the inf step left every weight as it was
    error: str = ""                      # what the first step raised ("" if it ran)
    scaled_dtype: str = ""               # the dtype of the loss the first step gave scaler.scale() ("": none)


@dataclass
class Compared(Observation):
    """What ``compare`` returned on one simulated workload: the contract's numbers it held (``None``: absent)."""

    speedup: float | None = None
    memory_ratio: float | None = None
    baseline_bytes: float | None = None   # kept only where it is a number
    candidate_bytes: float | None = None  # the same

    def keys(self) -> list[str]:
        """The contract's keys the returned dict held."""
        return [k for k in ("speedup", "memory_ratio", "baseline_bytes", "candidate_bytes")
                if getattr(self, k) is not None]


@dataclass
class TimingCall(Observation):
    """One call ``compare`` made of the learner's ``median_seconds``: the settings it ran with (its own
    defaults filled in where the call gave none), and the learner's line that called it."""

    warmup: float | None
    min_run_time: float | None
    line: str  # "ex03_amp.py:145" ("" when the caller was not the learner's file)
    case: str = ""  # the simulated workload compare was measuring ("" on the real model)
    timed_s: float | None = None  # virtual seconds from its first clock reading to its last (None: not known)
    sync_given: bool | None = None  # whether its sync was the one compare was handed (None: not known)
    synced: int | None = None  # the calls of compare's sync while it ran (None: not on a workload's clock)
    returned: float | None = None  # the seconds it returned (None: it raised, or returned no number)


@dataclass
class Measure(Observation):
    """``compare`` on every simulated workload, under its virtual clock."""

    cases: dict[str, Compared] = field(default_factory=dict)  # keyed by workload ("steady", "warmup", ...)
    error: str = ""                                           # what compare first raised ("" if it never did)
    errors: dict[str, str] = field(default_factory=dict)      # what it raised, by workload
    # the workloads where compare raised after its two median_seconds calls returned: their speedup is those
    # two's ratio, and the other workloads were measured all the same
    timed_only: list[str] = field(default_factory=list)
    timing_calls: list[TimingCall] = field(default_factory=list)  # compare's calls of median_seconds
    clocks: list[str] = field(default_factory=list)  # the clocks read on the workloads ("perf_counter", ...)
    caller_threads: int = 0  # torch's threads where compare was called
    fn_threads: list[int] = field(default_factory=list)  # torch's threads the workloads ran with, each once


# The grader's own entries of the real model's observation, beside what compare returned.
REAL_OWN = ("peak_ratio", "peak_method", "device", "model")


@dataclass
class RealModel(Observation):
    """``compare`` on the real model (bf16 against float32 ``train_step``), and the grader's own memory reading."""

    returned: dict[str, float] = field(default_factory=dict)  # compare's dict, keyed as it returned it, as floats
    peak_ratio: float = 0.0   # the grader's bf16 / fp32 peak memory of one step
    peak_method: str = ""     # how it measured it (torch.cuda.max_memory_allocated, saved_tensors_hooks...)
    device: str = ""          # the device's name ("CPU, 2 thread(s)" on a CPU)
    model: str = ""           # the real model's sizes, in words
    skipped: str = ""         # the graded function whose runtime copy made it skip ("" if it was measured)
    error: str = ""           # what compare raised ("" if it ran)

    def keys(self) -> list[str]:
        """Every key of the observation as one dict, compare's and the grader's (what ``missing`` lists)."""
        return sorted({*self.returned, *REAL_OWN})

    def numbers(self) -> dict[str, float]:
        """Its numbers, compare's then the grader's peak ratio (an entry of compare's that one of the grader's
        own names replaces is left out)."""
        return {**{k: v for k, v in self.returned.items() if k not in REAL_OWN}, "peak_ratio": self.peak_ratio}


@dataclass
class LookAlikes(Observation):
    """Calls of functions that look like the contract's and do something else, each with the learner's first line
    ("ex03_amp.py:61"): ``clip_grad_value_`` (each element clamped, not the norm) and ``torch.cuda.amp.autocast``
    (CUDA's only: on the CPU it casts nothing)."""

    calls: dict[str, str] = field(default_factory=dict)


@dataclass
class AmpObservation(Observation):
    """One learner file, every part observed on the one rank."""

    capability: list[int] | None  # the GPU's compute capability; None on a CPU
    autocast: Autocast
    parity: Parity
    scaler: Scaler
    measure: Measure
    accumulation: Accumulation
    real: RealModel
    answers: Answers
    lookalikes: LookAlikes = field(default_factory=LookAlikes)  # in the train part


@dataclass
class Run:
    """One file's observations (one rank: mixed precision is not about several processes)."""

    obs: AmpObservation

    def kind(self, kind: str) -> PrecisionRun:
        """The ``fp32``, ``bf16`` or ``fp16`` run's observations (the error, where the runs raised as a whole)."""
        p = self.obs.parity
        return p.runs.get(kind) or PrecisionRun(error=p.error)

    @cached_property
    def copied(self) -> dict[str, str]:
        """For each graded measuring function, why it is the runtime's copy ("" if it is the learner's own)."""
        answers = self.obs.answers
        return {fn: ANSWERS.feedback(fn, answers.identified, answers.calls) for fn in ANSWERS.graded}

    @property
    def capability(self) -> tuple[int, ...]:  # the GPU's compute capability; () where the rank ran on a CPU
        return tuple(self.obs.capability or ())

    @property
    def gpu_speedup_graded(self) -> bool:  # never on a CPU: () < BF16_TENSOR_CORES
        return self.capability >= BF16_TENSOR_CORES
