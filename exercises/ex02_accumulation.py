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
   is the gradient of the mean loss over *all* the window's labels, on all
   ranks: micro-batches may hold padded sequences of different lengths, and
   a mean of their means is not that mean;
2. ``optimizer.step()`` and ``optimizer.zero_grad()`` run once per window;
3. every micro-step except the last of its window runs inside
   ``model.no_sync()``, so DDP all-reduces once per optimizer step.

Check your work from the repository's root with ``make grade`` (every
exercise) or ``.venv/bin/python -m autograder grade --exercise 2`` (this one),
or with ``check(2)`` in the notebook ``course/02_gradient_accumulation``.
The function raises ``NotImplementedError`` until you fill it in.
"""
from __future__ import annotations

import contextlib
from typing import Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

IGNORE_INDEX = -100  # cross_entropy's default ignore_index: the label of a padding token


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

    Contract (the grader checks each point, at world size 2; the padded sequences again at 4, on 2 nodes):

    * ``model`` is already wrapped in ``DistributedDataParallel``; ``optimizer``
      optimises its parameters, and gradients are zero (``None``) on entry.
      ``micro_batches`` are ``(x, y)`` pairs on the model's device, used in order.
      ``model(x)`` returns logits of shape ``y.shape + (C,)``: ``y`` holds one
      label per sample (shape ``(B,)``) or one per token of padded sequences
      (shape ``(B, T)``), where a label equal to ``IGNORE_INDEX`` (-100) marks
      padding. Sizes and token counts may differ between micro-batches *and*
      between ranks.
    * The windows are ``windows(len(micro_batches), accumulation_steps)``: a
      final window shorter than ``accumulation_steps`` still ends with an
      optimizer step, normalised over its own labels (as below).
    * Loss: each optimizer step must use the gradient of the mean
      cross-entropy over every non-padding label of the window, on *all*
      ranks together: exactly the step of one process given the window's
      global batch (every rank's micro-batches concatenated). ``N`` is that
      count of non-padding labels, summed over the window's micro-batches and
      over the ranks. Remember that DDP *averages* the ranks' gradients (it
      divides their sum by the world size).
    * At the end of each window, and only there: ``optimizer.step()`` then
      ``optimizer.zero_grad()``.
    * Run every micro-step that is not the last of its window (forward *and*
      backward) inside ``with model.no_sync():`` so DDP all-reduces the
      gradients once per optimizer step; the ranks' ``.grad`` differ in between.
      (A collective of your own, outside DDP, is not counted against this.)
    * Return (not graded) each window's loss as a Python float: this rank's
      share of the window's global token mean (its summed loss over ``N``).
    """
    # YOUR CODE HERE
    raise NotImplementedError
