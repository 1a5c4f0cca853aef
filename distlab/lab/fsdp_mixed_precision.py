"""FSDP2's mixed precision, and clipping gradients that are sharded or split over pipeline stages (notebook 04).

``fully_shard(module, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))``
keeps each rank's shard of a parameter in its own dtype (fp32: the shard *is* the master copy the optimizer
updates), all-gathers it cast to ``param_dtype`` for the forward and the backward (a transient unsharded bf16
copy, freed after use), and reduce-scatters the gradients in ``reduce_dtype`` before casting them back to the
shard's dtype (Zhao et al. 2023, *PyTorch FSDP*, section 4.4; torch's ``MixedPrecisionPolicy``).

:func:`mixed_precision_rank` (a ``%%torchrun`` target) trains one step of :mod:`distlab.resmlp`'s model under
three policies and reports, per policy: the dtype and type of a weight inside the forward and after it, the
gradient's, the bytes of the step's all-gathers and reduce-scatters (the one recorder,
:class:`distlab.measure.comm.CollectiveRecorder`), and ``clip_grad_norm_``'s total norm on the DTensor
gradients against one process's norm of the same global batch (parity). Then the same gradients as if the
ranks were pipeline stages, each holding its own layers' gradients: a norm per stage is not the model's norm;
the squares summed over the stages (one all-reduce) are, as torchtitan's ``clip_grad_norm_`` does over its
``pp`` mesh.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

import distlab
from distlab.data import synthetic_classification
from distlab.measure.comm import CollectiveRecorder
from distlab.resmlp import make_resmlp

POLICIES = {"fp32": MixedPrecisionPolicy(),  # the default: no casting
            "bf16 params, fp32 reduce": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
            "bf16 params, bf16 reduce": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)}
HIDDEN, PER_RANK = 91, 8


def _seen_in_forward(module: torch.nn.Module) -> tuple[dict, object]:
    """What ``module``'s weight is while its forward runs (a hook; remove the handle after)."""
    seen: dict = {}

    def hook(mod, args):
        seen.setdefault("weight", f"{type(mod.weight).__name__} {str(mod.weight.dtype).removeprefix('torch.')}")
    return seen, module.register_forward_pre_hook(hook)


def _policy_step(policy, x: torch.Tensor, y: torch.Tensor) -> dict:
    """One forward and backward of the model sharded per block and at the root under ``policy``."""
    model = make_resmlp(seed=0, hidden=HIDDEN).to(x.device)
    for block in model.blocks:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    seen, handle = _seen_in_forward(model.blocks[0].fc1)
    with CollectiveRecorder() as recorder:
        torch.nn.functional.cross_entropy(model(x), y).backward()
    handle.remove()
    w = model.blocks[0].fc1.weight
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=float("inf"))  # measures, clips nothing
    totals = recorder.totals()
    return {"in_forward": seen["weight"], "after_forward": f"{type(w).__name__} {str(w.dtype).removeprefix('torch.')}",
            "grad": f"{type(w.grad).__name__} {str(w.grad.dtype).removeprefix('torch.')}",
            "all_gather_bytes": totals.get("all_gather", {}).get("bytes", 0),
            "reduce_scatter_bytes": totals.get("reduce_scatter", {}).get("bytes", 0),
            "norm": float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)}


def _reference_grads(x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    """One process, the whole global batch, fp32: the gradients every policy approximates."""
    model = make_resmlp(seed=0, hidden=HIDDEN).to(x.device)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    return [p.grad for p in model.parameters()]


def _as_stages(grads: list[torch.Tensor], rank: int, world: int) -> dict:
    """The reference's gradients split into ``world`` contiguous stages, this rank holding stage ``rank``: its own
    norm, and the model's norm from every stage's sum of squares (one all-reduce)."""
    per_stage = -(-len(grads) // world)
    mine = grads[rank * per_stage:(rank + 1) * per_stage]
    squares = torch.stack([g.pow(2).sum() for g in mine]).sum() if mine else torch.zeros((), device=grads[0].device)
    stage_norm = float(squares.sqrt())
    dist.all_reduce(squares)
    return {"stage_norm": stage_norm, "combined_norm": float(squares.sqrt())}


def mixed_precision_rank() -> dict:
    """Every policy's step on this rank's ``PER_RANK`` samples, the reference's norm on all ``W x PER_RANK``,
    and the stage norms (see the module's docstring)."""
    device = distlab.init_distributed()  # the CPU under gloo, this rank's GPU under NCCL
    rank, world = dist.get_rank(), dist.get_world_size()
    x_all, y_all = synthetic_classification(64, 64, 10).tensors
    x, y = x_all[:world * PER_RANK].to(device), y_all[:world * PER_RANK].to(device)
    mine = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
    out = {"policies": {name: _policy_step(policy, x[mine], y[mine]) for name, policy in POLICIES.items()}}
    grads = _reference_grads(x, y)
    out["reference_norm"] = float(torch.stack([g.norm() for g in grads]).norm())
    out["stages"] = _as_stages(grads, rank, world)
    distlab.shutdown()
    return out
