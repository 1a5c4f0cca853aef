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

Then write ``train_uneven`` (part 2, harder): the ranks hold different numbers of batches, as a data set that
does not split evenly leaves them. A rank that runs out and leaves its loop leaves the others waiting in
the next step's collectives, for ever: every rank must take part in every step until no rank has a batch
left, and the job must still mean one process's SGD on the global stream of batches.

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
    # YOUR CODE HERE
    raise NotImplementedError


def train_uneven(model: nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]], *, lr: float) -> nn.Module:
    """Data-parallel SGD when the ranks hold different numbers of batches; runs on every rank, returns ``model``.

    Args:
        model: the same initial weights on every rank, not wrapped (wrap it here if you use
            ``DistributedDataParallel``; writing the collectives by hand is as good).
        batches: this rank's batches ``(x, y)``: ``x`` (B x features), ``y`` (B class indices), with the same B in
            every batch of every rank. How many there are differs between ranks and is not known in advance:
            any rank may have the most, and a rank may have none at all. A stream, as a data loader gives: it has
            no ``len()`` and is read once; take one batch per step.
        lr: the SGD learning rate.

    The job runs as many steps as the longest rank has batches. Step ``t`` (from 0) learns from the ``t``-th
    batch of every rank that still has one, together: it updates the weights exactly as one process would
    with ``torch.optim.SGD(lr=lr)`` on the mean cross-entropy over those samples (with the same B everywhere,
    that is also the mean of the mean losses of the ranks that have a batch; with equal lengths, ordinary
    data-parallel SGD). A rank out of data adds no sample to the step (a zero gradient and a count of 0) but
    still takes part in all of the step's collectives: a rank may leave its loop only at the step where no
    rank has a batch left, the same step on every rank. The weights when the ``t``-th batch of any rank first
    goes through the model's forward are one process's after ``t`` steps, and after the last step every rank
    returns the same weights: one process's that replayed the global stream of batches (step 0's of every
    rank, then step 1's, ...).
    """
    # YOUR CODE HERE
    raise NotImplementedError
