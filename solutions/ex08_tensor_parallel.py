"""Exercise 8: a tensor-parallel MLP block by hand, with Megatron-LM's ``f`` and ``g``.

A transformer's MLP block, ``Linear(d, h) -> GELU -> Linear(h, d)``, holds most
of its weights. Tensor parallelism splits each weight matrix across the ranks,
instead of the batch (Shoeybi et al., 2019, "Megatron-LM", section 3):

* the first layer is split by its *output* features (Megatron's column-parallel
  ``XA``; in ``nn.Linear``'s ``(out, in)`` weight these are rows): each rank
  computes ``h / W`` of the hidden features from the whole input, and the
  GELU, elementwise, runs on them with no communication;
* the second layer is split by its *input* features (row-parallel; columns of
  ``nn.Linear``'s weight): each rank multiplies its ``h / W`` hidden features
  by the matching columns, a partial sum of the output, and one all-reduce
  adds the ``W`` partial sums up.

Each rank holds 1/W of the weights, and the block costs one all-reduce in the
forward and one in the backward. Megatron writes them as two conjugate
autograd operators: ``f`` (identity forward, all-reduce backward) on the
column-parallel layer's input, ``g`` (all-reduce forward, identity backward)
on the row-parallel layer's output. Write ``f`` and ``g``, then the two layers
that use them; ``parallelize_mlp`` (given) puts the block together.

The process group is already set up (every rank is a tensor-parallel rank)
and every rank is given the same input. Check your work from the repository's
root with ``make grade`` (every exercise) or ``.venv/bin/python -m autograder
--exercise 8`` (this one), or with ``check(8)`` in the notebook
``course/08_tensor_parallel``. The classes raise ``NotImplementedError`` until
you fill them in.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


class CopyToParallelRegion(torch.autograd.Function):
    """Megatron's ``f``, where the column-parallel layer reads its input: ``CopyToParallelRegion.apply(x)``.

    Invariants (the grader checks each):

    * Value: the input every rank already holds whole, the same on every rank; the forward moves
      no bytes.
    * Gradient: the input's gradient is the sum over the W ranks of what each rank's shard of the
      layer contributes; after the backward every rank holds that sum, the same everywhere. This
      is the block's only collective in the backward: one, over the default process group, of the
      input's size (``x.numel() * x.element_size()`` bytes).
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        ### BEGIN SOLUTION
        return x
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        ### BEGIN SOLUTION
        # all_reduce writes in place: reduce a copy, not a buffer autograd may hold (or a broadcast view).
        grad = grad.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(grad)  # op=ReduceOp.SUM, the default
        return grad
        ### END SOLUTION


class ReduceFromParallelRegion(torch.autograd.Function):
    """Megatron's ``g``, where the row-parallel partial sums become the output: ``ReduceFromParallelRegion.apply(p)``.

    Invariants (the grader checks each):

    * Value: each rank's ``p`` is one part of the output, not an estimate of it; the result is their
      sum over the W ranks, the same on every rank. This is the block's only collective in the
      forward: one, over the default process group, of the output's size.
    * Gradient: each partial sum enters the output with weight 1 and every rank already holds the
      output's whole gradient: the backward moves no bytes.
    """

    @staticmethod
    def forward(ctx, partial: torch.Tensor) -> torch.Tensor:
        ### BEGIN SOLUTION
        # all_reduce writes in place: sum into a new tensor, leaving the one F.linear returned as it was.
        out = partial.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(out)  # op=ReduceOp.SUM: each partial sum is a part of the output, not an estimate of it
        return out
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        ### BEGIN SOLUTION
        return grad
        ### END SOLUTION


