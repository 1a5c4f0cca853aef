"""Exercise 4: shard a model with FSDP2 (``fully_shard``) and export it.

Fully Sharded Data Parallel (ZeRO-3, Rajbhandari et al., 2020; PyTorch FSDP,
Zhao et al., 2023) keeps on each of the W ranks only 1/W of every parameter,
gradient and optimizer state. Before a block runs forward (and again in
backward) its parameters are all-gathered; after backward its gradients are
reduce-scattered so each rank keeps the averaged gradient of its own shard.
The memory win depends on *where* you shard: one ``fully_shard`` per block
means only one block is ever unsharded at a time.

Fill in, in order:

1. ``shard``: ``fully_shard`` every block of ``model.blocks``, then the root.
2. ``make_optimizer``: ``torch.optim.Adam`` over the *sharded* parameters.
3. ``train_step``: one step on this rank's micro-batch.
4. ``export_full_state_dict``: gather a full (unsharded) state dict on rank 0
   and save it there.
5. ``train_fsdp``: put them together in the right order.

The grader calls ``train_fsdp`` under torchrun at world sizes 2 and 4,
after ``distlab.init_distributed()``. Legacy names: ``fully_shard`` replaces
the ``FullyShardedDataParallel`` wrapper (FSDP1) with ``auto_wrap_policy``;
the full state dict below replaces ``FSDP.state_dict_type(model,
StateDictType.FULL_STATE_DICT, FullStateDictConfig(offload_to_cpu=True,
rank0_only=True))``. Check your work from the repository's root with
``make grade`` (every exercise) or ``.venv/bin/python -m autograder
--exercise 4`` (this one), or with ``check(4)`` in the notebook
``course/04_fsdp``.
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import fully_shard


def shard(model: nn.Module) -> nn.Module:
    """Shard ``model`` in place with FSDP2 and return it.

    Call ``fully_shard(block)`` on every block in ``model.blocks`` first, then
    ``fully_shard(model)`` on the root (which takes the remaining parameters:
    the input layer and the head). Afterwards every parameter is a DTensor
    sharded on dim 0 (``Shard(0)``). Every rank must start from the same
    weights: ``fully_shard`` keeps each rank's slice of its own local copy.
    """
    ### BEGIN SOLUTION
    for block in model.blocks:
        fully_shard(block)  # one unit per block: only one block is unsharded at a time
    fully_shard(model)
    return model
    ### END SOLUTION


def make_optimizer(model: nn.Module, lr: float) -> torch.optim.Optimizer:
    """``torch.optim.Adam(model.parameters(), lr=lr)``, built *after* ``shard``.

    ``fully_shard`` replaces every ``nn.Parameter`` with a sharded DTensor
    parameter; an optimizer built earlier would hold the old, unsharded
    tensors, which never receive a gradient.
    """
    ### BEGIN SOLUTION
    return torch.optim.Adam(model.parameters(), lr=lr)
    ### END SOLUTION


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor,
               y: torch.Tensor) -> torch.Tensor:
    """One step on this rank's micro-batch ``(x, y)``; return the detached loss.

    Zero the gradients first (``optimizer.zero_grad()``), then the mean
    cross-entropy, ``backward()`` (FSDP reduce-scatters and averages the
    gradients over ranks) and ``optimizer.step()``. Leave the gradients in
    place after the step: the grader counts their bytes.
    """
    ### BEGIN SOLUTION
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.detach()
    ### END SOLUTION


def export_full_state_dict(model: nn.Module, path: str | Path) -> dict | None:
    """Gather the full state dict on rank 0 and ``torch.save`` it to ``path`` there.

    Use ``get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
    cpu_offload=True))``: every rank must call it (it all-gathers), and with
    ``cpu_offload`` only rank 0 receives the tensors (plain CPU tensors, keys
    like ``blocks.0.fc1.weight``). Save on rank 0 only and return the dict
    there; return ``None`` on the other ranks.
    """
    ### BEGIN SOLUTION
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = get_model_state_dict(model, options=options)  # a collective: all ranks call it
    if dist.get_rank() != 0:
        return None
    torch.save(state, path)
    return state
    ### END SOLUTION


def train_fsdp(model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]], *, lr: float,
               export_path: str | Path) -> tuple[nn.Module, torch.optim.Optimizer]:
    """Shard, build the optimizer, train on this rank's micro-batches, export; return ``(model, optimizer)``.

    The order matters: ``shard`` before ``make_optimizer`` (see there), then
    one ``train_step`` per ``(x, y)`` in ``batches``, print the last loss on
    rank 0 only, and ``export_full_state_dict(model, export_path)`` on every rank.
    """
    ### BEGIN SOLUTION
    model = shard(model)
    optimizer = make_optimizer(model, lr)
    for x, y in batches:
        loss = train_step(model, optimizer, x, y)
    if dist.get_rank() == 0:
        print(f"last loss on rank 0's micro-batch: {loss.item():.4f}")
    export_full_state_dict(model, export_path)
    return model, optimizer
    ### END SOLUTION
