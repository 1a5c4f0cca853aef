"""Exercise 6, written independently of the reference: each rank times its own window between two
barriers and the slowest one wins (an in-place MAX all-reduce), clocks and collectives imported by
name, the optimizer built before the wrapper, DDP's all-reduce hook registered by hand, the α-β fit by
the weighted normal equations in plain Python, and the prediction as forward + max(backward, all-reduce).
Graded by tests/exercises/test_ex06_scaling.py."""
from __future__ import annotations

from time import perf_counter
from typing import Callable

import torch
from torch import nn
from torch.distributed import ReduceOp, all_reduce, barrier, get_world_size
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

import distlab
from distlab.models import make_mlp


def _sync_device() -> None:
    if torch.cuda.is_available() and distlab.device().type == "cuda":
        torch.cuda.synchronize()


def measure_throughput(step: Callable[[], None], batch_size: int, *, warmup: int, iters: int) -> float:
    """Global samples per second of ``step`` over the iters steps after the warm-up, on every rank."""
    done = 0
    while done < warmup:
        step()
        done += 1
    _sync_device()
    barrier()
    began = perf_counter()
    for _ in range(iters):
        step()
    _sync_device()
    barrier()
    window = torch.tensor([perf_counter() - began], dtype=torch.float64, device=distlab.device())
    all_reduce(window, op=ReduceOp.MAX)  # the slowest rank's window, the same on every rank
    samples = batch_size * iters * get_world_size()
    print(f"timed {iters} steps in {window.item():.4f} s")
    return samples / float(window)


def make_ddp_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, lr: float) -> Callable[[], None]:
    """One DDP training step on ``(x, y)`` as a function of no arguments."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)  # DDP keeps the very same parameters
    ids = [x.device.index] if x.device.type == "cuda" else None
    wrapped = DistributedDataParallel(model, device_ids=ids)
    wrapped.register_comm_hook(state=None, hook=allreduce_hook)
    loss_fn = nn.CrossEntropyLoss()

    def step() -> None:
        for p in wrapped.parameters():
            p.grad = None
        loss_fn(wrapped(x), y).backward()
        optimizer.step()

    return step


def fit_alpha_beta(rows: list[dict]) -> tuple[float, float]:
    """The ring model's latency and seconds per byte: weighted normal equations of the 2x2 system."""
    saa = sab = sbb = sa = sb = 0.0
    for row in rows:
        world, t = row["world"], row["seconds"]
        steps = 2.0 * (world - 1)                      # one latency per ring step
        moved = steps / world * row["numel"] * 4.0     # bytes through each link
        u, v = steps / t, moved / t                    # the row over its own time: a relative error
        saa, sab, sbb, sa, sb = saa + u * u, sab + u * v, sbb + v * v, sa + u, sb + v
    det = saa * sbb - sab * sab
    return (sa * sbb - sb * sab) / det, (saa * sb - sab * sa) / det


def predict_efficiency(compute_s: float, backward_s: float, grad_bytes: float, world: int,
                       alpha: float, beta: float) -> float:
    """One step at W workers over one at 1, the all-reduce hidden by the backward as far as it lasts."""
    if world == 1:
        return 1.0
    ring = (world - 1) * (2 * alpha + 2 * grad_bytes * beta / world)
    forward_and_update = compute_s - backward_s
    step = forward_and_update + max(backward_s, ring)
    return compute_s / step


def bench_rank(*, batch_size: int = 128, hidden: int = 256, warmup: int = 5, iters: int = 30) -> float:
    """One worker of the benchmark (given)."""
    device = distlab.init_distributed()
    torch.manual_seed(torch.distributed.get_rank())
    model = make_mlp(seed=0, hidden=hidden).to(device)
    x = torch.randn(batch_size, 64, device=device)
    y = torch.randint(0, 10, (batch_size,), device=device)
    figure = measure_throughput(make_ddp_step(model, x, y, lr=0.01), batch_size, warmup=warmup, iters=iters)
    distlab.shutdown()
    return figure
