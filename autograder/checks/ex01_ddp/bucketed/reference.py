"""One process's training of part 2's model, the reference every ``BucketedDDP`` run is compared with: the
same start (rank 0's weights after the broadcast), the whole global batch each step, plain SGD. Grading side."""
from __future__ import annotations

import functools
import hashlib

import torch
from torch import nn

from distlab.models import cpu_state

from .observations import LR, batch, expected_buckets, make_model


# The runs already computed in this process, by what they depend on: every cap starts from the same weights (rank 0's,
# broadcast), so the criteria, which ask for each cap's and again for the first's, would train the same run 10 times.
# A few kept (a test grades many files in one process), the oldest dropped first.
_RUNS: dict[tuple, dict] = {}
_KEPT = 16


def reference(start: dict[str, torch.Tensor], world: int, steps: int, *, unused: bool = False) -> dict:
    """``{"grads": first step's gradient by name (None for a parameter without one), "final": the weights}``
    (shared between callers with the same arguments: read it, never write to it)."""
    key = _key(start, world, steps, unused)
    if key is None:
        return _train(start, world, steps, unused)
    if key not in _RUNS:
        if len(_RUNS) >= _KEPT:
            del _RUNS[next(iter(_RUNS))]
        _RUNS[key] = _train(start, world, steps, unused)
    return _RUNS[key]


def _key(start: dict[str, torch.Tensor], world: int, steps: int, unused: bool) -> tuple | None:
    """The start's exact bytes (hashed) and the other arguments; ``None`` where a tensor cannot be read as bytes
    (then the run is not kept)."""
    digest = hashlib.sha256()
    try:
        for name, tensor in start.items():
            flat = tensor.detach().cpu().reshape(-1)
            digest.update(f"{name} {flat.dtype} {list(tensor.shape)}\0".encode())
            digest.update(flat.view(torch.uint8).numpy().tobytes())
    except (RuntimeError, TypeError, AttributeError):
        return None
    return digest.hexdigest(), world, steps, unused


def _train(start: dict[str, torch.Tensor], world: int, steps: int, unused: bool) -> dict:
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
    return list(_bucket_sizes(cap_bytes, unused, forward, past))


@functools.cache  # asked for each cap at every step and by several causes: a model built (and seeded) each time
def _bucket_sizes(cap_bytes: float, unused: bool, forward: bool, past: bool) -> tuple[int, ...]:
    model = make_model(0, unused=unused)
    numel = {n: p.numel() for n, p in model.named_parameters()}
    return tuple(sum(numel[n] for n in b) for b in expected_buckets(model, cap_bytes, forward=forward, past=past))
