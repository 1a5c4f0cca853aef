"""Exercise 4: shard the optimizer by hand (ZeRO-1), then a model with FSDP2 (``fully_shard``).

ZeRO (Rajbhandari et al., 2020) removes data parallelism's redundancy in
stages. Stage 1 (P_os) shards only the optimizer state: every rank still
holds the whole model and computes whole gradients, but each of the W ranks
keeps Adam's moments (and, in mixed precision, the fp32 master weights) of
1/W of the parameters, steps only that 1/W, and the ranks then exchange the
updated pieces. Part 1 builds that by hand from two collectives. Stage 3
(FSDP; Zhao et al., 2023) shards the parameters and gradients too: before a
block runs forward (and again in backward) its parameters are all-gathered;
after backward its gradients are reduce-scattered. Its memory win depends on
*where* you shard: one ``fully_shard`` per block means only one block is
ever unsharded at a time.

Fill in, in order:

Part 1, ZeRO-1 by hand (a replicated model, no DDP, no FSDP):

1. ``shard_range``: which slice of a padded flat buffer a rank owns.
2. ``make_zero1_optimizer``: this rank's fp32 master shard, and Adam over it alone.
3. ``zero1_step``: average the gradients into the shards, step, gather the
   updated shards into every rank's model. ``train_zero1`` (given) is the
   loop the grader runs around them.

Part 2, FSDP2:

4. ``shard``: ``fully_shard`` every block of ``model.blocks``, then the root.
5. ``make_optimizer``: ``torch.optim.Adam`` over the *sharded* parameters.
6. ``train_step``: one step on this rank's micro-batch.
7. ``export_full_state_dict``: gather a full (unsharded) state dict on rank 0
   and save it there.
8. ``train_fsdp``: put them together in the right order.

The grader runs both parts under torchrun at world sizes 2 and 4, after
``distlab.init_distributed()``, against one process running Adam on the
whole global batch. Legacy names: ``fully_shard`` replaces
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
from torch.nn.utils import parameters_to_vector


# Part 1: ZeRO-1 by hand ------------------------------------------------------------------------------


def shard_range(numel: int, world: int, rank: int) -> tuple[int, int]:
    """``(start, stop)``: the slice of a flat buffer of ``numel`` elements that rank ``rank`` of ``world`` owns.

    Contract: the buffer is padded with zeros at its end to ``world * c`` elements, ``c = ceil(numel /
    world)``, and cut into ``world`` contiguous slices of ``c`` elements in rank order. Every slice has
    the same length whether or not ``world`` divides ``numel``: a reduce-scatter hands out, and an
    all-gather collects, W *equal* pieces. The padding belongs to no parameter, and no element of the
    ``numel`` is left out.
    """
    # YOUR CODE HERE
    raise NotImplementedError


def make_zero1_optimizer(model: nn.Module, lr: float) -> tuple[torch.Tensor, torch.optim.Optimizer]:
    """``(shard, optimizer)``: this rank's fp32 master shard of ``model``'s parameters, and Adam over it alone.

    Contract (the grader checks each point; ``model`` is the same plain module on every rank):

    * The *flat parameters* are the tensors of ``model.parameters()``, in that order, flattened and
      concatenated (``numel`` elements in all), then zero-padded as :func:`shard_range` says.
    * ``shard`` is a new fp32 leaf tensor of ``c = ceil(numel / W)`` elements: a copy (not a view) of this
      rank's slice ``shard_range(numel, W, rank)`` of the flat parameters. fp32 whatever the model's dtype:
      the grader also runs a bfloat16 model, whose fp32 master shard keeps the updates that bf16 would
      round away.
    * ``optimizer`` is ``torch.optim.Adam`` with learning rate ``lr`` over ``shard`` and nothing else:
      its state (``exp_avg``, ``exp_avg_sq``) is ``c`` elements per moment on each rank, 1/W of the
      model's. The model's own parameters are in no optimizer; :func:`zero1_step` writes them.
    """
    # YOUR CODE HERE
    raise NotImplementedError


def zero1_step(model: nn.Module, shard: torch.Tensor, optimizer: torch.optim.Optimizer) -> None:
    """One ZeRO-1 optimizer step, called on every rank after ``loss.backward()`` on its own micro-batch.

    On entry every parameter's ``.grad`` holds this rank's gradient; ``shard`` and ``optimizer`` are
    :func:`make_zero1_optimizer`'s. On return (the grader checks each point):

    * ``shard.grad`` holds this rank's slice of the *mean over the W ranks* of the zero-padded flat
      gradients: what one process computes on the whole global batch. It comes from **one**
      reduce-scatter of the padded flat gradient (``W * c`` elements in, ``c`` out). No rank ever
      holds the whole averaged gradient: no all-reduce.
    * ``optimizer`` has stepped once; it changed ``shard`` only.
    * every rank's ``model.parameters()`` hold the updated flat parameters (padding dropped), the same
      on every rank. They come from **one** all-gather of the W updated shards (``c`` elements in,
      ``W * c`` out), written into the parameters in place (under ``torch.no_grad()``): each parameter
      keeps its dtype, so a bfloat16 model stays bfloat16 (``p.copy_`` casts; ``p.data = ...`` would make
      it the gathered buffer's fp32).

    The collectives: ``dist.reduce_scatter_single(output, input, op=...)`` and
    ``dist.all_gather_single(output, input)``, torch 2.13's names for the legacy
    ``reduce_scatter_tensor`` and ``all_gather_into_tensor`` (same arguments; those now warn that they
    are deprecated). A reduce-scatter's ``op`` defaults to ``dist.ReduceOp.SUM``.
    """
    # YOUR CODE HERE
    raise NotImplementedError


def train_zero1(model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]], *,
                lr: float) -> tuple[torch.Tensor, torch.optim.Optimizer]:
    """Given: ZeRO-1 training on this rank's micro-batches, the loop the grader runs around your functions.

    The optimizer holds the shard, not the model's parameters, so ``optimizer.zero_grad()`` would not
    clear their gradients: ``model.zero_grad()`` does.
    """
    shard, optimizer = make_zero1_optimizer(model, lr)
    for x, y in batches:
        model.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        zero1_step(model, shard, optimizer)
    return shard, optimizer


# Part 2: FSDP2 -------------------------------------------------------------------------------------------


def shard(model: nn.Module) -> nn.Module:
    """Shard ``model`` in place with FSDP2 and return it.

    Call ``fully_shard(block)`` on every block in ``model.blocks`` first, then
    ``fully_shard(model)`` on the root (which takes the remaining parameters:
    the input layer and the head). Afterwards every parameter is a DTensor
    sharded on dim 0 (``Shard(0)``). Every rank must start from the same
    weights: ``fully_shard`` keeps each rank's slice of its own local copy.
    """
    # YOUR CODE HERE
    raise NotImplementedError


def make_optimizer(model: nn.Module, lr: float) -> torch.optim.Optimizer:
    """``torch.optim.Adam(model.parameters(), lr=lr)``, built *after* ``shard``.

    ``fully_shard`` replaces every ``nn.Parameter`` with a sharded DTensor
    parameter; an optimizer built earlier would hold the old, unsharded
    tensors, which never receive a gradient.
    """
    # YOUR CODE HERE
    raise NotImplementedError


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor,
               y: torch.Tensor) -> torch.Tensor:
    """One step on this rank's micro-batch ``(x, y)``; return the detached loss.

    Zero the gradients first (``optimizer.zero_grad()``), then the mean
    cross-entropy, ``backward()`` (FSDP reduce-scatters and averages the
    gradients over ranks) and ``optimizer.step()``. Leave the gradients in
    place after the step: the grader counts their bytes.
    """
    # YOUR CODE HERE
    raise NotImplementedError


def export_full_state_dict(model: nn.Module, path: str | Path) -> dict | None:
    """Gather the full state dict on rank 0 and ``torch.save`` it to ``path`` there.

    Use ``get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
    cpu_offload=True))``: every rank must call it (it all-gathers), and with
    ``cpu_offload`` only rank 0 receives the tensors (plain CPU tensors, keys
    like ``blocks.0.fc1.weight``). Save on rank 0 only and return the dict
    there; return ``None`` on the other ranks.
    """
    # YOUR CODE HERE
    raise NotImplementedError


def train_fsdp(model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]], *, lr: float,
               export_path: str | Path) -> tuple[nn.Module, torch.optim.Optimizer]:
    """Shard, build the optimizer, train on this rank's micro-batches, export; return ``(model, optimizer)``.

    The order matters: ``shard`` before ``make_optimizer`` (see there), then
    one ``train_step`` per ``(x, y)`` in ``batches``, print the last loss on
    rank 0 only, and ``export_full_state_dict(model, export_path)`` on every rank.
    """
    # YOUR CODE HERE
    raise NotImplementedError
