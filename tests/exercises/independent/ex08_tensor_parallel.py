"""Exercise 8, written independently of the reference: the shards cut with ``narrow`` from computed
offsets and copied with ``contiguous().clone()``, the all-reduces imported by name and made in place
on a fresh tensor, the forward written with ``x @ W.T`` rather than ``F.linear``. Graded by
tests/exercises/test_ex08_tensor_parallel.py."""
from __future__ import annotations

import torch
from torch import nn
from torch.distributed import ReduceOp, all_reduce


class CopyToParallelRegion(torch.autograd.Function):
    """Megatron's ``f``: identity forward, all-reduced gradient."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        total = torch.empty_like(grad, memory_format=torch.contiguous_format).copy_(grad)
        all_reduce(total, op=ReduceOp.SUM)
        return total


class ReduceFromParallelRegion(torch.autograd.Function):
    """Megatron's ``g``: all-reduced forward, identity gradient."""

    @staticmethod
    def forward(ctx, partial: torch.Tensor) -> torch.Tensor:
        total = torch.empty_like(partial, memory_format=torch.contiguous_format).copy_(partial)
        all_reduce(total, op=ReduceOp.SUM)
        return total

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad


def _rows(t: torch.Tensor, dim: int, rank: int, world_size: int) -> torch.Tensor:
    size = t.shape[dim] // world_size
    return t.detach().narrow(dim, rank * size, size).contiguous().clone()


class ColumnParallelLinear(nn.Module):
    """This rank's ``out / world_size`` output features of ``linear``."""

    def __init__(self, linear: nn.Linear, rank: int, world_size: int):
        super().__init__()
        self.weight = nn.Parameter(_rows(linear.weight, 0, rank, world_size))
        self.bias = nn.Parameter(_rows(linear.bias, 0, rank, world_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return CopyToParallelRegion.apply(x) @ self.weight.T + self.bias


class RowParallelLinear(nn.Module):
    """This rank's ``in / world_size`` input features of ``linear``; the bias once, after the sum."""

    def __init__(self, linear: nn.Linear, rank: int, world_size: int):
        super().__init__()
        self.weight = nn.Parameter(_rows(linear.weight, 1, rank, world_size))
        self.bias = nn.Parameter(linear.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ReduceFromParallelRegion.apply(x @ self.weight.T) + self.bias


def parallelize_mlp(mlp: nn.Sequential, rank: int, world_size: int) -> nn.Sequential:
    """This rank's part of ``mlp`` (given, not graded)."""
    first, activation, second = mlp
    return nn.Sequential(ColumnParallelLinear(first, rank, world_size), activation,
                         RowParallelLinear(second, rank, world_size))
