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

* :class:`CollectiveBytes` counts every collective a block of code issues, as
  a ``TorchDispatchMode`` that sees the ``c10d`` operators (``all_reduce``,
  ``_allgather_base_``, ``_reduce_scatter_base_``...) on their way to the
  backend, DDP's reducer's included; a DDP comm hook cross-checks the count.
* :func:`wire_bytes` turns a collective of ``S`` bytes into what each rank
  sends in the ring algorithm: nccl-tests' bus factors (``PERFORMANCE.md``).
* :func:`zero_prediction` is the accounting above for a model and its FSDP
  units, padding included (FSDP2 pads every parameter to ``ceil(rows/n)``
  rows per rank).
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from .models import sgd_step

#: Bytes each rank sends per byte of the collective's full size S, ring algorithms (nccl-tests' busbw
#: factors); a point-to-point send sends its bytes once, a receive none.
BUS_FACTORS = {"allreduce": lambda n: 2 * (n - 1) / n, "allgather": lambda n: (n - 1) / n,
               "reduce_scatter": lambda n: (n - 1) / n, "alltoall": lambda n: (n - 1) / n,
               "broadcast": lambda n: 1.0, "reduce": lambda n: 1.0, "gather": lambda n: (n - 1) / n,
               "scatter": lambda n: (n - 1) / n, "send": lambda n: 1.0, "recv": lambda n: 0.0,
               "barrier": lambda n: 0.0}
# Substrings of c10d operator names, most specific first ("allreduce_" also contains "reduce").
_KIND = ("reduce_scatter", "allgather", "allreduce", "alltoall", "broadcast", "barrier", "send", "recv",
         "gather", "scatter", "reduce")
NOT_COLLECTIVES = {"wait_tensor"}  # _c10d_functional's wait for an async collective: no bytes of its own


def _nbytes(arg) -> int:
    if isinstance(arg, torch.Tensor):
        return arg.numel() * arg.element_size()
    if isinstance(arg, (list, tuple)):
        return sum(_nbytes(a) for a in arg)
    return 0


#: How the notebooks write the kinds that c10d spells "allreduce", "allgather", "reduce_scatter".
LABELS = {"allreduce": "all-reduce", "allgather": "all-gather", "reduce_scatter": "reduce-scatter"}
_UNLABEL = {v: k for k, v in LABELS.items()}


def label(kind: str) -> str:
    """``"all-reduce"`` for ``"allreduce"``, and so on (other kinds as they are)."""
    return LABELS.get(kind, kind)


def collective_kind(op_name: str) -> str:
    """``"allreduce"``, ``"allgather"``, ``"reduce_scatter"``... from a c10d operator's name."""
    name = op_name.lower().replace("all_gather", "allgather").replace("all_reduce", "allreduce")
    return next((kind for kind in _KIND if kind in name), name)


def wire_bytes(kind: str, nbytes: float, world: int) -> float:
    """Bytes one rank sends for a collective of full size ``nbytes`` on ``world`` ranks (ring; NaN for
    an operation this table does not know, so that a total including it says so). ``kind`` as
    :func:`collective_kind` or :func:`label` writes it."""
    kind = _UNLABEL.get(kind, kind)
    return BUS_FACTORS[kind](world) * nbytes if kind in BUS_FACTORS else float("nan")


class CollectiveBytes(TorchDispatchMode):
    """``with CollectiveBytes(world) as c:`` records every collective issued inside: ``c.ops`` is a list
    of ``(kind, full_bytes)``; the full size is the largest tensor argument (the all-reduced tensor,
    an all-gather's output, a reduce-scatter's input: the ``S`` of nccl-tests)."""

    def __init__(self, world: int):
        super().__init__()
        self.world, self.ops = world, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace in ("c10d", "_c10d_functional") and func._opname not in NOT_COLLECTIVES:
            self.ops.append((collective_kind(func._opname), max((_nbytes(a) for a in args), default=0)))
        return func(*args, **(kwargs or {}))

    def totals(self) -> dict:
        """Per kind: ``{"calls", "bytes", "wire_bytes"}``, and ``"wire_bytes"`` over all kinds."""
        out: dict = {}
        for kind, nbytes in self.ops:
            row = out.setdefault(kind, {"calls": 0, "bytes": 0, "wire_bytes": 0.0})
            row["calls"] += 1
            row["bytes"] += nbytes
            row["wire_bytes"] += wire_bytes(kind, nbytes, self.world)
        out["wire_bytes"] = sum(v["wire_bytes"] for v in out.values())
        return out


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
    ddp = wire_bytes("allreduce", grad_bytes, world)
    fsdp = wire_bytes("allgather", gathered, world) + wire_bytes("reduce_scatter", psi, world)
    return {"grad_bytes": grad_bytes, "psi_bytes": psi, "ddp": ddp, "fsdp": fsdp, "ratio": fsdp / ddp,
            "allgather_bytes": gathered, "reduce_scatter_bytes": psi}


#: The model of notebook 04 and exercise 4 (distlab.resmlp defaults: 8 blocks of width 90, 268 K parameters).
MODEL = dict(in_features=64, hidden=90, out_features=10, depth=8)
BATCH = 16


STEPS = 3  # two to warm up (DDP rebuilds its buckets, FSDP initialises lazily), the third counted


def _train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, world: int) -> dict:
    """``STEPS - 1`` uncounted steps, then one step counted by :class:`CollectiveBytes`; its totals."""
    step = sgd_step(model, x, y, lr=1e-3)
    for _ in range(STEPS - 1):
        step()
    with CollectiveBytes(world) as counted:
        step()
    return counted.totals()


def measure_step_bytes() -> dict:
    """Runs on every rank of an initialised job: the bytes one training step of :data:`MODEL`
    sends under DDP and under FSDP2 (one unit per block plus the root), the root left unsharded
    after forward (FSDP2's default) and resharded (``reshard_after_forward=True``), each beside
    :func:`zero_prediction`. DDP's all-reduces are also counted by a comm hook."""
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel as DDP

    from .distributed import device as rank_device
    from .resmlp import make_resmlp

    world, device = dist.get_world_size(), rank_device()
    gen = torch.Generator().manual_seed(dist.get_rank())
    x = torch.randn(BATCH, MODEL["in_features"], generator=gen).to(device)
    y = torch.randint(0, MODEL["out_features"], (BATCH,), generator=gen).to(device)
    model = make_resmlp(0, **MODEL).to(device)
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    hooked = []

    def hook(state, bucket):  # the cross-check: what DDP hands to the all-reduce, bucket by bucket
        hooked.append(bucket.buffer().numel() * bucket.buffer().element_size())
        return default_hooks.allreduce_hook(None, bucket)

    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    ddp.register_comm_hook(None, hook)
    out = {"world": world, "ddp": _train(ddp, x, y, world)}
    # Every DDP step all-reduces every gradient once, whatever its buckets: the hook's bytes per step.
    out["ddp"]["hook_bytes_per_step"] = sum(hooked) / STEPS
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

    from .distributed import device as rank_device
    from .timing import distributed_median_seconds

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
