"""Exercise 9: a job that hangs, diagnosed and fixed.

``train_broken`` below is a data-parallel training loop written by hand (no DDP): every rank
computes the summed loss of the samples of its local batch that count (``keep``: padding and
ignored labels do not), all-reduces the number of samples that count and every gradient, and
takes an SGD step on the mean over the whole global batch. It hangs: a rank whose batch has no
sample to keep skips the step, and with it the step's collectives, while its peer waits in them
(notebook 09, part 4, shows the tools that say so: ``TORCH_DISTRIBUTED_DEBUG=DETAIL``,
``monitored_barrier``, a stack dump of every rank; and the grader names each rank's line).

Write ``train``, the same job without the hang. A collective completes only when every rank
calls it, in the same order, with the same shapes, so every rank must make every step's
collectives, whatever its data. Keep the job's meaning: a rank with nothing to keep still takes
part, with a zero gradient and a count of 0; the other ranks' samples are still learnt from.

Check your work with ``.venv/bin/python -m autograder grade --exercise 9`` or ``check(9)`` at the end of
the notebook ``course/09_communication``. Every function raises ``NotImplementedError`` until you
fill it in.
"""
from __future__ import annotations

from typing import Iterable

import torch
import torch.distributed as dist
from torch import nn


def train_broken(model: nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], *,
                 lr: float) -> nn.Module:
    """The given job (not graded): it hangs as soon as one rank has a batch with nothing to keep."""
    for x, y, keep in batches:
        if not keep.any():
            continue  # "nothing to learn from here": this rank skips the all-reduces below
        loss = nn.functional.cross_entropy(model(x[keep]), y[keep], reduction="sum")
        model.zero_grad()
        loss.backward()
        count = keep.sum().to(torch.float32)
        dist.all_reduce(count)
        with torch.no_grad():
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p -= lr * p.grad / count
    return model


def train(model: nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], *,
          lr: float) -> nn.Module:
    """``train_broken`` without the hang; runs on every rank, returns the trained ``model``.

    Args:
        model: the same initial weights on every rank (no DDP: the gradients are all-reduced here).
        batches: this rank's local batches, one per step, the same number on every rank:
            ``x`` (B x features), ``y`` (B class indices) and ``keep`` (B booleans: which samples
            count). ``keep`` may be all False on some ranks at some steps.
        lr: the SGD learning rate.

    Each step must update the weights on every rank exactly as one process would with
    ``torch.optim.SGD(lr=lr)`` on the mean cross-entropy over the kept samples of the *global*
    batch (every rank's batch of that step, together):
    ``sum over every rank's kept samples of the loss / number of kept samples on all ranks``.
    Every rank makes the same collectives at every step, in the same order, whatever its data; a
    rank with no kept sample contributes a zero gradient and a count of 0 (a step with no kept
    sample on any rank changes nothing). Use ``dist.all_reduce`` (a sum) on the default group.
    """
    ### BEGIN SOLUTION
    for x, y, keep in batches:
        # No branch on this rank's data before a collective: an empty selection gives a loss of 0
        # and zero gradients, which is exactly this rank's share of the global sum.
        loss = nn.functional.cross_entropy(model(x[keep]), y[keep], reduction="sum")
        model.zero_grad()
        loss.backward()
        count = keep.sum().to(torch.float32)
        dist.all_reduce(count)
        with torch.no_grad():
            for p in model.parameters():
                grad = p.grad if p.grad is not None else torch.zeros_like(p)
                dist.all_reduce(grad)
                if count > 0:  # the same on every rank: count is the all-reduced, global one
                    p -= lr * grad / count
    return model
    ### END SOLUTION
