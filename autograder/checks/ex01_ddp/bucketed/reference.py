"""One process's training of part 2's model, the reference every ``BucketedDDP`` run is compared with: the
same start (rank 0's weights after the broadcast), the whole global batch each step, plain SGD. Grading side."""
from __future__ import annotations

import torch
from torch import nn

from distlab.models import cpu_state

from .observations import LR, batch, expected_buckets, make_model


def reference(start: dict[str, torch.Tensor], world: int, steps: int, *, unused: bool = False) -> dict:
    """``{"grads": first step's gradient by name (None for a parameter without one), "final": the weights}``."""
    model = make_model(0, unused=unused)
    model.load_state_dict(start)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    grads: dict = {}
    for i in range(steps):
        x, y = batch(i, world)
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()  # the mean of the ranks' equal-sized means
        if i == 0:
            grads = {n: (p.grad.clone() if p.grad is not None else None) for n, p in model.named_parameters()}
        optimizer.step()
    return {"grads": grads, "final": cpu_state(model)}


def bucket_sizes(cap_bytes: float, *, unused: bool = False, forward: bool = False, past: bool = False) -> list[int]:
    """Elements in each bucket the cap makes (the contract's rule; ``forward``: filled in registration order;
    ``past``: a bucket closes only once it exceeds the cap), in the order they complete in the backward."""
    model = make_model(0, unused=unused)
    numel = {n: p.numel() for n, p in model.named_parameters()}
    return [sum(numel[n] for n in b) for b in expected_buckets(model, cap_bytes, forward=forward, past=past)]
