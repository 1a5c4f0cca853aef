"""Rank-side instruments of the exercise 6 check: the synthetic step whose timing the grader knows,
and the learner's benchmark run on the real model.

Everything here observes; the verdicts, and the truth from the recorded step times, are computed in
``ex06_scaling``.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

import distlab
from distlab.models import cpu_state, make_mlp

from ..harness import CapturedPrints, echo, load_learner

SYNTH = dict(batch_size=32, warmup=2, iters=8)
STEP_S, WARMUP_STEP_S, SLOWER_PER_RANK = 0.03, 0.1, 0.5


class SyntheticStep:
    """A step that sleeps for a known time and records when it ran."""

    def __init__(self, rank: int, warmup: int):
        self.rank, self.warmup, self.times = rank, warmup, []

    def __call__(self) -> None:
        start = time.perf_counter()
        slow = len(self.times) < self.warmup
        time.sleep(WARMUP_STEP_S if slow else STEP_S * (1 + SLOWER_PER_RANK * self.rank))
        self.times.append((start, time.perf_counter()))


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
        obs = _observe_method(learner, rank)
        obs.update(_observe_real(learner, rank, dev, real))
        if final and rank == 0 and "real" in obs:
            figures = {**{int(k): float(v) for k, v in so_far[i].items()}, dist.get_world_size(): obs["real"]}
            obs.update(_observe_results(learner, figures, out_dirs[i]))
        observed.append(obs)
    distlab.shutdown()
    return observed


def _observe_method(learner, rank: int) -> dict:
    step = SyntheticStep(rank, SYNTH["warmup"])
    dist.barrier()
    with CapturedPrints() as out:
        reported = learner.measure_throughput(step, SYNTH["batch_size"], warmup=SYNTH["warmup"],
                                              iters=SYNTH["iters"])
    echo(out.lines)
    return {"rank": rank, "backend": dist.get_backend(), "reported": float(reported),
            "times": torch.tensor(step.times, dtype=torch.float64)}


def _observe_real(learner, rank: int, dev: torch.device, real: dict) -> dict:
    """The learner's step and benchmark on the real model; a step that raises costs only its own marks."""
    # A different start on every rank, so a step without DDP ends with ranks apart.
    model = make_mlp(seed=1000 + rank, hidden=real["hidden"]).to(dev)
    obs = {"initial": cpu_state(model)}
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(real["batch_size"], 64, generator=gen).to(dev)
    y = torch.randint(0, 10, (real["batch_size"],), generator=gen).to(dev)
    dist.barrier()
    step, obs["step_error"] = _guard(learner.make_ddp_step, model, x, y, lr=real["lr"])
    if step is not None:
        with CapturedPrints():
            obs["real"] = float(learner.measure_throughput(step, real["batch_size"], warmup=real["warmup"],
                                                           iters=real["iters"]))
    obs["final"] = cpu_state(model)
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
