"""What exercise 3's rank runs the learner's functions on, and what the grader knows of it.

Shared by the rank-side instruments (``probes``, which re-exports it) and the grading process:

* the step's settings, its batches of the digits and the single-process float32 reference
  (:func:`reference_fp32`) the float32 step is compared with;
* the :class:`distlab.measure.timing.SimulatedWorkload` s ``compare`` measures under a
  :class:`distlab.measure.timing.VirtualClock` (``CASES``), and their truths (``CASES_TRUTH``, ``MEMORY_TRUTH``);
* :class:`Clocks`: every clock the learner's code can read, pointed at a case's virtual clock.
"""
from __future__ import annotations

import contextlib
import functools
import threading
import time
import timeit
from typing import Callable, Iterator

import torch
from torch import nn

from distlab.data import digits
from distlab.models import cpu_state, make_mlp
from distlab.measure.timing import SimulatedWorkload, VirtualClock

from ...rank import Replace

STEPS, BATCH, LR, MAX_NORM = 12, 64, 0.1, 0.05  # MAX_NORM: small enough that every step clips
LOSS_TOL = 0.01  # |loss - fp32 reference loss| <= LOSS_TOL * max(1, |reference|), every step (and every window)
MODEL = dict(hidden=64)
# compare's warmup and min_run_time (WARMUP slow calls in the "warmup" case). WARMUP is not median_seconds'
# default (3): a compare that does not pass it on times two slow calls there. MIN_RUN_TIME (on the workloads'
# virtual clock) is neither median_seconds' default nor blocked_autorange's (both 0.2 s): a blind audit's
# blocked_autorange() without it measured its own 0.2 s unseen. The real model, on the real clock, keeps 0.2 s.
WARMUP, MIN_RUN_TIME, REAL_MIN_RUN_TIME = 5, 0.3, 0.2
# Simulated workloads: (baseline kwargs, candidate kwargs); costs in seconds on a virtual clock.
_B = dict(saved_bytes=40_000)  # every workload saves something, so any memory_ratio is defined
# The steady candidate's backward keeps one 100,000-byte storage alive through 2 saved views of a quarter
# of it each (SharedViews): counted per storage 100,000 bytes (ratio 0.25); the storage once per saved
# tensor 200,000 (0.5); each view's own size 50,000 (0.125); one view's size per storage 25,000 (0.0625).
SHARED = dict(storage=100_000, views=2, view=25_000)
# The steady baseline's backward saves three storages of kinds a filter would drop: a float32 input that needs no
# gradient (160,000 bytes), the float32 output of exp (160,000) and an embedding's int64 indices (80,000): 400,000
# in all. Only floating-point tensors counted: 320,000 (ratio 0.3125); only those that require grad: 160,000 (0.625).
MIXED = dict(no_grad=160_000, output=160_000, indices=80_000)


class RecordingSGD(torch.optim.SGD):
    """SGD that calls ``on_step(params)`` at every ``step()``, before stepping."""

    def __init__(self, params, lr: float, on_step) -> None:
        super().__init__(params, lr=lr)
        self.on_step = on_step

    def step(self, closure=None):
        self.on_step([p for g in self.param_groups for p in g["params"]])
        return super().step(closure)


class RecordingScaler(torch.amp.GradScaler):
    """A GradScaler that appends the name of each of its calls (scale, unscale_, step, update) to ``events``:
    the order the learner's step made them in, for the train_step and accumulated_step probes alike."""

    def __init__(self, device: str, events: list[str]) -> None:
        super().__init__(device)
        self.events = events
        self.scaled: list[str] = []  # the dtype of each tensor given to scale() ("float32", "float16")

    def scale(self, outputs):
        self.events.append("scale")
        if isinstance(outputs, torch.Tensor):
            self.scaled.append(str(outputs.dtype).removeprefix("torch."))
        return super().scale(outputs)

    def unscale_(self, optimizer):
        self.events.append("unscale_")
        return super().unscale_(optimizer)

    def step(self, optimizer, *args, **kwargs):
        self.events.append("step")
        return super().step(optimizer, *args, **kwargs)

    def update(self, new_scale=None):
        self.events.append("update")
        return super().update(new_scale)


