"""Launch floor, grading cost of exercise 1, and DDP throughput of its model at 1 and 2 ranks.

Target from the foundation issue: grading exercise 1 costs at most 2x the launch floor
per world size it checks (it checks 2 and 4).
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import distlab
from autograder.checks.ex01_ddp import EXERCISE, MODEL, WORLD_SIZES
from autograder.runner import grade_one
from benchmarks import Row
from distlab.models import make_mlp

REPEATS = 3


def ddp_throughput(batch_size: int = 256, warmup: int = 5, steps: int = 30, repeats: int = 5) -> float:
    """Samples/s of DDP training on the exercise's MLP, all ranks counted.

    Each repeat times ``steps`` steps between two barriers after ``warmup`` untimed steps;
    the slowest rank's time counts (all_reduce MAX), and the median over repeats is returned.
    """
    distlab.init_distributed()
    world = dist.get_world_size()
    model = DDP(make_mlp(seed=0, **MODEL))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(batch_size, 64), torch.randint(0, 10, (batch_size,))

    def step():
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    for _ in range(warmup):
        step()
    rates = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(steps):
            step()
        dist.barrier()
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        rates.append(world * batch_size * steps / elapsed.item())
    distlab.shutdown()
    return statistics.median(rates)


def rows() -> list[Row]:
    floors = {w: statistics.median(distlab.torchrun("distlab.examples:noop", w, timeout=120).wall_s
                                   for _ in range(REPEATS)) for w in WORLD_SIZES}
    start = time.perf_counter()
    report = grade_one(EXERCISE, _solutions_dir())
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
                       "median of 5 timed windows, slowest rank"))
    out.append(Row("ddp", "scaling efficiency 1 -> 2 ranks", rates[2] / (2 * rates[1]), "x of linear",
                   "CPU ranks share 2 cores and memory bandwidth here: not what GPUs show"))
    return out


def _solutions_dir():
    from autograder.runner import REPO_ROOT

    return REPO_ROOT / "solutions"
