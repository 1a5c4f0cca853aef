"""Exercise 11's MoE, the same in every rank and in the grading process: its sizes, the tokens and the
output's gradient, and what the single-process MoE computes on every rank's tokens (:func:`reference`).

The probes run the learner's functions in it, and check each result against the reference (a wrong one is
replaced by the right one); the grader compares the ranks' output and gradients with it.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from distlab.lab.expert_parallel import seeded_moe

T, HIDDEN, FFN, TOP_K, CAPACITY_FACTOR, SEED = 24, 8, 16, 1, 1.25, 14
# assert_close against the single-process MoE: the router's gradient is summed over the ranks here,
# over all tokens at once there (float32: measured 3.6e-7 apart at W=2).
RTOL, ATOL = 1e-5, 1e-6


def moe(world: int):
    return seeded_moe(SEED, hidden=HIDDEN, ffn=FFN, n_experts=world, top_k=TOP_K, capacity_factor=CAPACITY_FACTOR)


def data(world: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(SEED + 1)
    return torch.randn(world * T, HIDDEN, generator=gen), torch.randn(world * T, HIDDEN, generator=gen)


@dataclass(frozen=True)
class Slots:
    """One rank's slots in the single-process MoE (one per token and choice: top-1, one per token)."""

    expert: torch.Tensor    # each slot's expert (int64)
    keep: torch.Tensor      # whether the slot is kept (False: dropped at capacity)
    token: torch.Tensor     # each slot's token, among the rank's T
    y_slots: torch.Tensor   # each kept slot's expert output, ungated (0 for a dropped slot)
    send: list[int]         # the kept slots per expert: the rank's input_split_sizes


@dataclass(frozen=True)
class Reference:
    """The single-process MoE on every rank's tokens, capacity per rank (``groups=W``)."""

    y: torch.Tensor                            # its output, W x T rows
    x_grad: torch.Tensor                       # the input's gradient
    router_grad: torch.Tensor                  # the router's gate weight's gradient
    expert_grads: list[dict[str, torch.Tensor]]  # per expert, by parameter name: its gradients
    ranks: list[Slots]                         # per rank: its slots


@functools.lru_cache(maxsize=4)
def reference(world: int) -> Reference:
    """The single-process MoE on every rank's tokens, capacity per rank (``groups=W``): its output and
    gradients, and for each rank its slots and each kept slot's expert output (ungated)."""
    layer, (x, grad) = moe(world), data(world)
    x.requires_grad_()
    out = layer(x, groups=world)
    out.y.backward(grad)
    ranks = []
    for r in range(world):
        xr = x.detach()[r * T:(r + 1) * T]
        _, slots = layer.route(xr)
        with torch.no_grad():
            per_slot = torch.stack([layer.experts[e](xr[t]) for t, e in zip(slots.token.tolist(),
                                                                            slots.expert.tolist())])
        per_slot[~slots.keep] = 0
        ranks.append(Slots(expert=slots.expert, keep=slots.keep, token=slots.token, y_slots=per_slot,
                           send=torch.bincount(slots.expert[slots.keep], minlength=world).tolist()))
    return Reference(y=out.y.detach(), x_grad=x.grad, router_grad=layer.router.gate.weight.grad,
                     expert_grads=[{n: p.grad for n, p in e.named_parameters()} for e in layer.experts], ranks=ranks)
