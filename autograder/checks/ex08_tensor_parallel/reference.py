"""Exercise 8's unsplit block, the same in every rank and in the grading process: its sizes, how each
part is cut, the input and the output's gradient, and what it computes in one process (:func:`unsplit_step`).

The probes cut it with the learner's layers; the grader compares their shards and results with it.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import nn

D, H, B = 16, 96, 12   # block Linear(D, H) -> GELU -> Linear(H, D) on B rows; H/W (48, 24) is neither D nor B
# The contract's x is (..., in): the B rows come as 4 sequences of 3 tokens, as in a transformer (a forward that
# takes only a 2-D x raises on it). 4 leading rows split evenly over W = 2 and 4 (a batch split is seen as such).
LEAD = (4, 3)
X_SHAPE = "x".join(map(str, (*LEAD, D)))  # "4x3x16", as the feedback writes shapes
SEED = 8
PARTS = ("column.weight", "column.bias", "row.weight", "row.bias")
SHARD_DIM = {"column.weight": 0, "column.bias": 0, "row.weight": 1, "row.bias": None}  # None: every rank keeps it
LAYER_CLASS = {"column": "ColumnParallelLinear", "row": "RowParallelLinear"}
# The grader's tolerance against the unsplit block (ex08_tensor_parallel and causes both use it):
# assert_close, not equality, because the all-reduce adds W partial sums over H/W hidden features each,
# another order than the unsplit layer's one sum over H (float32; measured 1.2e-7 apart at W=2, 1.4e-7 at W=4).
RTOL, ATOL = 1e-5, 1e-6


def block() -> nn.Sequential:
    """The unsplit MLP block, the same in every process."""
    with torch.random.fork_rng():
        torch.manual_seed(SEED)
        return nn.Sequential(nn.Linear(D, H), nn.GELU(), nn.Linear(H, D))


def data() -> tuple[torch.Tensor, torch.Tensor]:
    """The block's input ``x`` (``4 x 3 x D``: ``B`` rows) and the gradient the grader backpropagates from its
    output."""
    gen = torch.Generator().manual_seed(SEED + 1)
    return tuple(torch.randn(B, D, generator=gen).reshape(*LEAD, D) for _ in range(2))


@dataclass(frozen=True)
class Unsplit:
    """What the unsplit block computes in one process (the grading process compares with it)."""

    out: torch.Tensor            # its output, 4 x 3 x D
    x_grad: torch.Tensor         # the input's gradient
    hidden: torch.Tensor         # the GELU's output: the hidden features the row layer is given
    weights: dict[str, torch.Tensor]  # each part (PARTS: "column.weight", ...) as the unsplit layers hold it
    grads: dict[str, torch.Tensor]    # each part's gradient


@functools.lru_cache(maxsize=1)
def unsplit_step() -> Unsplit:
    """One forward and backward of the unsplit block on :func:`data`."""
    net = block()
    x, grad_out = data()
    x.requires_grad_()
    hidden = net[1](net[0](x))
    out = net[2](hidden)
    out.backward(grad_out)
    params = {part: getattr(net[0 if part.startswith("column") else 2], part.split(".")[1]) for part in PARTS}
    return Unsplit(out=out.detach(), x_grad=x.grad, hidden=hidden.detach(),
                   weights={k: p.detach() for k, p in params.items()}, grads={k: p.grad for k, p in params.items()})


def shard(full: torch.Tensor, part: str, rank: int, world: int) -> torch.Tensor:
    """Rank ``rank``'s shard of ``full`` (a weight, a bias, or their gradient) for ``part``."""
    dim = SHARD_DIM[part]
    return full if dim is None else full.chunk(world, dim=dim)[rank]
