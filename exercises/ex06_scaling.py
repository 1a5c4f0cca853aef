"""Exercise 6: benchmark how DistributedDataParallel scales with the number of workers.

Adding workers should multiply the samples trained per second; how close it
comes to W times one worker is the *scaling efficiency*. Measuring it is easy
to get wrong, and a wrong method gives a confident wrong number. Write:

1. ``measure_throughput``: the global training throughput in samples per
   second, counting the samples of *every* rank, excluding warm-up steps, and
   timing a window in which *all* ranks did their steps (``dist.barrier()`` at
   both ends; on a GPU also ``torch.cuda.synchronize()``, since CUDA calls
   return before the work is done).
2. ``make_ddp_step``: one training step of a model wrapped in DDP, as a
   function of no arguments that ``measure_throughput`` can call.
3. ``scaling_efficiency``: throughput at W workers over W times the
   throughput of one worker.
4. ``write_results``: the figures as JSON and as a plot.

``run_scaling`` (given) launches your benchmark at 1, 2 and 4 workers. The
grader first runs ``measure_throughput`` on a synthetic step whose duration
it controls and compares your figure with the truth, then runs your
benchmark on the real model and shows you the figures. Check your work
from the repository's root with ``make grade`` (every exercise) or
``.venv/bin/python -m autograder --exercise 6`` (this one), or with
``check(6)`` in the notebook ``course/06_launching``.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import distlab
from distlab.models import make_mlp


def measure_throughput(step: Callable[[], None], batch_size: int, *, warmup: int, iters: int) -> float:
    """Global samples per second of ``step``, measured on every rank of the initialised process group.

    Contract (the grader checks the figure against the truth at 1, 2 and 4 ranks):

    * ``step()`` trains on ``batch_size`` samples of this rank's data; every
      rank calls it ``warmup + iters`` times in all.
    * The first ``warmup`` calls are not timed (the first steps are slow:
      allocations, caches, kernel selection, DDP's first-iteration bookkeeping).
    * The timed window starts when every rank has finished its warm-up and ends
      when every rank has finished its last step.
    * Throughput counts the samples of all ranks: ``world_size * batch_size * iters``
      divided by the window's length in seconds.
    * Return the same figure (a float) on every rank.
    """
    # YOUR CODE HERE
    raise NotImplementedError


def make_ddp_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, lr: float) -> Callable[[], None]:
    """A no-argument function doing one DDP training step on ``(x, y)`` (this rank's batch).

    Wrap ``model`` (already on this rank's device) in ``DistributedDataParallel``,
    optimise it with ``torch.optim.SGD(lr=lr)`` on the mean cross-entropy; each call
    of the returned function is one forward, backward (gradients all-reduced) and step.
    """
    # YOUR CODE HERE
    raise NotImplementedError


def scaling_efficiency(throughput: dict[int, float]) -> dict[int, float]:
    """``{W: throughput[W] / (W * throughput[1])}`` for every W in ``throughput`` (which has W=1)."""
    # YOUR CODE HERE
    raise NotImplementedError


def write_results(throughput: dict[int, float], efficiency: dict[int, float], out_dir: str | Path) -> dict:
    """Write ``scaling.json`` and ``scaling.png`` into ``out_dir``; return ``{"json": path, "plot": path}``.

    The JSON is ``{"throughput": {"1": ..., "2": ...}, "efficiency": {"1": ..., ...}}``
    (world sizes as string keys, samples/s and fractions as numbers). The plot
    shows the measured throughput against linear scaling from one worker.
    """
    # YOUR CODE HERE
    raise NotImplementedError


def bench_rank(*, batch_size: int = 128, hidden: int = 256, warmup: int = 5, iters: int = 30) -> float:
    """One worker of the benchmark (given): the digits MLP on random data, timed with your code."""
    device = distlab.init_distributed()
    torch.manual_seed(dist.get_rank())
    model = make_mlp(seed=0, hidden=hidden).to(device)
    x = torch.randn(batch_size, 64, device=device)
    y = torch.randint(0, 10, (batch_size,), device=device)
    figure = measure_throughput(make_ddp_step(model, x, y, lr=0.01), batch_size, warmup=warmup, iters=iters)
    distlab.shutdown()
    return figure


def run_scaling(world_sizes=(1, 2, 4), out_dir: str | Path = "scaling-results") -> dict:
    """Launch ``bench_rank`` at each world size, then write the JSON and the plot (given)."""
    throughput = {}
    for w in world_sizes:
        throughput[w] = distlab.torchrun(f"{__file__}:bench_rank", w, timeout=120).results[0]
        print(f"{w} worker(s): {throughput[w]:,.0f} samples/s")
    return write_results(throughput, scaling_efficiency(throughput), out_dir)