class ColumnParallelLinear(nn.Module):
    """The block's first layer, split by output features: this rank's ``k = out / world_size`` of them.

    Given the unsplit ``linear = nn.Linear(in, out)``, the same on every rank, ``out`` a multiple of
    ``world_size`` and ``0 <= rank < world_size``. Invariants (the grader checks each):

    * Held: the rank's own block of output features, ``rank*k : (rank+1)*k``: a weight of shape
      ``(k, in)`` (``nn.Linear``'s weight is ``(out, in)``) and a bias of shape ``(k,)``, as the
      module's ``nn.Parameter`` attributes ``weight`` and ``bias``. They are the rank's 1/W of the
      layer: storage of their own (not a view keeping the unsplit tensor alive) and no reference to
      ``linear`` or its tensors, in ``linear``'s dtype and on its device. The shard is cut with the
      ``rank`` given, whatever process builds it (the grader builds other ranks' layers too).
    * Forward: from ``x`` of shape ``(..., in)``, whole and the same on every rank, to this rank's
      features ``rank*k : (rank+1)*k`` of ``linear(x)``, shape ``(..., k)``; no collective.
    * Backward: the gradients of ``weight`` and ``bias`` are the matching slices of the unsplit
      layer's, with no communication; ``x``'s gradient, whole and the same on every rank, is the
      block's one all-reduce in the backward (``f``).
    """

    def __init__(self, linear: nn.Linear, rank: int, world_size: int):
        super().__init__()
        ### BEGIN SOLUTION
        # chunk(..)[rank] is a view into the unsplit weight; clone() keeps a tensor of k rows only.
        self.weight = nn.Parameter(linear.weight.detach().chunk(world_size, dim=0)[rank].clone())
        self.bias = nn.Parameter(linear.bias.detach().chunk(world_size, dim=0)[rank].clone())
        ### END SOLUTION

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ### BEGIN SOLUTION
        return F.linear(CopyToParallelRegion.apply(x), self.weight, self.bias)
        ### END SOLUTION


class RowParallelLinear(nn.Module):
    """The block's second layer, split by input features: this rank's ``k = in / world_size`` of them.

    Given the unsplit ``linear = nn.Linear(in, out)``, the same on every rank, ``in`` a multiple of
    ``world_size``. Invariants (the grader checks each):

    * Held: as ``nn.Parameter`` attributes ``weight`` and ``bias``, with storage of their own and no
      reference to ``linear``, in its dtype: the weight's columns (input features) ``rank*k : (rank+1)*k``
      for the ``rank`` given, shape ``(out, k)``, and the whole bias, shape ``(out,)``, on every rank.
    * Forward: ``x`` of shape ``(..., k)`` holds this rank's features ``rank*k : (rank+1)*k`` of the
      layer's input (the column layer's output, after the activation). The result is ``linear`` of
      the whole input, shape ``(..., out)``, the same on every rank; one collective, of the output's
      size, adds the ranks' partial results (``g``), and the bias is in the output exactly once.
    * Backward: no collective; ``weight``'s and ``bias``'s gradients are the unsplit layer's
      (columns ``rank*k : (rank+1)*k``; the whole bias gradient), and ``x``'s gradient is this
      rank's slice of the unsplit layer's input gradient.
    """

    def __init__(self, linear: nn.Linear, rank: int, world_size: int):
        super().__init__()
        ### BEGIN SOLUTION
        # A column slice is a strided view into the unsplit weight; clone() makes a compact copy.
        self.weight = nn.Parameter(linear.weight.detach().chunk(world_size, dim=1)[rank].clone())
        self.bias = nn.Parameter(linear.bias.detach().clone())
        ### END SOLUTION

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ### BEGIN SOLUTION
        return ReduceFromParallelRegion.apply(F.linear(x, self.weight)) + self.bias
        ### END SOLUTION


def parallelize_mlp(mlp: nn.Sequential, rank: int, world_size: int) -> nn.Sequential:
    """This rank's part of ``mlp`` (given, not graded; the grader assembles the block the same way).

    ``mlp`` is ``nn.Sequential(nn.Linear(d, h), activation, nn.Linear(h, d))``, unsplit and the
    same on every rank, with ``h`` a multiple of ``world_size`` and an elementwise activation
    (GELU: it needs no communication). Returns ``nn.Sequential(ColumnParallelLinear, the same
    activation, RowParallelLinear)``: it maps the whole input ``(..., d)`` to the whole output
    ``(..., d)``, the same on every rank, with one all-reduce in the forward and one in the backward.
    """
    first, activation, second = mlp
    return nn.Sequential(ColumnParallelLinear(first, rank, world_size), activation,
                         RowParallelLinear(second, rank, world_size))
