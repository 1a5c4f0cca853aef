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
    """Megatron's ``f``, applied to the column-parallel layer's input: ``CopyToParallelRegion.apply(x)``.

    Contract (the grader checks each point):

    * Forward: return ``x`` unchanged, with no communication (every rank already holds the whole input).
    * Backward: all-reduce (sum) the incoming gradient over the default process group and return the
      result: each rank's shard of the layer contributes one part of the input's gradient, and the
      input's gradient is their sum, the same on every rank. One collective, an all-reduce, in the backward.
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
    """Megatron's ``g``, applied to the row-parallel layer's partial sums: ``ReduceFromParallelRegion.apply(p)``.

    Contract (the grader checks each point):

    * Forward: return the all-reduce (sum) of ``p`` over the default process group, the same on
      every rank: the whole output. One collective, an all-reduce, in the forward.
    * Backward: return the incoming gradient unchanged, with no communication (every rank's partial
      sum went into the output with weight 1, and every rank holds the output's whole gradient).
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

    Contract (the grader checks each point):

    * ``linear`` is the unsplit ``nn.Linear(in, out)``, the same on every rank; ``out`` is a multiple
      of ``world_size``, and ``rank`` is this rank's index (``0 <= rank < world_size``).
    * Keep, as ``nn.Parameter`` attributes, copies (``.clone()``, not views: a view keeps the whole
      unsplit tensor alive) of this rank's shard, and no reference to ``linear``:
      ``self.weight``: rows ``rank*k : (rank+1)*k`` of ``linear.weight``, shape ``(k, in)``;
      ``self.bias``: elements ``rank*k : (rank+1)*k`` of ``linear.bias``, shape ``(k,)``.
    * ``forward(x)``: ``x`` is ``(..., in)``, the whole input, the same on every rank. Return
      ``F.linear(f(x), self.weight, self.bias)``, shape ``(..., k)``: this rank's features
      ``rank*k : (rank+1)*k`` of ``linear(x)``. ``f`` is ``CopyToParallelRegion.apply``: no
      collective in the forward; the backward all-reduces ``x``'s gradient.
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

    Contract (the grader checks each point):

    * ``linear`` is the unsplit ``nn.Linear(in, out)``, the same on every rank; ``in`` is a multiple
      of ``world_size``, and ``rank`` is this rank's index.
    * Keep, as ``nn.Parameter`` attributes, copies (not views) and no reference to ``linear``:
      ``self.weight``: columns ``rank*k : (rank+1)*k`` of ``linear.weight``, shape ``(out, k)``;
      ``self.bias``: the whole ``linear.bias``, shape ``(out,)`` (every rank keeps it).
    * ``forward(x)``: ``x`` is ``(..., k)``, this rank's features ``rank*k : (rank+1)*k`` of the
      layer's input (a ``ColumnParallelLinear``'s output, after the activation). Return
      ``g(F.linear(x, self.weight)) + self.bias``, shape ``(..., out)``, the same on every rank:
      ``g`` is ``ReduceFromParallelRegion.apply``, one all-reduce in the forward that adds up the
      ranks' partial sums, and the bias is added once, after it (added before, the all-reduce would
      sum it ``world_size`` times).
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
