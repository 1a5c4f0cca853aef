"""Rank-side instruments of the exercise 6 check: the synthetic step whose timing the grader knows,
the learner's benchmark run on the real model, and its α-β fit and prediction on the grader's cases.

Everything here observes; the verdicts, and the truth from the recorded step times, are computed in
``ex06_scaling``. The instruments that replace library functions (the clocks and collectives of
:class:`MethodSpy`, DDP's constructor, forward and comm-hook registration in :class:`~autograder.rank.DDPSpy`) are
entered before the learner's file is imported (:class:`~autograder.rank.Replace`), so ``from time
import perf_counter`` or ``from torch.distributed import barrier`` are seen as ``time.perf_counter()``
and ``dist.barrier()`` are; they record only while a run is watched.
"""
from __future__ import annotations

import contextlib
import copy
import inspect
import linecache
import sys
import time
import timeit
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.optim.optimizer import register_optimizer_step_pre_hook

import distlab
from distlab.models import cpu_state, make_mlp

from ...rank import CapturedPrints, DDPSpy, Replace, attempt, echo, load_learner, raised_at
from ...rank.parts import Parts
from .alphabeta.observations import Fit, ModelObservation, Number, Prediction
from .alphabeta.reference import CASES, DATASETS
from .observations import REAL_FIELDS, SYNTH, MethodEvent, RankObservation, real_batch

# Rank r's timed steps take STEP_S * (1 + SLOWER_PER_RANK * r); the warm-up steps WARMUP_STEP_S, except
# rank LATE_RANK's, LATE_WARMUP_S: that rank arrives at the timed steps last (a missing barrier before
# the clock starts shows), and rank 0 is neither the last to start nor the last to finish.
STEP_S, WARMUP_STEP_S, SLOWER_PER_RANK = 0.03, 0.1, 0.5
LATE_RANK, LATE_WARMUP_S = 1, 0.15
TOL = 0.10  # the grader's tolerance on the figure: these step times move each mistake's far outside it
CLOCKS = [(time, n) for n in ("perf_counter", "perf_counter_ns", "time", "time_ns", "monotonic", "monotonic_ns",
                              "process_time", "process_time_ns", "thread_time", "thread_time_ns")]
CLOCKS.append((timeit, "default_timer"))  # time.perf_counter itself: the spy records it under that name
# distributed_c10d's names too: torch's functions call each other by them, but the spy records a call only
# from the learner's file.
COLLECTIVES = [(module, n) for module in (dist, c10d)
               for n in ("barrier", "all_reduce", "broadcast", "all_gather", "all_gather_object", "reduce", "gather")]
_clock = time.perf_counter  # the grader's own clock: the learner's reads of time.* are spied on


class SyntheticStep:
    """A step that sleeps for a known time and records when it ran.

    A sleep that overran (a loaded machine wakes the rank late) is made up in the rank's next step,
    so that a rank's steps take their durations *in sum* however busy the cores are: the ranks keep
    their order, and each mistake its factor."""

    def __init__(self, rank: int, warmup: int):
        self.rank, self.warmup, self.times = rank, warmup, []
        self.active = False  # never inside a learner's step (MethodSpy's events say so)
        self._overran = 0.0

    @property
    def calls(self) -> int:
        return len(self.times)

    def __call__(self) -> None:
        start = _clock()
        if len(self.times) < self.warmup:
            cost = LATE_WARMUP_S if self.rank == LATE_RANK else WARMUP_STEP_S
        else:
            cost = STEP_S * (1 + SLOWER_PER_RANK * self.rank)
        deadline = start + max(0.0, cost - self._overran)
        if (left := deadline - _clock()) > 0:
            time.sleep(left)
        end = _clock()
        self._overran = end - deadline
        self.times.append((start, end))


class CountedStep:
    """The learner's real step, counted: how many calls, and whether one is running."""

    def __init__(self, step):
        self.step, self.calls, self.active = step, 0, False

    def __call__(self):
        self.calls += 1
        self.active = True
        try:
            return self.step()
        finally:
            self.active = False


class MethodSpy(Replace):
    """While a run is watched: each clock the learner's file read and collective it called, in order, with
    the number of steps done at that moment, whether a step was running (an all_reduce's op too), and the
    grader's clock just before and just after the call (``before``, ``after``: the learner's reading lies
    between them, so its window is known however late a loaded machine ran the rank)."""

    def __init__(self, path: str):
        self.path, self.events, self.counter = str(Path(path).resolve()), [], None
        super().__init__({**{t: self._spy("clock", t[1]) for t in CLOCKS},
                          **{t: self._spy("collective", t[1]) for t in COLLECTIVES}})

    @contextlib.contextmanager
    def watching(self, counter):
        """Record the learner's calls, counted against ``counter`` (a SyntheticStep or CountedStep)."""
        self.events, self.counter = [], counter
        try:
            yield self.events
        finally:
            self.counter = None

    def _spy(self, kind: str, name: str):
        name = "perf_counter" if name == "default_timer" else name  # timeit's is time.perf_counter

        def make(real):
            def spy(*args, **kwargs):
                counter = self.counter
                if counter is None or str(Path(sys._getframe(1).f_code.co_filename).resolve()) != self.path:
                    return real(*args, **kwargs)
                event = MethodEvent(kind=kind, name=name, steps=counter.calls, in_step=counter.active)
                if name == "all_reduce":
                    op = kwargs.get("op", args[1] if len(args) > 1 else dist.ReduceOp.SUM)
                    event.op = str(getattr(op, "name", op)).split(".")[-1]
                self.events.append(event)
                event.before = _clock()  # the learner's reading lies between these two of the grader's
                try:
                    return real(*args, **kwargs)
                finally:
                    event.after = _clock()
            return spy
        return make