class MixedSaves(SimulatedWorkload):
    """A workload whose backward saves :data:`MIXED`'s three storages: ``w * x`` saves ``x`` (no gradient), ``exp``
    its output, and ``F.embedding`` its int64 indices (its weight, a view of that output, is not saved)."""

    def __call__(self) -> torch.Tensor:
        super().__call__()  # the cost on the clock (no saved_bytes: nothing saved there)
        n = MIXED["output"] // 4
        w = torch.ones(n, dtype=torch.float32, requires_grad=True)
        z = (w * torch.full((MIXED["no_grad"] // 4,), 0.5)).exp()
        indices = torch.arange(MIXED["indices"] // 8)
        return nn.functional.embedding(indices, z.view(n // 4, 4)).sum()


class SharedViews(SimulatedWorkload):
    """A workload whose backward keeps one float32 storage of ``storage`` bytes alive through ``views``
    saved views of a quarter of it each, none of them the whole: ``y = w * 2`` saves nothing (a product
    with a number), and each ``sin`` saves its input, a view of ``y``."""

    def __init__(self, clock: VirtualClock, seconds: float, *, storage: int, views: int, **kwargs) -> None:
        super().__init__(clock, seconds, **kwargs)
        self.storage, self.n_views = storage, views

    def __call__(self) -> torch.Tensor:
        super().__call__()  # the cost on the clock (no saved_bytes: nothing saved there)
        y = torch.ones(self.storage // 4, dtype=torch.float32, requires_grad=True) * 2
        q = y.numel() // 4
        return sum(y[i * q:(i + 1) * q].sin().sum() for i in range(self.n_views))


_PERF_COUNTER = time.perf_counter  # the real one (this module is imported before any learner file)


class Clocks:
    """The clocks the learner's code can read (``time.perf_counter``, ``monotonic``, ``time``,
    ``process_time`` and their ``_ns`` forms, ``timeit.default_timer`` and ``timeit.Timer``'s default
    timer), read from the virtual clock of :meth:`reading` on the grading thread and from the real
    ones everywhere else.

    ``with clocks.replaced():`` is entered before the learner's file is imported (:class:`Replace`),
    so ``from time import perf_counter``, ``from timeit import default_timer`` or a default argument
    bound at import read the same clock as ``time.perf_counter()``: no legal import style changes
    what is measured. Another thread (the launcher's heartbeat) always reads the real clocks.
    """

    def __init__(self) -> None:
        self.clock: VirtualClock | None = None
        self._thread = threading.get_ident()
        self.read_names: set[str] = set()  # the clocks read on a case's virtual clock ("process_time", ...)
        self.reads: list[float] | None = None  # while a list: the wall time at each reading of any of them
        self.given_sync: Callable[[], None] | None = None  # the sync a case hands compare (:meth:`counted_sync`)
        self.syncs = 0  # the calls of it so far

    def _reader(self, name: str, ns: bool) -> Callable[[Callable], Callable]:
        def make(real: Callable) -> Callable:
            def read():
                clock = self.clock
                if clock is None or threading.get_ident() != self._thread:
                    return real()
                self.read_names.add(name)
                if self.reads is not None:
                    self.reads.append(clock.now)
                return int(clock.read(name) * 1e9) if ns else clock.read(name)
            read.__name__ = getattr(real, "__name__", "clock")
            return read
        return make

    def counted_sync(self, clock: VirtualClock) -> Callable[[], None]:
        """The sync compare is handed for ``clock``'s case: the clock's, counted (whether what compare timed waited
        on it, and whether it was the one passed on)."""
        def sync() -> None:
            self.syncs += 1
            clock.sync()
        self.given_sync = sync
        return sync

    def _timer_init(self, real_init: Callable) -> Callable:
        """``timeit.Timer`` defaults to the ``default_timer`` bound when ``timeit`` was imported."""
        def init(timer_self, stmt="pass", setup="pass", timer=None, globals=None):
            if timer is None or timer is _PERF_COUNTER:  # timeit's default_timer, or timeit.timeit's
                timer = timeit.default_timer                # the stand-in while replaced
            real_init(timer_self, stmt, setup, timer, globals)
        return init

    def replaced(self) -> Replace:
        targets = {(time, n): self._reader(n, False) for n in VirtualClock._NAMES}
        targets.update({(time, n + "_ns"): self._reader(n, True) for n in VirtualClock._NAMES})
        targets[(timeit, "default_timer")] = self._reader("perf_counter", False)
        targets[(timeit.Timer, "__init__")] = self._timer_init
        return Replace(targets)

    @contextlib.contextmanager
    def reading(self, clock: VirtualClock) -> Iterator[VirtualClock]:
        """While the block runs, every clock the learner reads is ``clock``."""
        self.clock = clock
        try:
            yield clock
        finally:
            self.clock = None


CASES = {
    "steady": (dict(seconds=0.020, mixed=True),
               dict(seconds=0.008, storage=SHARED["storage"], views=SHARED["views"])),
    "warmup": (dict(seconds=0.020, **_B), dict(seconds=0.010, slow_calls=WARMUP, slow_seconds=1.0, **_B)),
    "async": (dict(seconds=0.030, asynchronous=True, **_B), dict(seconds=0.012, asynchronous=True, **_B)),
    # an outlier short of min_run_time: a loop that times calls until min_run_time (the contract's other legal
    # style) takes a dozen, and their median is the truth; at 0.2 s the first timed call alone filled the time
    # and one fast call in four in the baseline (a cache hit): the fastest call is no more the answer than the mean
    "outliers": (dict(seconds=0.020, outlier_every=4, outlier_seconds=0.002, **_B),
                 dict(seconds=0.005, outlier_every=4, outlier_seconds=0.050, **_B)),
}
OUTLIERS_FASTEST = 0.002  # the outliers baseline's fastest call, where its median call takes 0.020 s
MEMORY_TRUTH = 0.25
CASES_TRUTH = {
    "steady": (2.5, "time with torch.utils.benchmark.Timer (or perf_counter) and divide baseline by candidate"),
    "warmup": (2.0, f"this workload's first {WARMUP} calls take 1 s each, like a real step's first calls "
                    "(allocator, kernel selection, caches): call fn(); sync() `warmup` times before timing"),
    "async": (2.5, "this workload returns before its work is done, like a CUDA kernel launch: time "
                   "`fn(); sync()` together, not fn() alone"),
    "outliers": (4.0, "one call in four takes 10x longer in the candidate (a noisy neighbour) and a tenth of the "
                      "time in the baseline (a cache hit): report the median per call, not the mean or the fastest"),
}
CASE_TITLES = {"steady": "speedup of a steady workload (direction: baseline / candidate)",
               "warmup": "slow first calls are warmed up", "async": "asynchronous work is synchronised",
               "outliers": "outliers do not drag the result (median)"}


@functools.lru_cache(maxsize=1)
def _data() -> tuple[torch.Tensor, torch.Tensor]:
    return digits(STEPS * BATCH).tensors


def batches(device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    x, y = _data()
    return [(x[i:i + BATCH].to(device), y[i:i + BATCH].to(device)) for i in range(0, STEPS * BATCH, BATCH)]


@functools.lru_cache(maxsize=1)  # the grading process compares every file it grades with it
def reference_fp32() -> tuple[list[float], dict]:
    """The float32 step done here, in one process: losses and final weights (do not modify them)."""
    model = make_mlp(seed=3, **MODEL)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for x, y in batches(torch.device("cpu")):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        opt.step()
        losses.append(loss.item())
    return losses, cpu_state(model)
