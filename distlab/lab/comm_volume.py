"""Bytes on the wire per training step, counted, beside what the ZeRO accounting predicts.

Rajbhandari et al., 2020 ("ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models", SC'20, section 7): data parallelism all-reduces the
gradients once per step, and a ring all-reduce of ``Ψ`` bytes is a
reduce-scatter then an all-gather, so every rank sends ``2(n-1)/n · Ψ``.
ZeRO-3 (FSDP) all-gathers the parameters for the forward, again for the
backward (they were freed in between), and reduce-scatters the gradients:
``3(n-1)/n · Ψ``, 1.5x data parallelism. Less where a unit is *not* freed
after its forward and so not gathered again: FSDP2 keeps the root module's
parameters gathered between forward and backward unless ``fully_shard`` is
given ``reshard_after_forward`` explicitly (``_fsdp_state._lazy_init``).

* :func:`measure_step_bytes` counts every collective of one step with the one
  recorder, :class:`distlab.measure.comm.CollectiveRecorder` (DDP's reducer's
  included); a DDP comm hook cross-checks the count.
* :func:`zero_prediction` is the accounting above for a model and its FSDP
  units, padding included (FSDP2 pads every parameter to ``ceil(rows/n)``
  rows per rank).
* :func:`allreduce_as_rs_ag`: the all-reduce and its two halves, run and timed.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from distlab.measure.comm import CollectiveRecorder, wire_bytes
from distlab.models import sgd_step


def padded_bytes(module: nn.Module, world: int, recurse: bool = True) -> int:
    """Bytes FSDP2 all-gathers for ``module``'s parameters: each padded to ``ceil(rows/world)·world`` rows."""
    return sum(math.ceil(p.shape[0] / world) * world * math.prod(p.shape[1:]) * p.element_size()
               for p in module.parameters(recurse=recurse))


def zero_prediction(grad_bytes: int, units: list[tuple[int, bool]], world: int) -> dict:
    """Wire bytes per rank per step of data parallelism and of ZeRO-3/FSDP.

    DDP: one all-reduce of the ``grad_bytes``, ``2(n-1)/n · Ψ``. FSDP: ``units`` lists
    ``(bytes, reshards_after_forward)`` per unit (padded, :func:`padded_bytes`); each unit is
    all-gathered before its forward, again before its backward if it was resharded after the
    forward, and its gradients are reduce-scattered, each ``(n-1)/n`` of its bytes.
    """
    psi = sum(b for b, _ in units)
    gathered = sum(b * (2 if reshard else 1) for b, reshard in units)
    ddp = wire_bytes("all_reduce", grad_bytes, world)
    fsdp = wire_bytes("all_gather", gathered, world) + wire_bytes("reduce_scatter", psi, world)
    return {"grad_bytes": grad_bytes, "psi_bytes": psi, "ddp": ddp, "fsdp": fsdp, "ratio": fsdp / ddp,
            "all_gather_bytes": gathered, "reduce_scatter_bytes": psi}


#: The model of notebook 04 and exercise 4 (distlab.resmlp defaults: 8 blocks of width 90, 268 K parameters).
MODEL = dict(in_features=64, hidden=90, out_features=10, depth=8)
BATCH = 16


STEPS = 3  # two to warm up (DDP rebuilds its buckets, FSDP initialises lazily), the third counted


def _train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, world: int) -> dict:
    """``STEPS - 1`` uncounted steps, then one step counted by
    :class:`~distlab.measure.comm.CollectiveRecorder`; its totals."""
    step = sgd_step(model, x, y, lr=1e-3)
    for _ in range(STEPS - 1):
        step()
    with CollectiveRecorder(world) as counted:
        step()
    return counted.totals()


def measure_step_bytes() -> dict:
    """Runs on every rank of an initialised job: the bytes one training step of :data:`MODEL`
    sends under DDP and under FSDP2 (one unit per block plus the root), the root left unsharded
    after forward (FSDP2's default) and resharded (``reshard_after_forward=True``), each beside
    :func:`zero_prediction`. DDP's all-reduces are also counted by a comm hook."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel as DDP

    from distlab.data import seeded_batch
    from distlab.measure.ddp_hooks import BucketLog
    from distlab.resmlp import make_resmlp
    from distlab.runtime.distributed import device as rank_device

    world, device = dist.get_world_size(), rank_device()
    x, y = seeded_batch(BATCH, MODEL["in_features"], MODEL["out_features"], seed=dist.get_rank(), device=device)
    model = make_resmlp(0, **MODEL).to(device)
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    hooked = BucketLog().register(ddp)  # the cross-check: what DDP hands to the all-reduce, bucket by bucket
    out = {"world": world, "ddp": _train(ddp, x, y, world)}
    # Every DDP step all-reduces every gradient once, whatever its buckets: the hook's bytes per step.
    out["ddp"]["hook_bytes_per_step"] = hooked.total_bytes() / STEPS
    for name, root_reshards in (("fsdp", None), ("fsdp_root_resharded", True)):
        model = make_resmlp(0, **MODEL).to(device)
        blocks = [(padded_bytes(b, world), True) for b in model.blocks]
        root = (padded_bytes(model, world) - sum(b for b, _ in blocks), bool(root_reshards))
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model, **({} if root_reshards is None else {"reshard_after_forward": root_reshards}))
        out[name] = _train(model, x, y, world)
        out[name]["prediction"] = zero_prediction(grad_bytes, blocks + [root], world)
    return out


def allreduce_as_rs_ag(nbytes: int = 8 << 20, calls: int = 3, repeats: int = 3) -> dict:
    """Runs on every rank of an initialised job: an all-reduce, and the same sum as a reduce-scatter
    then an all-gather, the two halves of the ring all-reduce (Patarasuk & Yuan, 2009). The inputs
    are small integers, whose float sums are exact in any order, so the results must be equal bit
    for bit. Each collective is timed (median of ``repeats`` blocks of ``calls``, slowest rank)."""
    import torch.distributed as dist

    from distlab.runtime.distributed import device as rank_device
    from distlab.measure.timing import distributed_median_seconds

    n, dev = dist.get_world_size(), rank_device()
    numel = nbytes // 4 // n * n  # divisible by the world: every rank gets an equal shard
    x = (torch.arange(numel, device=dev) % 7 + dist.get_rank()).float()
    reduced = x.clone()
    dist.all_reduce(reduced)
    shard = torch.empty(numel // n, device=dev)
    dist.reduce_scatter_single(shard, x.clone())
    gathered = torch.empty(numel, device=dev)
    dist.all_gather_single(gathered, shard)
    buf = x.clone()

    def timed(fn) -> float:
        return distributed_median_seconds(fn, calls=calls, repeats=repeats, device=dev, warmup=1)

    rs = timed(lambda: dist.reduce_scatter_single(shard, buf))
    ag = timed(lambda: dist.all_gather_single(gathered, shard))
    allreduce = timed(lambda: dist.all_reduce(buf))
    return {"bytes": numel * 4, "equal": torch.equal(reduced, gathered), "allreduce_s": allreduce,
            "reduce_scatter_s": rs, "allgather_s": ag}