def rank_main(paths: list[str], real: dict, parts: list[str], outdir: str, skip: dict[str, list[str]]) -> list[dict]:
    """Runs on every rank, for each file, the ``parts`` that ``skip`` does not name (``rank.parts``: each kept as
    it returns, so that one that ends the launch costs its own marks only): ``"model"`` (the first launch),
    rank 0's run of the learner's α-β fit and prediction on the grader's cases (pure functions: first, and never
    in the grading process; ``None`` on the other ranks); ``"method"``, the synthetic method check; ``"real"``,
    the real benchmark (its fields of :class:`RankObservation`, :data:`REAL_FIELDS`). Returns per file
    ``{part: plain data}``."""
    dev = distlab.init_distributed()  # the grader owns the process group: the learner's code never makes one
    rank, observed = dist.get_rank(), []
    for i, path in enumerate(paths):
        kept = Parts(outdir, i, skip)
        with MethodSpy(path) as spy, DDPSpy() as ddp:  # before the import: names it binds are spied on too
            learner = load_learner(path)
            if "model" in parts and kept.starts("model"):
                kept.keep("model", _observe_model(learner, path).to_wire() if rank == 0 else None)
            if kept.starts("method"):
                kept.keep("method", _observe_method(learner, rank, spy).to_wire())
            if kept.starts("real"):
                obs = RankObservation(rank=rank, backend=dist.get_backend(), reported=None, returned=0.0,
                                      times=torch.empty(0, 2, dtype=torch.float64))
                # "method" skipped where "real" runs: measure_throughput ended an earlier launch of this file at
                # this world size (a hang, a crash), so the grader's loop drives the real step, which make_ddp_step's
                # criteria judge, rather than a second wait on the same measure_throughput
                _observe_real(learner, obs, dev, real, spy, ddp, driven="method" in kept.skip)
                kept.keep("real", {k: v for k, v in obs.to_wire().items() if k in REAL_FIELDS})
        kept.finished()
        observed.append(kept.ran)
    distlab.shutdown()
    return observed


def _observe_method(learner, rank: int, spy: MethodSpy) -> RankObservation:
    step = SyntheticStep(rank, SYNTH["warmup"])
    dist.barrier()
    with CapturedPrints() as out, spy.watching(step) as events:
        reported = learner.measure_throughput(step, SYNTH["batch_size"], warmup=SYNTH["warmup"],
                                              iters=SYNTH["iters"])
        returned = _clock()  # no correct window ends later than this (on this rank)
    echo(out.lines)
    return RankObservation(rank=rank, backend=dist.get_backend(), reported=_figure(reported), returned=returned,
                           times=torch.tensor(step.times, dtype=torch.float64), method=events,
                           reported_type="" if reported is None or isinstance(reported, (float, int)) else
                           type(reported).__name__)  # numpy's float64 is a float


