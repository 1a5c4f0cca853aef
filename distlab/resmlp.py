"""A residual MLP built from repeated blocks: the model the FSDP and checkpointing lessons shard.

FSDP shards "per block" (one ``fully_shard`` unit per transformer block in a
real LLM). Here a block is ``x + fc2(dropout(relu(fc1(x))))``, the MLP half of
a transformer block (Vaswani et al., 2017), so the model has the shape that
matters: an input layer, ``depth`` identical blocks in ``model.blocks``, and
a head. The default widths are deliberately *not* multiples of 4, so sharding
on dim 0 across 4 ranks needs padding (FSDP2 pads every shard to
``ceil(rows / W)`` rows).
"""
from __future__ import annotations

import torch
from torch import nn


class Block(nn.Module):
    """One residual MLP block: ``hidden -> 2*hidden -> hidden`` plus the skip connection."""

    def __init__(self, hidden: int, dropout: float = 0.0):
        super().__init__()
        self.fc1 = nn.Linear(hidden, 2 * hidden)
        self.fc2 = nn.Linear(2 * hidden, hidden)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.drop(torch.relu(self.fc1(x))))


class ResidualMLP(nn.Module):
    """``in -> hidden``, ``depth`` :class:`Block` s in ``self.blocks``, ``hidden -> out``."""

    def __init__(self, in_features: int = 64, hidden: int = 90, out_features: int = 10,
                 depth: int = 8, dropout: float = 0.0):
        super().__init__()
        self.inp = nn.Linear(in_features, hidden)
        self.blocks = nn.ModuleList(Block(hidden, dropout) for _ in range(depth))
        self.head = nn.Linear(hidden, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.inp(x))
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def make_resmlp(seed: int, **kwargs) -> ResidualMLP:
    """A :class:`ResidualMLP` whose initial weights depend only on ``seed``."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return ResidualMLP(**kwargs)
