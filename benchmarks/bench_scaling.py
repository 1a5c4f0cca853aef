"""DDP scaling of the reference solution at 1, 2, 4 workers, and all-reduce bus bandwidth.

Two configurations of the course MLP, timed with the reference ``measure_throughput``
(warm-up, barriers at both ends of the window, samples of every rank):

* compute-heavy: width 512, batch 512 per worker: much arithmetic per byte of gradient;
* communication-heavy: width 1024, batch 8 per worker: ~2 M parameters (8 MiB of
  gradients) all-reduced for very little arithmetic.

Efficiency is throughput(W) / (W x throughput(1)). All-reduce bus bandwidth is
``bytes x 2(n-1)/n / time`` (nccl-tests' definition): the median of 3 blocks of 5 all-reduces,
each block timed on the slowest rank; gloo on the CPU
(NCCL on GPUs: the backend is picked from the hardware). On a machine with fewer
cores than workers the figures measure core contention as much as DDP.
"""
from __future__ import annotations

import torch.distributed as dist

import distlab
from distlab import torchrun
from distlab.lab.bandwidth import allreduce_bandwidth
from distlab.data import seeded_batch
from distlab.models import make_mlp
from distlab.measure.timing import cpu_cores
from solutions.ex06_scaling import make_ddp_step, measure_throughput

from . import Row

WORLD_SIZES = (1, 2, 4)
CONFIGS = {"compute-heavy": dict(hidden=512, batch=512), "communication-heavy": dict(hidden=1024, batch=8)}
SIZES = (4 << 10, 256 << 10, 4 << 20, 32 << 20)


def rank_main() -> dict:
    dev = distlab.init_distributed()
    out = {}
    for name, cfg in CONFIGS.items():
        model = make_mlp(seed=0, hidden=cfg["hidden"], depth=3).to(dev)
        x, y = seeded_batch(cfg["batch"], 64, 10, seed=dist.get_rank(), device=dev)
        step = make_ddp_step(model, x, y, lr=0.01)
        out[name] = measure_throughput(step, cfg["batch"], warmup=5, iters=30)
    if dist.get_world_size() > 1:
        out["busbw"] = allreduce_bandwidth(list(SIZES), device=dev)
    distlab.shutdown()
    return out


def rows() -> list[Row]:
    cores = cpu_cores()
    runs = {w: torchrun(rank_main, w, timeout=300) for w in WORLD_SIZES}
    out = []
    for name in CONFIGS:
        base = runs[1].results[0][name]
        for w in WORLD_SIZES:
            t = runs[w].results[0][name]
            over = f"; {w} workers on {cores} cores: oversubscribed" if w > cores and runs[w].backend == "gloo" else ""
            out.append(Row("scaling", f"DDP {name}, {w} worker(s)", t, "samples/s",
                           f"efficiency {t / (w * base):.0%} ({runs[w].backend}{over})"))
    for w in WORLD_SIZES[1:]:
        for r in runs[w].results[0]["busbw"]:
            out.append(Row("scaling", f"all-reduce busbw {r['bytes'] >> 10} KiB, {w} ranks", r["busbw"] / 1e9,
                           "GB/s", f"{runs[w].backend}, median {r['time_s'] * 1e3:.2f} ms, busbw = algbw x 2(n-1)/n"))
    return out
