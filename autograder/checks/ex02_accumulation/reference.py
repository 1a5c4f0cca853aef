"""Exercise 2's single-process reference: the big batch each accumulation window stands for.

The grader compares rank 0's gradient at each optimizer step with the gradient of the window's global
micro-batches concatenated into one batch (``"big"``), and names the usual wrong answers (the sum, the
sum over ``accumulation_steps``, equal weights per micro-batch) beside it, for feedback.
"""
from __future__ import annotations

import functools

import torch
from torch import nn

from distlab.models import cpu_state, make_mlp

from .probes import LR, MODEL, SCENARIOS, micro_batches, windows

WORLD = 2  # the ranks of every launch: a global micro-batch is theirs concatenated


def _grad(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict:
    model.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@functools.lru_cache(maxsize=None)
def _global_micro_batches(scenario: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Micro-step i's global micro-batch: every rank's i-th, concatenated."""
    sizes, _ = SCENARIOS[scenario]
    per_rank = [micro_batches(sizes, r, WORLD) for r in range(WORLD)]
    return [(torch.cat([b[i][0] for b in per_rank]), torch.cat([b[i][1] for b in per_rank])) for i in range(len(sizes))]


def window_gradients(scenario: str, w: int, params: dict) -> dict[str, dict]:
    """At ``params``: window ``w``'s big-batch gradient ``"big"``, and the usual wrong answers (for feedback)."""
    sizes, k = SCENARIOS[scenario]
    win, batches = windows(len(sizes), k)[w], _global_micro_batches(scenario)
    model = make_mlp(seed=5, **MODEL)
    model.load_state_dict(params)
    big = _grad(model, torch.cat([batches[i][0] for i in win]), torch.cat([batches[i][1] for i in win]))
    micro = [_grad(model, *batches[i]) for i in win]
    total = {n: sum(g[n] for g in micro) for n in big}
    return {"big": big, "not divided": total,
            f"divided by accumulation_steps={k}": {n: t / k for n, t in total.items()},
            f"divided by the {len(win)} micro-batches (equal weights)": {n: t / len(win) for n, t in total.items()}}


@functools.lru_cache(maxsize=None)  # one per scenario, shared by every file graded in this process
def reference(scenario: str) -> dict:
    """The final parameters of single-process SGD with each window's big-batch gradient."""
    sizes, k = SCENARIOS[scenario]
    params = cpu_state(make_mlp(seed=5, **MODEL))
    for w in range(len(windows(len(sizes), k))):
        big = window_gradients(scenario, w, params)["big"]
        params = {n: p - LR * big[n] for n, p in params.items()}
    return params
