"""All-reduce bandwidth, as nccl-tests reports it, and the simple model of DDP scaling it feeds.

nccl-tests (``all_reduce_perf``) reports two figures for an all-reduce of
``S`` bytes on ``n`` ranks taking ``t`` seconds:

* *algorithm bandwidth* ``algbw = S / t``;
* *bus bandwidth* ``busbw = algbw * 2(n-1)/n``: a ring all-reduce moves
  ``2(n-1)/n * S`` bytes through every rank's link (reduce-scatter then
  all-gather, Patarasuk & Yuan, 2009), so busbw is comparable with the
  link's speed whatever ``n`` is.

The all-reduce's time is the alpha-beta model (Hockney, 1994; Thakur, Rabenseifner & Gropp,
2005): a ring all-reduce of ``n`` bytes takes ``2(W-1)`` steps, each paying a latency ``alpha``,
and every link carries ``2(W-1)/W * n`` bytes at ``beta`` seconds a byte (``beta = 1/busbw``)::

    t_allreduce(W) = 2(W-1) * alpha + 2(W-1)/W * n * beta

so a latency fitted at ``W = 2`` (one ``2 alpha``) is ``2(W-1) alpha`` at ``W``: 7x more at
``W = 8``. NCCL's tree algorithm pays ``O(log W)`` latencies instead; the ring is the bound
nccl-tests' bus bandwidth assumes. The model of one data-parallel step on ``W`` workers (no
overlap of the all-reduce with the backward, an upper bound on its cost)::

    t_step(W) = t_compute + t_allreduce(W)
    efficiency(W) = t_step(1) / t_step(W)
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from distlab.runtime.distributed import device as rank_device
from distlab.measure.timing import distributed_median_seconds


def bus_factor(n: int) -> float:
    """``2(n-1)/n``: the bytes each rank's link carries in a ring all-reduce, per byte reduced."""
    return 2 * (n - 1) / n


def allreduce_bandwidth(sizes_bytes: list[int], *, calls: int = 5, repeats: int = 3, warmup: int = 2,
                        device: torch.device | None = None) -> list[dict]:
    """Time ``all_reduce`` of float32 tensors of each size on the initialised process group.

    Returns one dict per size: ``bytes``, ``time_s`` (per all-reduce: the median over ``repeats``
    blocks of ``calls`` all-reduces, each block's time the *slowest rank's*, see
    :func:`distlab.measure.timing.distributed_median_seconds`), ``algbw``, ``busbw`` (bytes/s). Every rank
    gets the same figures. ``device`` defaults to this rank's (a CUDA device under NCCL).
    """
    n = dist.get_world_size()
    device = device or rank_device()
    rows = []
    for size in sizes_bytes:
        x = torch.ones(max(1, size // 4), dtype=torch.float32, device=device)
        t_s = distributed_median_seconds(lambda: dist.all_reduce(x), calls=calls, repeats=repeats,
                                         device=device, warmup=warmup)
        algbw = x.numel() * 4 / t_s
        rows.append({"bytes": x.numel() * 4, "time_s": t_s, "algbw": algbw, "busbw": algbw * bus_factor(n)})
    return rows


def ring_steps(world: int) -> int:
    """``2(W-1)``: the steps of a ring all-reduce (``W-1`` reduce-scatter, ``W-1`` all-gather), each a latency."""
    return 2 * (world - 1)


def allreduce_time(nbytes: float, world: int, busbw: float, alpha_s: float = 0.0) -> float:
    """Predicted ring all-reduce time, ``2(W-1) alpha + 2(W-1)/W * bytes / busbw`` (0 on one worker)."""
    return ring_steps(world) * alpha_s + bus_factor(world) * nbytes / busbw


def fit_latency_bandwidth(rows: list[dict], world: int) -> tuple[float, float]:
    """Least-squares ``time = 2(W-1) alpha + bus_factor * bytes / busbw`` over measured ``rows``:
    returns ``(alpha_s, busbw)``, the latency of one ring step and the bus bandwidth
    (``1/beta``); the smallest message shows latency, the largest bandwidth.

    The fit minimises *relative* errors (each row divided by its time): the sizes span
    three or more decades, and in seconds the largest messages' errors would outweigh the
    small ones' whole times, leaving the latency to chance."""
    x = torch.tensor([bus_factor(world) * r["bytes"] for r in rows], dtype=torch.float64)
    y = torch.tensor([r["time_s"] for r in rows], dtype=torch.float64)
    a = torch.stack([torch.full_like(x, ring_steps(world)), x], dim=1) / y.unsqueeze(1)
    alpha, inv_bw = torch.linalg.lstsq(a, torch.ones_like(y).unsqueeze(1)).solution.squeeze(1).tolist()
    return max(alpha, 0.0), 1.0 / max(inv_bw, 1e-15)


def predicted_efficiency(compute_s: float, grad_bytes: float, world: int, busbw: float,
                         alpha_s: float = 0.0, slowdown: float = 1.0) -> float:
    """``t_step(1) / t_step(W)``; ``slowdown`` scales the compute when workers share cores
    (``W / cores`` when ``W`` exceeds the cores, on a CPU)."""
    step = compute_s * slowdown + allreduce_time(grad_bytes, world, busbw, alpha_s)
    return compute_s / step


def scaling_probe(hidden: int = 1024, batch: int = 32, steps: int = 5, repeats: int = 3) -> dict:
    """Runs on every rank: the inputs of the model above, measured on this job.

    ``compute_s``: one local forward/backward/step without DDP (all ranks at once, so
    core contention is included); ``step_s``: one DDP step; both per step, the median over
    ``repeats`` blocks of ``steps`` steps of the slowest rank's time (fixed counts: every rank
    must run the same number of collectives). ``busbw`` and ``alpha_s`` (the latency of one ring
    step) fitted from all-reduces of 4 KiB up to the gradients' size.
    """
    import copy

    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from distlab.runtime.distributed import init_distributed, shutdown
    from distlab.models import make_mlp, sgd_step

    dev = init_distributed()
    w = dist.get_world_size()
    model = make_mlp(seed=0, hidden=hidden, depth=3).to(dev)
    x, y = torch.randn(batch, 64, device=dev), torch.randint(0, 10, (batch,), device=dev)
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())

    def timed(net: nn.Module) -> float:
        return distributed_median_seconds(sgd_step(net, x, y, lr=0.01), calls=steps, repeats=repeats, device=dev,
                                          warmup=3)

    compute_s = timed(copy.deepcopy(model))
    step_s = timed(DDP(model, device_ids=[dev.index] if dev.type == "cuda" else None))
    out = {"world": w, "compute_s": compute_s, "step_s": step_s, "grad_bytes": grad_bytes}
    if w > 1:
        sizes = [4 << 10, 64 << 10, 1 << 20, grad_bytes]
        rows = allreduce_bandwidth(sizes, device=dev)
        out["alpha_s"], out["busbw"] = fit_latency_bandwidth(rows, w)
        out["latency_s"] = ring_steps(w) * out["alpha_s"]  # the whole latency at this W (released notebooks read it)
        out["rows"] = rows
    shutdown()
    return out
