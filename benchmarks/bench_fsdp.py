"""FSDP2 memory: per-rank bytes at W = 1, 2, 4 against the ideal 1/W, and the peak during a step.

Exercise 4's model (:class:`distlab.resmlp.ResidualMLP`, 8 blocks, widths not
multiples of 4 so shards are padded) is sharded per block with the reference
solution, trained two Adam steps, and measured on every rank:
:func:`distlab.lab.fsdp_memory.measured_bytes` after the step, and the peak of
live tensor storage during the second step (:class:`distlab.measure.memory.PeakMemory`:
``LiveStorageTracker`` on the CPU, ``max_memory_allocated`` on a GPU) against the bound the grader uses.
Root-only wrapping at W=2 is measured beside it. These are bytes, which a
CPU measures as well as a GPU; FSDP's *speed* needs GPUs and a real
interconnect, so no time is reported here.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

import distlab
from benchmarks import Row
from distlab.lab.fsdp_memory import (UNITS_IN_FLIGHT, activation_bytes, full_shapes, measured_bytes, peak_bound,
                                     unsharded_bytes)
from distlab.measure.memory import PeakMemory


def measure(per_block: bool = True) -> dict:
    """Rank side: shard, two Adam steps, bytes and the peak of the second step."""
    from autograder.checks.ex04_fsdp import MICRO_BATCH, MODEL
    from distlab.data import synthetic_classification
    from distlab.resmlp import make_resmlp
    from torch.distributed.fsdp import fully_shard

    device = distlab.init_distributed()
    rank = dist.get_rank()
    model = make_resmlp(seed=0, **MODEL).to(device)
    unsharded = unsharded_bytes(full_shapes(model))
    if per_block:
        for block in model.blocks:
            fully_shard(block)
    fully_shard(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x_all, y_all = synthetic_classification(256, MODEL["in_features"], MODEL["out_features"]).tensors
    mine = slice(rank * MICRO_BATCH, (rank + 1) * MICRO_BATCH)  # this rank's samples and their labels
    x, y = x_all[mine].to(device), y_all[mine].to(device)
    for step in range(2):
        state = measured_bytes(model, opt)
        params = list(model.parameters())
        # as the grader: on a GPU the growth above what was live, on top of the sharded state
        with PeakMemory(device, state=[*params, *(p.grad for p in params if p.grad is not None),
                                       *(v for s in opt.state.values() for v in s.values())]) as mem:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        peak = mem.peak
    after = measured_bytes(model, opt)
    distlab.shutdown()
    return {"bytes": sum(after.values()), "peak": peak, "unsharded": unsharded,
            "bound": peak_bound(sum(state.values()), model, activation_bytes(MICRO_BATCH, **MODEL))["bound"]}


def rows() -> list[Row]:
    out = []
    for world in (1, 2, 4):
        res = distlab.torchrun(measure, world, timeout=180).results
        worst = max(res, key=lambda r: r["bytes"])
        ideal = worst["unsharded"] / world
        out.append(Row("fsdp", f"W={world} params+grads+Adam per rank (largest rank)", worst["bytes"] / 2**20, "MiB",
                       f"ideal 1/W = {ideal / 2**20:.3f} MiB; measured/ideal = {worst['bytes'] / ideal:.4f}"))
        top = max(res, key=lambda r: r["peak"])
        out.append(Row("fsdp", f"W={world} peak live bytes in a step, per-block", top["peak"] / 2**20, "MiB",
                       f"bound {top['bound'] / 2**20:.3f} MiB (sharded state + {UNITS_IN_FLIGHT} units + activations); "
                       f"peak/bound = {top['peak'] / top['bound']:.2f}"))
    res = distlab.torchrun(measure, 2, kwargs={"per_block": False}, timeout=180).results
    top = max(res, key=lambda r: r["peak"])
    out.append(Row("fsdp", "W=2 peak live bytes in a step, root only", top["peak"] / 2**20, "MiB",
                   f"same bound {top['bound'] / 2**20:.3f} MiB; peak/bound = {top['peak'] / top['bound']:.2f}"))
    return out
