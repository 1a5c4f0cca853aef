"""Exercise 4's single-process references: Adam on the whole global batch of every step, one process.

Both parts train on the same global batches (``workloads.global_batches``) with the same learning rate:
part 2 (FSDP) the model of ``workloads.MODEL``, part 1 (ZeRO-1) the smaller one of ``zero1.ZERO1_MODEL``,
whose parameter count neither world size divides. For part 1 the reference is kept as ZeRO-1 sees
it: the flat parameters (``parameters_to_vector``, ``model.parameters()`` order), so that a rank's
shard, the gradient it averaged and its final weights are compared slice by slice.
"""
from __future__ import annotations

import functools

import torch
from torch import nn
from torch.nn.utils import parameters_to_vector

from distlab.resmlp import make_resmlp

from .workloads import LR, MODEL, SEED, data, global_batches
from .zero1.probes import ZERO1_MODEL


def _train(model: nn.Module, world: int, each_step=None) -> None:
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    x_all, y_all = data().tensors
    for step, idx in enumerate(global_batches(world)):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x_all[idx]), y_all[idx]).backward()
        if each_step:
            each_step(step)
        opt.step()


@functools.cache
def reference(world: int) -> dict:
    """Part 2's: the trained state dict (the same for every file graded)."""
    model = make_resmlp(seed=SEED, **MODEL)
    _train(model, world)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@functools.cache
def zero1_reference(world: int) -> dict:
    """Part 1's, flat: ``initial`` and ``final`` parameters, ``first_grad`` (the mean gradient of the first
    global batch, at the initial weights), each zero-padded to ``W * c``; ``names`` and ``sizes`` of the
    parameters in flat order; ``numel`` (unpadded) and ``c``, one rank's shard."""
    model = make_resmlp(seed=SEED, **ZERO1_MODEL)
    params = list(model.parameters())
    numel = sum(p.numel() for p in params)
    c = -(-numel // world)

    def flat(tensors) -> torch.Tensor:
        return nn.functional.pad(parameters_to_vector(t.detach() for t in tensors), (0, world * c - numel))

    out = {"initial": flat(params), "numel": numel, "c": c, "names": [n for n, _ in model.named_parameters()],
           "sizes": [p.numel() for p in params]}
    _train(model, world, lambda step: out.setdefault("first_grad", flat(p.grad for p in params)))
    out["final"] = flat(params)
    return out


def names_in(world: int, start: int, stop: int) -> tuple[str, str]:
    """The first and last parameter names with elements in ``[start, stop)`` of part 1's flat parameters."""
    ref, names, offset = zero1_reference(world), [], 0
    for name, size in zip(ref["names"], ref["sizes"]):
        if offset < stop and offset + size > start:
            names.append(name)
        offset += size
    return (names[0], names[-1]) if names else ("padding", "padding")
