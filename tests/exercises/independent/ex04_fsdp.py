"""Exercise 4, written independently of the reference. Part 1 (ZeRO-1): the list forms of the
collectives (``reduce_scatter`` of W chunks, summed then divided by W; ``all_gather`` into W views of
one buffer), imported by name, the flat buffer made with ``torch.cat`` and a zeros tail, written back
with ``vector_to_parameters``. Part 2: FSDP2 on an explicit 1-D device mesh,
``fully_shard`` and the state-dict functions imported by name, the optimizer given a list of the
sharded parameters, and ``from torch import save``. Graded by tests/exercises/test_ex04_fsdp.py."""
from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn, save
from torch.distributed import all_gather, get_rank, get_world_size, reduce_scatter
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.utils import vector_to_parameters

import distlab


def shard_range(numel: int, world: int, rank: int) -> tuple[int, int]:
    """Equal slices of ``ceil(numel / world)``, the last ones running into the padding."""
    length = math.ceil(numel / world)
    start = rank * length
    return start, start + length


def _padded_flat(tensors, world: int) -> torch.Tensor:
    flat = torch.cat([t.detach().flatten().to(torch.float32) for t in tensors])
    lo, hi = shard_range(flat.numel(), world, 0)
    return torch.cat([flat, flat.new_zeros(world * (hi - lo) - flat.numel())])


def make_zero1_optimizer(model: nn.Module, lr: float) -> tuple[torch.Tensor, torch.optim.Optimizer]:
    """Adam over this rank's fp32 slice of the padded flat parameters, a tensor of its own."""
    flat = _padded_flat(model.parameters(), get_world_size())
    lo, hi = shard_range(sum(p.numel() for p in model.parameters()), get_world_size(), get_rank())
    master = nn.Parameter(flat[lo:hi].clone())
    return master, torch.optim.Adam([master], lr=lr)


def zero1_step(model: nn.Module, shard: torch.Tensor, optimizer: torch.optim.Optimizer) -> None:
    """Reduce-scatter W chunks (sum, then / W), step, all-gather into W views, write back."""
    world = get_world_size()
    params = [p for p in model.parameters()]
    chunks = list(_padded_flat([p.grad for p in params], world).chunk(world))
    summed = torch.zeros_like(shard)
    reduce_scatter(summed, chunks)
    shard.grad = summed / world
    optimizer.step()
    gathered = torch.zeros(world * shard.numel(), dtype=shard.dtype, device=shard.device)
    with torch.no_grad():
        all_gather(list(gathered.chunk(world)), shard)
        n = sum(p.numel() for p in params)
        vector_to_parameters(gathered[:n].to(params[0].dtype), params)


def shard(model: nn.Module) -> nn.Module:
    """Every block its own FSDP2 unit on a 1-D mesh of all ranks, then the root."""
    mesh = init_device_mesh(distlab.device().type, (get_world_size(),), mesh_dim_names=("dp",))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def make_optimizer(model: nn.Module, lr: float) -> torch.optim.Optimizer:
    """Adam over the sharded parameters (built after ``shard``)."""
    return torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor,
               y: torch.Tensor) -> torch.Tensor:
    """Zero the gradients, mean cross-entropy, backward, step; the detached loss."""
    optimizer.zero_grad(set_to_none=True)
    loss = nn.CrossEntropyLoss()(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.detach()


def export_full_state_dict(model: nn.Module, path: str | Path) -> dict | None:
    """The full state dict, gathered by every rank, saved and returned on rank 0."""
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if get_rank() == 0:
        save(full, path)
        return full
    return None


def train_fsdp(model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]], *, lr: float,
               export_path: str | Path) -> tuple[nn.Module, torch.optim.Optimizer]:
    """Shard, then the optimizer, one step per micro-batch, the export."""
    sharded = shard(model)
    optimizer = make_optimizer(sharded, lr)
    losses = [train_step(sharded, optimizer, x, y) for x, y in batches]
    if get_rank() == 0:
        print("losses on rank 0:", " ".join(f"{float(loss):.3f}" for loss in losses))
    export_full_state_dict(sharded, export_path)
    return sharded, optimizer
