"""A mixture-of-experts FFN layer in one process: the router, capacity, the load-balancing loss.

A mixture of experts replaces a transformer's one FFN by ``E`` of them and sends each token to
``k`` of them (Shazeer et al., 2017, "Outrageously Large Neural Networks": a softmax over a linear
map of the token, the top ``k`` kept). Parameters grow with ``E``; the compute per token does not.

GShard (Lepikhin et al., 2020, sec. 2.2) gives every expert a **capacity** per group of tokens,
``C = ceil(capacity_factor * tokens * k / E)``: the first ``C`` tokens of a group routed to an
expert are processed, the rest are **dropped** (their output is zero; in a transformer the
residual connection carries them on). Fixed sizes are what accelerators and an all-to-all want.

A router left alone sends most tokens to a few experts. The Switch Transformer's auxiliary loss
(Fedus et al., 2021, eq. 4), ``E * sum_i f_i * P_i`` with ``f_i`` the fraction of tokens whose
first choice is expert ``i`` and ``P_i`` the router's mean probability for ``i``, is smallest
(1.0) when both are uniform. This module is the single-process reference every expert-parallel
version (``dispatch``, exercise 11) is compared with: ``groups=W`` is the capacity each of ``W``
ranks applies to its own tokens.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class Routing:
    """The router's decision for ``T`` tokens: ``probs`` (T x E), ``experts`` and ``gates`` (T x k)."""
    probs: torch.Tensor
    experts: torch.Tensor
    gates: torch.Tensor


class Router(nn.Module):
    """Top-``k`` gating (Shazeer et al., 2017): ``softmax(x W)``, the ``k`` largest kept, and their
    probabilities renormalised to sum to 1 when ``k > 1`` (Switch's top-1 keeps the probability itself)."""

    def __init__(self, hidden: int, n_experts: int, top_k: int = 1):
        super().__init__()
        self.gate, self.top_k = nn.Linear(hidden, n_experts, bias=False), top_k

    def select(self, probs: torch.Tensor) -> torch.Tensor:
        """The ``k`` experts each token goes to (``T x k``): here the ``k`` most probable."""
        return probs.topk(self.top_k, dim=-1).indices

    def forward(self, x: torch.Tensor) -> Routing:
        probs = F.softmax(self.gate(x).float(), dim=-1)  # float32: a bf16 softmax ties experts it should not
        experts = self.select(probs)
        gates = probs.gather(1, experts)   # the chosen experts' probabilities weigh their outputs
        if self.top_k > 1:
            gates = gates / gates.sum(dim=-1, keepdim=True)
        return Routing(probs, experts, gates.to(x.dtype))


def capacity(tokens: int, n_experts: int, top_k: int = 1, capacity_factor: float = 1.25) -> int:
    """GShard's expert capacity for a group of ``tokens``: slots each expert processes, at most."""
    return math.ceil(capacity_factor * tokens * top_k / n_experts)


@dataclass
class Slots:
    """One slot per (token, choice), token-major (``T * k`` of them): the token, its expert, its gate,
    its place in its expert's queue within its group (earlier tokens first, GShard's order), and
    whether that place is within capacity."""
    token: torch.Tensor
    expert: torch.Tensor
    gate: torch.Tensor
    position: torch.Tensor
    keep: torch.Tensor

    @property
    def dropped(self) -> int:
        return int((~self.keep).sum())


def assign(routing: Routing, n_experts: int, cap: int, groups: int = 1) -> Slots:
    """The slots of ``routing``, each placed in its expert's queue; ``groups`` contiguous groups of
    tokens (one per rank in expert parallelism) each have their own capacity ``cap``."""
    tokens, k = routing.experts.shape
    token = torch.arange(tokens, device=routing.experts.device).repeat_interleave(k)
    expert = routing.experts.reshape(-1)
    queue = token * groups // tokens * n_experts + expert        # (group, expert): one queue each
    counts = F.one_hot(queue, groups * n_experts).cumsum(dim=0)  # slots so far in each queue
    position = counts.gather(1, queue[:, None]).squeeze(1) - 1
    return Slots(token, expert, routing.gates.reshape(-1), position, position < cap)


def load_balancing_loss(routing: Routing, n_experts: int) -> torch.Tensor:
    """Switch Transformer's auxiliary loss (Fedus et al., 2021, eq. 4): ``E * sum_i f_i P_i``; 1.0 when
    balanced. ``f`` (a count) carries no gradient; ``P`` does, and pulls the router towards balance."""
    f = torch.bincount(routing.experts[:, 0], minlength=n_experts).float() / routing.experts.shape[0]
    return n_experts * (f * routing.probs.mean(dim=0)).sum()


def tokens_per_expert(slots: Slots, n_experts: int) -> torch.Tensor:
    """Slots each expert processes (dropped ones not counted)."""
    return torch.bincount(slots.expert[slots.keep], minlength=n_experts)


def expert_mlp(hidden: int, ffn: int) -> nn.Sequential:
    """One expert: the transformer's FFN, ``Linear -> GELU -> Linear``."""
    return nn.Sequential(nn.Linear(hidden, ffn), nn.GELU(), nn.Linear(ffn, hidden))


@dataclass
class MoEOutput:
    y: torch.Tensor
    aux_loss: torch.Tensor
    tokens_per_expert: torch.Tensor
    dropped: int
    slots: Slots


class MoE(nn.Module):
    """The MoE FFN block on tokens of shape ``[tokens, hidden]``: route, keep each expert's first
    ``capacity`` slots per group, run each expert on its slots, and add ``gate * expert(x)`` into each
    slot's token. Dropped slots add nothing."""

    def __init__(self, hidden: int, ffn: int, n_experts: int, top_k: int = 1, capacity_factor: float = 1.25):
        super().__init__()
        self.router = Router(hidden, n_experts, top_k)
        self.experts = nn.ModuleList(expert_mlp(hidden, ffn) for _ in range(n_experts))
        self.capacity_factor = capacity_factor

    @property
    def n_experts(self) -> int:
        return len(self.experts)

    def route(self, x: torch.Tensor, groups: int = 1) -> tuple[Routing, Slots]:
        """The routing of ``x`` and its slots, capacity counted per group of ``len(x) // groups`` tokens."""
        routing = self.router(x)
        cap = capacity(x.shape[0] // groups, self.n_experts, self.router.top_k, self.capacity_factor)
        return routing, assign(routing, self.n_experts, cap, groups)

    def forward(self, x: torch.Tensor, groups: int = 1) -> MoEOutput:
        routing, slots = self.route(x, groups)
        y = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            sel = (slots.keep & (slots.expert == e)).nonzero().squeeze(1)
            tok = slots.token[sel]
            y = y.index_add(0, tok, slots.gate[sel, None] * expert(x[tok]))
        return MoEOutput(y, load_balancing_loss(routing, self.n_experts), tokens_per_expert(slots, self.n_experts),
                         slots.dropped, slots)


def seeded_moe(seed: int, **kwargs) -> MoE:
    """The same :class:`MoE` in every process (``kwargs``: its constructor's)."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return MoE(**kwargs)
