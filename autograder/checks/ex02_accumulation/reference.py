"""Exercise 2's single-process reference: the big batch each accumulation window stands for.

The grader compares rank 0's gradient at each optimizer step with the gradient of the window's global
micro-batches concatenated into one batch (``"big"``: the mean over every non-padding label of the window on
every rank), and names the usual wrong answers (the sum, the sum over ``accumulation_steps``, equal weights
per micro-batch, a rank's own token count, padding counted, DDP's average not undone) beside it, for feedback.
"""
from __future__ import annotations

import functools

import torch
from torch import nn

from distlab.models import cpu_state, make_mlp

from .scenarios import IGNORE_INDEX, LR, MODEL, SCENARIOS, micro_batches, token_batches, windows

WORLD = 2  # the ranks of the launch of every scenario (a global micro-batch is theirs concatenated); see NODES


def _grad(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict:
    model.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@functools.lru_cache(maxsize=None)
def rank_batches(scenario: str, world: int = WORLD) -> list[list[tuple[torch.Tensor, torch.Tensor, int]]]:
    """Every rank's micro-batches as the ranks got them, flattened to their non-padding labels
    ``(x, y, number of labels padding included)``."""
    sizes, _ = SCENARIOS[scenario]
    out = []
    for r in range(world):
        batches = token_batches(r, world) if scenario == "tokens" else micro_batches(sizes, r, world)
        out.append([(x[y != IGNORE_INDEX], y[y != IGNORE_INDEX], y.numel()) for x, y in batches])
    return out


def window_gradients(scenario: str, w: int, params: dict, world: int = WORLD) -> dict[str, dict]:
    """At ``params``: window ``w``'s big-batch gradient ``"big"`` (the mean over every non-padding label of
    the window on every one of ``world`` ranks), and the usual wrong answers (for feedback), each as DDP would
    average it."""
    sizes, k = SCENARIOS[scenario]
    win, per_rank = windows(len(sizes), k)[w], rank_batches(scenario, world)
    model = make_mlp(seed=5, **MODEL)
    model.load_state_dict(params)
    big = _grad(model, torch.cat([b[i][0] for b in per_rank for i in win]),
                torch.cat([b[i][1] for b in per_rank for i in win]))
    # g[r][j]: rank r's mean over the labels of the window's j-th micro-batch; n: their count; pad: with padding.
    g = [[_grad(model, *b[i][:2]) for i in win] for b in per_rank]
    n = [[len(b[i][1]) for i in win] for b in per_rank]
    pad = sum(b[i][2] for b in per_rank for i in win)

    def ddp_mean(local):  # DDP averages the ranks' accumulated gradients
        return {name: sum(local(r, name) for r in range(world)) / world for name in big}

    total = ddp_mean(lambda r, name: sum(gj[name] for gj in g[r]))
    out = {"big": big, "not divided": total,
           f"divided by accumulation_steps={k}": {name: t / k for name, t in total.items()},
           f"divided by the {len(win)} micro-batches (equal weights)":
               {name: t / len(win) for name, t in total.items()},
           f"summed over the labels, divided by N and then averaged by DDP over {world} ranks (1/{world} of the mean)":
               {name: b / world for name, b in big.items()}}
    # each rank's own count (not all-reduced), times the world size as for the global one: the ranks' means summed
    own = ddp_mean(lambda r, name: sum(nj * gj[name] for nj, gj in zip(n[r], g[r])) / sum(n[r]))
    out[f"normalised by each rank's own count and multiplied by the world size ({world})"] = {
        name: world * v for name, v in own.items()}
    if scenario == "tokens":
        out["normalised by each rank's own token count"] = own
        tokens = sum(map(sum, n))
        out[f"normalised with padding included ({pad} labels)"] = {name: b * tokens / pad for name, b in big.items()}
    return out


@functools.lru_cache(maxsize=None)  # one per scenario and world size, shared by every file graded in this process
def reference(scenario: str, world: int = WORLD) -> dict:
    """The final parameters of single-process SGD with each window's big-batch gradient (``world`` ranks')."""
    sizes, k = SCENARIOS[scenario]
    params = cpu_state(make_mlp(seed=5, **MODEL))
    for w in range(len(windows(len(sizes), k))):
        big = window_gradients(scenario, w, params, world)["big"]
        params = {n: p - LR * big[n] for n, p in params.items()}
    return params
