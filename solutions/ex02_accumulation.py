"""Exercise 2: gradient accumulation equals a larger batch.

A batch too large for memory can be processed as ``k`` micro-batches whose
gradients are summed in ``.grad`` before one optimizer step (the idea behind
the large-batch training of Goyal et al. 2017, "Accurate, Large Minibatch SGD",
when memory is the limit). Done right, the step is *exactly* the step of one
batch ``k`` times larger. Done inside ``DistributedDataParallel``, it also
saves communication: DDP all-reduces gradients at the end of every backward
unless you say otherwise, and you only need the average once per step.

Write ``train_accumulated`` so that:

1. each micro-batch's loss is scaled so the gradient accumulated over a window
   is the gradient of the mean loss over *all* the window's samples;
2. ``optimizer.step()`` and ``optimizer.zero_grad()`` run once per window;
3. every micro-step except the last of its window runs inside
   ``model.no_sync()``, so DDP all-reduces once per optimizer step.

Check your work from the repository's root with ``make grade`` (every
exercise) or ``.venv/bin/python -m autograder --exercise 2`` (this one),
or with ``check(2)`` in the notebook ``course/02_gradient_accumulation``.
The function raises ``NotImplementedError`` until you fill it in.
"""
from __future__ import annotations

import contextlib
from typing import Sequence

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def windows(num_micro_batches: int, accumulation_steps: int) -> list[range]:
    """The micro-batch indices of each optimizer step (given, not graded).

    Consecutive groups of ``accumulation_steps``; the last group is shorter
    when ``accumulation_steps`` does not divide ``num_micro_batches``.

    >>> windows(10, 4)
    [range(0, 4), range(4, 8), range(8, 10)]
    """
    return [range(s, min(s + accumulation_steps, num_micro_batches))
            for s in range(0, num_micro_batches, accumulation_steps)]


def train_accumulated(model: DDP, optimizer: torch.optim.Optimizer,
                      micro_batches: Sequence[tuple[torch.Tensor, torch.Tensor]], *,
                      accumulation_steps: int) -> list[float]:
    """Train ``model`` on this rank's ``micro_batches`` with one optimizer step per window.

    Contract (the grader checks each point, at world size 2):

    * ``model`` is already wrapped in ``DistributedDataParallel``; ``optimizer``
      optimises its parameters, and gradients are zero (``None``) on entry.
      ``micro_batches`` are ``(x, y)`` pairs on the model's device, used in order.
    * The windows are ``windows(len(micro_batches), accumulation_steps)``: a
      final window shorter than ``accumulation_steps`` still ends with an
      optimizer step, normalised over its own samples (as below).
    * Loss: ``cross_entropy(model(x), y)`` is the mean over a micro-batch of
      ``n_i`` samples; multiply it by ``n_i / N`` where ``N`` is the number of
      samples in its window, then ``backward()``. The window's accumulated
      gradient is then the gradient of the mean over all ``N`` samples, as if
      they were one batch; with equal sizes this is dividing by the number of
      micro-batches in the window. (Every rank gets micro-batches of the same
      sizes, so DDP's average over ranks is the mean over the global batch.)
    * At the end of each window, and only there: ``optimizer.step()`` then
      ``optimizer.zero_grad()``.
    * Run every micro-step that is not the last of its window (forward *and*
      backward) inside ``with model.no_sync():`` so DDP all-reduces the
      gradients once per optimizer step; the ranks' ``.grad`` differ in between.
    * Return (not graded) the loss of each window (the mean over its ``N``
      samples on this rank) as a list of Python floats.
    """
    ### BEGIN SOLUTION
    losses = []
    for window in windows(len(micro_batches), accumulation_steps):
        total = sum(len(micro_batches[i][1]) for i in window)
        window_loss = 0.0
        for i in window:
            x, y = micro_batches[i]
            boundary = i == window[-1]
            # Skip DDP's all-reduce until the last micro-batch of the window.
            context = contextlib.nullcontext() if boundary else model.no_sync()
            with context:
                loss = nn.functional.cross_entropy(model(x), y) * (len(y) / total)
                loss.backward()
            window_loss += loss.item()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(window_loss)
    return losses
    ### END SOLUTION
