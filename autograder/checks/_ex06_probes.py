"""Rank-side instruments of the exercise 6 check: the synthetic step whose timing the grader knows,
and the learner's benchmark run on the real model.

Everything here observes; the verdicts, and the truth from the recorded step times, are computed in
``ex06_scaling``.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import distlab
from distlab.models import cpu_state, make_mlp

from ..harness import CapturedPrints, echo, load_learner

SYNTH = dict(batch_size=32, warmup=2, iters=8)
STEP_S, WARMUP_STEP_S, SLOWER_PER_RANK = 0.03, 0.1, 0.5
TOL = 0.10  # the grader's tolerance on the figure: these step times move each mistake's far outside it
CLOCKS = ("perf_counter", "perf_counter_ns", "time", "time_ns", "monotonic", "monotonic_ns", "process_time",
          "process_time_ns", "thread_time", "thread_time_ns")
COLLECTIVES = ("barrier", "all_reduce", "broadcast", "all_gather", "all_gather_object", "reduce", "gather")
_clock = time.perf_counter  # the grader's own clock: the learner's reads of time.* are spied on


class SyntheticStep:
    """A step that sleeps for a known time and records when it ran."""

    def __init__(self, rank: int, warmup: int):
        self.rank, self.warmup, self.times = rank, warmup, []

    def __call__(self) -> None:
        start = _clock()
        slow = len(self.times) < self.warmup
        time.sleep(WARMUP_STEP_S if slow else STEP_S * (1 + SLOWER_PER_RANK * self.rank))
        self.times.append((start, _clock()))


class MethodSpy:
    """While ``measure_throughput`` runs: each clock it read (``time.*``) and collective it called, from
    the learner's file, in order, with the number of steps done at that moment (an all_reduce's op too)."""

    def __init__(self, step: SyntheticStep, path: str):
        self.step, self.path, self.events = step, str(Path(path).resolve()), []

    def __enter__(self):
        self._saved = [(time, n, getattr(time, n)) for n in CLOCKS] + [(dist, n, getattr(dist, n)) for n in COLLECTIVES]
        for module, name, real in self._saved:
            setattr(module, name, self._spy(module is time, name, real))
        return self

    def __exit__(self, *exc):
        for module, name, real in self._saved:
            setattr(module, name, real)
        return False

    def _spy(self, clock: bool, name: str, real):
        def spy(*args, **kwargs):
            if str(Path(sys._getframe(1).f_code.co_filename).resolve()) == self.path:
                event = {"kind": "clock" if clock else "collective", "name": name, "steps": len(self.step.times)}
                if name == "all_reduce":
                    op = kwargs.get("op", args[1] if len(args) > 1 else dist.ReduceOp.SUM)
                    event["op"] = str(getattr(op, "name", op)).split(".")[-1]
                self.events.append(event)
            return real(*args, **kwargs)
        return spy


class DDPSpy:
    """While the real step is built and timed: how many DistributedDataParallel wrappers were made, and how
    many forwards went through one (a step that calls ``ddp.module(x)`` bypasses DDP's gradient sync)."""

    def __enter__(self):
        self.wrapped = self.forwards = 0
        self._init, self._forward = DistributedDataParallel.__init__, DistributedDataParallel.forward
        spy = self

        def init(ddp, *args, **kwargs):
            spy.wrapped += 1
            spy._init(ddp, *args, **kwargs)

        def forward(ddp, *args, **kwargs):
            spy.forwards += 1
            return spy._forward(ddp, *args, **kwargs)

        DistributedDataParallel.__init__, DistributedDataParallel.forward = init, forward
        return self

    def __exit__(self, *exc):
        DistributedDataParallel.__init__, DistributedDataParallel.forward = self._init, self._forward
        return False


def _guard(fn, *args, **kwargs):
    """(result, None) or (None, "Type: message"): a part that raises costs only its own marks."""
    try:
        return fn(*args, **kwargs), None
    except Exception as exc:  # noqa: BLE001 - reported to the learner
        return None, f"{type(exc).__name__}: {str(exc).strip()[:300]}"


def rank_main(paths: list[str], so_far: list[dict], out_dirs: list[str], final: bool, real: dict) -> list[dict]:
    """Runs on every rank: the synthetic method check, then the real benchmark, for each file.

    ``so_far[i]``: file i's real figures at the earlier world sizes; in the ``final`` launch rank 0
    adds this one's and hands them to the learner's efficiency and results functions.
    """
    dev = distlab.init_distributed()  # the grader owns the process group: the learner's code never makes one
    rank, observed = dist.get_rank(), []
    for i, path in enumerate(paths):
        learner = load_learner(path)
        obs = _observe_method(learner, rank, path)
        obs.update(_observe_real(learner, rank, dev, real))
        if final and rank == 0 and "real" in obs:
            figures = {**{int(k): float(v) for k, v in so_far[i].items()}, dist.get_world_size(): obs["real"]}
            obs.update(_observe_results(learner, figures, out_dirs[i]))
        observed.append(obs)
    distlab.shutdown()
    return observed


def _observe_method(learner, rank: int, path: str) -> dict:
    step = SyntheticStep(rank, SYNTH["warmup"])
    dist.barrier()
    with CapturedPrints() as out, MethodSpy(step, path) as spy:
        reported = learner.measure_throughput(step, SYNTH["batch_size"], warmup=SYNTH["warmup"],
                                              iters=SYNTH["iters"])
    echo(out.lines)
    return {"rank": rank, "backend": dist.get_backend(), "reported": float(reported),
            "times": torch.tensor(step.times, dtype=torch.float64), "method": spy.events}


def _observe_real(learner, rank: int, dev: torch.device, real: dict) -> dict:
    """The learner's step and benchmark on the real model; a step that raises costs only its own marks."""
    # A different start on every rank, so a step without DDP ends with ranks apart.
    model = make_mlp(seed=1000 + rank, hidden=real["hidden"]).to(dev)
    obs = {"initial": cpu_state(model)}
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(real["batch_size"], 64, generator=gen).to(dev)
    y = torch.randint(0, 10, (real["batch_size"],), generator=gen).to(dev)
    dist.barrier()
    with DDPSpy() as ddp:
        step, obs["step_error"] = _guard(learner.make_ddp_step, model, x, y, lr=real["lr"])
        if step is not None:
            with CapturedPrints():
                obs["real"] = float(learner.measure_throughput(step, real["batch_size"], warmup=real["warmup"],
                                                               iters=real["iters"]))
    obs.update(final=cpu_state(model), ddp_wrapped=ddp.wrapped, ddp_forwards=ddp.forwards)
    return obs


def _observe_results(learner, throughput: dict[int, float], out_dir: str) -> dict:
    """Rank 0, last launch: the learner's efficiency of every figure, and the files it writes."""
    obs = {"throughput": throughput}
    eff, obs["efficiency_error"] = _guard(learner.scaling_efficiency, dict(throughput))
    obs["efficiency"] = {int(k): float(v) for k, v in eff.items()} if isinstance(eff, dict) else None
    if obs["efficiency"] is not None:
        files, obs["files_error"] = _guard(learner.write_results, dict(throughput), dict(eff), out_dir)
        obs["files"] = {str(k): str(v) for k, v in files.items()} if isinstance(files, dict) else None
    return obs