def _observe_real(learner, obs: RankObservation, dev: torch.device, real: dict, spy: MethodSpy, ddp: DDPSpy,
                  driven: bool = False) -> None:
    """The learner's step and benchmark on the real model, in ``obs``; a step that raises costs only its own marks.
    ``driven``: the grader's loop calls the step ``warmup + iters`` times, in place of ``measure_throughput``.

    Besides the figure: the DDP wrappers built (in ``make_ddp_step``, and during steps), DDP's gradient
    all-reduce rounds, the step() calls, and the learner's clock reads and collectives, each with the
    steps done at that moment (``real_method``): what the synthetic step cannot show, or a learner fake.
    """
    # A different start on every rank, so a step without DDP ends with ranks apart.
    rank = obs.rank
    model = make_mlp(seed=1000 + rank, hidden=real["hidden"]).to(dev)
    obs.initial = cpu_state(model)
    x, y = (t.to(dev) for t in real_batch(rank, real["batch_size"]))
    dist.barrier()
    wrapped, ddp.rounds, ddp.built_in_step = ddp.wrapped, 0, 0
    step, exc = attempt(learner.make_ddp_step, model, x, y, lr=real["lr"])  # raised: costs only its own marks
    obs.step_error = raised_at(exc, learner.__file__)
    built = ddp.wrapped - wrapped
    if step is not None:
        counted = ddp.counter = CountedStep(step)
        obs.opt_steps = obs.opt_steps_without_grad = 0  # every optimizer step, and those with no gradient

        def before_step(opt, args, kwargs) -> None:
            obs.opt_steps += 1
            if obs.opt_lr is None:
                obs.opt_lr = float(opt.param_groups[0].get("lr", float("nan")))
                obs.opt_other = _beyond_sgd(opt)
            obs.opt_steps_without_grad += all(p.grad is None or not bool(p.grad.any())
                                              for group in opt.param_groups for p in group["params"])

        hook = register_optimizer_step_pre_hook(before_step)
        try:
            with CapturedPrints(), spy.watching(counted) as events:
                figure = None
                if driven:
                    for _ in range(real["warmup"] + real["iters"]):
                        counted()
                else:
                    figure = _figure(learner.measure_throughput(counted, real["batch_size"], warmup=real["warmup"],
                                                                iters=real["iters"]))
            obs.real, obs.driven = figure, driven  # None: the synthetic run's criterion says so
        finally:
            hook.remove()
        ddp.counter = None
        obs.real_method, obs.real_steps = events, counted.calls
    obs.final, obs.ddp_wrapped, obs.ddp_forwards = cpu_state(model), ddp.wrapped - wrapped, ddp.forwards
    obs.ddp_built_in_make, obs.ddp_built_in_step, obs.ddp_rounds = built, ddp.built_in_step, ddp.rounds


def _beyond_sgd(opt) -> str:
    """What ``opt`` is beyond the contract's ``SGD(lr=lr)``: another optimizer's name, or SGD's settings that are
    not its defaults ("momentum=0.9"); "" where it is plain SGD."""
    if type(opt) is not torch.optim.SGD:
        return type(opt).__name__
    group, plain = opt.param_groups[0], {"momentum": 0, "dampening": 0, "weight_decay": 0, "nesterov": False}
    return ", ".join(f"{k}={group.get(k)}" for k, v in plain.items() if group.get(k, v) != v)


def _figure(value) -> float | None:
    """The samples/s ``measure_throughput`` returned, as a float; ``None`` where it returned nothing (a
    dropped ``return``: its own cause, not a ``TypeError`` of the grader's that stops the launch)."""
    return None if value is None else float(value)


def _pair(value) -> tuple[float, float] | None:
    if value is None:
        return None
    alpha, beta = value  # a tuple, a list, a tensor of two: what unpacks into two numbers
    return float(alpha), float(beta)


def numbers_by_line(fn, path: str, kwargs: dict) -> tuple[object, list[Number]]:
    """``fn(**kwargs)``, and each number a line of it assigned to a local (or returned), in order: where a
    wrong prediction first leaves the model's quantities, the grader names that line. The learner's own code
    object is traced: under ``rank.trace`` their function is wrapped (``functools.wraps``, unwrapped here)."""
    code, numbers, last, where = getattr(inspect.unwrap(fn), "__code__", None), [], dict(kwargs), [None]

    def local(frame, event, arg):
        if event not in ("line", "return") or len(numbers) > 50:
            return local
        made = {n: v for n, v in frame.f_locals.items() if type(v) in (int, float) and last.get(n) != v}
        if event == "return" and type(arg) in (int, float):
            made["return"] = arg
        for name, value in made.items():
            line = where[0] if name != "return" else frame.f_lineno
            if line is not None:
                numbers.append(Number(file=Path(path).name, line=line, name=name, value=float(value),
                                      code=linecache.getline(frame.f_code.co_filename, line).strip()))
        last.update(made)
        where[0] = frame.f_lineno
        return local

    previous = sys.gettrace()
    sys.settrace(lambda frame, event, arg: local if frame.f_code is code else None)
    try:
        return fn(**kwargs), numbers
    finally:
        sys.settrace(previous)


def _observe_model(learner, path: str) -> ModelObservation:
    """The learner's ``(alpha, beta)`` for each synthetic set of all-reduce times (``DATASETS``), and its
    efficiency for each of ``CASES`` with the numbers each of its lines made; an error where it raised,
    at the learner's line."""
    def fitted(data: dict) -> Fit:
        got, exc = attempt(lambda: _pair(learner.fit_alpha_beta(copy.deepcopy(data["rows"]))))
        return Fit(value=got, error=raised_at(exc, path))

    def predicted(case: dict) -> Prediction:
        def call() -> tuple[float | None, list[Number]]:
            value, numbers = numbers_by_line(learner.predict_efficiency, path, dict(case))
            return (None if value is None else float(value)), numbers
        got, exc = attempt(call)
        value, numbers = got or (None, [])
        return Prediction(value=value, error=raised_at(exc, path), numbers=numbers)

    with CapturedPrints():
        return ModelObservation(fits=[fitted(d) for d in DATASETS], predictions=[predicted(c) for c in CASES])
