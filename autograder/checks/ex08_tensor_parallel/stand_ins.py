"""Rank side of exercise 8's substitution (issue 37: a crash in one part never costs another part).

Where the learner's step raised on every rank and one of its layers does not hold its shard (a weight cut
along the wrong dimension makes the forward raise on a shape), the grader steps again with the contract's
layer in place of that one. The grader's layers call the learner's own ``f`` and ``g``
(``CopyToParallelRegion``, ``ReduceFromParallelRegion``), so that those, and the other layer, are still graded.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .reference import shard


class GraderColumn(nn.Module):
    """The contract's ``ColumnParallelLinear`` (rows ``r·H/W:(r+1)·H/W`` of the weight and bias), with the
    learner's ``f`` where it reads its input."""

    def __init__(self, linear: nn.Linear, rank: int, world: int, f):
        super().__init__()
        self.f = f
        self.weight = nn.Parameter(shard(linear.weight.detach(), "column.weight", rank, world).clone())
        self.bias = nn.Parameter(shard(linear.bias.detach(), "column.bias", rank, world).clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.f.apply(x), self.weight, self.bias)


class GraderRow(nn.Module):
    """The contract's ``RowParallelLinear`` (columns ``r·H/W:(r+1)·H/W`` of the weight, the whole bias), with the
    learner's ``g`` on its partial sums and the bias added once, after it."""

    def __init__(self, linear: nn.Linear, rank: int, world: int, g):
        super().__init__()
        self.g = g
        self.weight = nn.Parameter(shard(linear.weight.detach(), "row.weight", rank, world).clone())
        self.bias = nn.Parameter(linear.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.g.apply(F.linear(x, self.weight)) + self.bias


def off_shard(layers: dict[str, nn.Module], unsplit: nn.Sequential, rank: int, world: int) -> list[str]:
    """The layers ("column", "row") whose weight or bias is not this rank's shard of the unsplit block's."""
    off = []
    for name, linear in (("column", unsplit[0]), ("row", unsplit[2])):
        for part in ("weight", "bias"):
            got, want = getattr(layers[name], part, None), shard(getattr(linear, part).detach(), f"{name}.{part}",
                                                                 rank, world)
            if not isinstance(got, torch.Tensor) or got.shape != want.shape or not torch.equal(got.detach(), want):
                off.append(name)
                break
    return off


def stand_in(name: str, unsplit: nn.Sequential, rank: int, world: int, learner) -> nn.Module:
    """The grader's layer ``name`` with the learner's ``f`` or ``g`` (an AttributeError where the file has none)."""
    if name == "column":
        return GraderColumn(unsplit[0], rank, world, learner.CopyToParallelRegion)
    return GraderRow(unsplit[2], rank, world, learner.ReduceFromParallelRegion)
