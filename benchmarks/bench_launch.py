"""Launch floor, grading cost of exercise 1, and DDP throughput of its model at 1 and 2 ranks.

Target from the foundation issue: grading exercise 1 costs at most 2x the launch floor
per world size it checks (it checks 2 and 4).
"""
from __future__ import annotations

import statistics
import time

import torch

import distlab
from autograder.checks.ex01_ddp import EXERCISE, MODEL, WORLD_SIZES
from autograder.runner import REPO_ROOT, grade_one
from benchmarks import Row
from distlab.models import make_mlp

REPEATS = 3


def ddp_throughput(batch_size: int = 256, repeats: int = 5) -> float:
    """Samples/s of DDP training on exercise 1's MLP, all ranks counted: the median of ``repeats``
    windows, each measured by exercise 6's reference ``measure_throughput`` (warm-up, barriers)."""
    from solutions.ex06_scaling import make_ddp_step, measure_throughput

    dev = distlab.init_distributed()
    model = make_mlp(seed=0, **MODEL).to(dev)
    x, y = torch.randn(batch_size, 64, device=dev), torch.randint(0, 10, (batch_size,), device=dev)
    step = make_ddp_step(model, x, y, lr=0.1)
    rates = [measure_throughput(step, batch_size, warmup=5, iters=30) for _ in range(repeats)]
    distlab.shutdown()
    return statistics.median(rates)


def rows() -> list[Row]:
    floors = {w: statistics.median(distlab.torchrun("distlab.examples:noop", w, timeout=120).wall_s
                                   for _ in range(REPEATS)) for w in WORLD_SIZES}
    start = time.perf_counter()
    report = grade_one(EXERCISE, REPO_ROOT / "solutions")
    grading = time.perf_counter() - start
    assert report.passed, report.feedback  # a fast grade of a wrong answer would mean nothing
    out = [Row("launch", f"torchrun of {w} ranks doing nothing (median of {REPEATS})", floors[w], "s",
               "the floor every check pays") for w in WORLD_SIZES]
    budget = 2 * sum(floors.values())
    out.append(Row("grading", "grade exercise 1 (solution, W=2 and W=4)", grading, "s",
                   f"target <= 2x floors = {budget:.1f} s: {'met' if grading <= budget else 'NOT met'}"))
    rates = {w: distlab.torchrun(ddp_throughput, w, timeout=300).results[0] for w in (1, 2)}
    for w, r in rates.items():
        out.append(Row("ddp", f"DDP throughput, exercise MLP, batch 256/rank, {w} rank(s)", r, "samples/s",
                       "median of 5 windows between barriers (exercise 6's method)"))
    out.append(Row("ddp", "scaling efficiency 1 -> 2 ranks", rates[2] / (2 * rates[1]), "x of linear",
                   "CPU ranks share 2 cores and memory bandwidth here: not what GPUs show"))
    return out
