"""Load balance without an auxiliary loss, and shared experts: DeepSeek's two changes to the MoE layer.

**Auxiliary-loss-free balancing** (Wang et al., 2024, "Auxiliary-Loss-Free Load Balancing Strategy for
Mixture-of-Experts", arXiv:2408.15664; DeepSeek-V3, Liu et al., 2024, arXiv:2412.19437, sec. 2.1.2).
Switch's loss ``E * sum_i f_i P_i`` balances by a gradient that competes with the task's. DeepSeek-V3
instead adds a per-expert **bias** ``b_i`` to the router's scores *for the choice of the top-k only*;
the gate that weighs the expert's output stays the score itself, so the bias changes where tokens go
and not what the layer computes for them, and no gradient flows through it. After each step the bias
moves by a fixed ``gamma`` against the load: ``b_i -= gamma`` for an overloaded expert, ``+= gamma``
for an underloaded one (``gamma * sign(mean load - load_i)``). DeepSeek-V3 scores with a sigmoid; the
course's router keeps its softmax, which changes nothing in the rule.

**Shared experts** (DeepSeekMoE, Dai et al., 2024, arXiv:2401.06066): ``n_shared`` ordinary FFNs that
every token passes through, beside the routed ones. Under expert parallelism a shared expert is
replicated like any dense layer: its tokens never travel, so its compute can hide the dispatch's
all-to-all, and its gradients are all-reduced with the other dense weights.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .moe import (MoE, MoEOutput, Router, Routing, assign, capacity, expert_mlp, load_balancing_loss,
                  tokens_per_expert)


class BiasRouter(Router):
    """:class:`Router` whose top-k is chosen on ``probs + bias``, the gates taken from ``probs``.

    ``bias`` is a buffer (a learned parameter would be pulled by the gradient, which is what this
    method avoids); :func:`update_bias` moves it. With a zero bias the choice is the plain router's.
    """

    def __init__(self, hidden: int, n_experts: int, top_k: int = 1):
        super().__init__(hidden, n_experts, top_k)
        self.register_buffer("bias", torch.zeros(n_experts))

    def select(self, probs: torch.Tensor) -> torch.Tensor:
        """The bias picks; the router's forward still weighs each choice by its probability alone."""
        return (probs + self.bias).topk(self.top_k, dim=-1).indices


@torch.no_grad()
def update_bias(router: BiasRouter, routing: Routing, gamma: float) -> torch.Tensor:
    """DeepSeek-V3's update after a step: ``bias += gamma * sign(mean load - load)``, the load being the
    slots each expert was given (every choice of every token). Returns the load it used."""
    load = torch.bincount(routing.experts.reshape(-1), minlength=router.bias.numel()).float()
    router.bias += gamma * torch.sign(load.mean() - load)
    return load


def with_bias_router(moe: MoE) -> MoE:
    """``moe`` with its router replaced by a :class:`BiasRouter` holding the same weights, bias zero."""
    router = BiasRouter(moe.router.gate.in_features, moe.n_experts, moe.router.top_k)
    router.gate.load_state_dict(moe.router.gate.state_dict())
    moe.router = router
    return moe


class SharedExpertMoE(nn.Module):
    """DeepSeekMoE's layer: ``sum_s shared_s(x) + moe(x).y``, the shared experts on every token."""

    def __init__(self, moe: MoE, n_shared: int, ffn: int):
        super().__init__()
        hidden = moe.router.gate.in_features
        self.moe, self.shared = moe, nn.ModuleList(expert_mlp(hidden, ffn) for _ in range(n_shared))

    def forward(self, x: torch.Tensor) -> MoEOutput:
        out = self.moe(x)
        out.y = out.y + sum(s(x) for s in self.shared)
        return out


@dataclass(frozen=True)
class MoEConfig:
    """An MoE transformer's FFN shape (SwiGLU experts: three ``hidden x ffn`` matrices each)."""
    layers: int          # MoE layers (the dense ones are not counted here)
    hidden: int
    expert_ffn: int
    routed: int
    shared: int
    top_k: int

    def expert_parameters(self) -> int:
        return 3 * self.hidden * self.expert_ffn

    def total_ffn_parameters(self) -> int:
        """Every expert of every MoE layer: what the model must store (and shard)."""
        return self.layers * (self.routed + self.shared) * self.expert_parameters()

    def active_ffn_parameters(self) -> int:
        """The experts one token passes through: ``top_k`` routed and every shared one, per layer."""
        return self.layers * (self.top_k + self.shared) * self.expert_parameters()


#: DeepSeek-V3 (its config.json: 61 layers, the first 3 dense; hidden 7168, moe_intermediate_size 2048,
#: 256 routed and 1 shared expert, 8 routed per token). The paper's totals: 671B parameters, 37B active.
DEEPSEEK_V3 = MoEConfig(layers=61 - 3, hidden=7168, expert_ffn=2048, routed=256, shared=1, top_k=8)


METHODS = ("none", "switch loss", "bias")


def router_training(method: str, x: torch.Tensor, *, steps: int = 100, lr: float = 0.5, gamma: float = 0.01,
                    n_experts: int = 4, capacity_factor: float = 2.0, seed: int = 0) -> dict:
    """Train a top-1 router on ``x`` towards a task that pulls every token to expert 0 (``-mean P_0``,
    a stand-in for a real task's pull), balanced by ``method``: ``"none"``, ``"switch loss"`` (Switch's
    auxiliary loss, weight 1) or ``"bias"`` (DeepSeek-V3's, step ``gamma``). Returns each step's load
    imbalance (the busiest expert's tokens over the mean), the slots each expert keeps at
    ``capacity_factor`` when the trained router (its bias too) routes ``x``, the final mean ``P_0`` (what
    the task asked for) and the router's final weights."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, not {method!r}")
    layer = seeded_moe_router(seed, x.shape[1], n_experts, bias=method == "bias")
    opt = torch.optim.SGD(layer.parameters(), lr=lr)
    imbalance = []
    for _ in range(steps):
        routing = layer(x)
        load = torch.bincount(routing.experts[:, 0], minlength=n_experts).float()
        imbalance.append((load.max() / load.mean()).item())
        loss = -routing.probs[:, 0].mean()
        if method == "switch loss":
            loss = loss + load_balancing_loss(routing, n_experts)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if method == "bias":
            update_bias(layer, routing, gamma)
    with torch.no_grad():
        routing = layer(x)
    kept = tokens_per_expert(assign(routing, n_experts, capacity(len(x), n_experts, 1, capacity_factor)), n_experts)
    return {"imbalance": imbalance, "kept": kept.tolist(), "p0": routing.probs[:, 0].mean().item(),
            "weight": layer.gate.weight.detach().clone()}


def seeded_moe_router(seed: int, hidden: int, n_experts: int, *, bias: bool = False) -> Router:
    """A top-1 router with the same weights in every process (a :class:`BiasRouter` with ``bias``)."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return (BiasRouter if bias else Router)(hidden, n_experts, top_k=1)
