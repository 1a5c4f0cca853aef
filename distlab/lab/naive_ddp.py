"""What DDP saves, measured: gradients averaged by hand after the backward, against DDP itself.

The simplest data parallelism averages each gradient after the backward, one ``all_reduce`` per tensor
(notebook 01's "step 3 by hand"). It is correct, and it pays twice, as Li et al. (2020, "PyTorch
Distributed", VLDB, sec. 3.2) measured: a collective's fixed cost (its latency, its launch) once per tensor,
and the whole communication *after* the backward, when nothing is left to compute while it runs. Flattening
every gradient into one tensor pays the fixed cost once but still waits for the end of the backward. DDP
groups the gradients into buckets (reverse registration order, about ``bucket_cap_mb`` each) and starts
each bucket's all-reduce, asynchronously, as soon as its last gradient is ready, inside the backward.

:func:`naive_ddp_report` runs one training step three ways on the same model and batch, on every rank:
``"per tensor"`` (an all-reduce per gradient after the backward), ``"one flat tensor"`` (one all-reduce of
all of them, concatenated, after the backward) and ``"DDP"``; each way's collectives per step (the one
recorder), its median step time (the slowest rank's) and its gradients against DDP's. Exercise 1's second
part builds DDP's way: the buckets and the overlap are the learner's to write, not here.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from distlab.data import seeded_batch
from distlab.measure.comm import CollectiveRecorder
from distlab.measure.timing import distributed_median_seconds
from distlab.models import make_mlp

WAYS = ("per tensor", "one flat tensor", "DDP")


def _average_per_tensor(model: nn.Module, world: int) -> None:
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world


def _average_flat(model: nn.Module, world: int) -> None:
    grads = [p.grad for p in model.parameters()]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    for g, mean in zip(grads, (flat / world).split([g.numel() for g in grads])):
        g.copy_(mean.view_as(g))


def _step(way: str, model: nn.Module, wrapped: nn.Module, x: torch.Tensor, y: torch.Tensor, world: int):
    """One step's forward and backward, and the gradients averaged the way ``way`` does it."""
    def step() -> None:
        model.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(wrapped(x), y).backward()   # DDP: its buckets' all-reduces run in here
        if way == "per tensor":
            _average_per_tensor(model, world)
        elif way == "one flat tensor":
            _average_flat(model, world)
    return step


def naive_ddp_report(*, depth: int = 12, hidden: int = 256, rows: int = 64, bucket_cap_mb: float = 0.25,
                     calls: int = 3, repeats: int = 7) -> dict:
    """Runs on every rank (the process group up): each of :data:`WAYS` on an MLP of ``depth`` hidden layers
    of ``hidden`` (``2 * (depth + 1)`` gradient tensors), this rank's ``rows`` samples; DDP with
    ``bucket_cap_mb``. Per way: the collectives of one step, the median seconds per step, and the largest
    difference of its gradients from DDP's."""
    from distlab.runtime.distributed import device

    dev, rank, world = device(), dist.get_rank(), dist.get_world_size()
    x, y = seeded_batch(rows, 64, seed=rank, device=dev)
    out, grads = {}, {}
    for way in WAYS:
        model = make_mlp(seed=0, hidden=hidden, depth=depth).to(dev)
        wrapped = DDP(model, bucket_cap_mb=bucket_cap_mb) if way == "DDP" else model
        step = _step(way, model, wrapped, x, y, world)
        step()   # DDP's first step builds its buckets in the order the gradients arrived
        with CollectiveRecorder(world) as rec:
            step()
        grads[way] = [p.grad.detach().clone() for p in model.parameters()]
        out[way] = {"collectives": rec.counts(), "bytes": sum(op.bytes for op in rec.ops),
                    "seconds": distributed_median_seconds(step, calls=calls, repeats=repeats, device=dev, warmup=1)}
    for way in WAYS:
        out[way]["grad_diff"] = max((a - b).abs().max().item() for a, b in zip(grads[way], grads["DDP"]))
    tensors = sum(1 for _ in make_mlp(seed=0, hidden=hidden, depth=depth).parameters())
    return {"rank": rank, "world": world, "tensors": tensors, "ways": out}


def naive_ddp_job(**kwargs) -> dict:
    """Runs on every rank: :func:`naive_ddp_report` in a job of its own (initialises and shuts down)."""
    from distlab.runtime.distributed import init_distributed, shutdown

    init_distributed()
    try:
        return naive_ddp_report(**kwargs)
    finally:
        shutdown()
