"""Exercise 7: a GPipe schedule by hand, with point-to-point send and recv.

A model too big for one device is cut into *stages*, one per rank. Stage 0
holds the first layers, stage 1 the rest and the loss. Run naively, stage 1
waits while stage 0 computes and then stage 0 waits while stage 1 computes:
one device works at a time. GPipe (Huang et al., 2019) cuts the batch into
``m`` micro-batches and streams them: as soon as stage 0 has sent micro-batch
0's activations, stage 1 works on it while stage 0 computes micro-batch 1.

Write ``gpipe_step`` for a 2-stage pipeline:

1. Forward: stage 0 runs each micro-batch and sends its output (the
   activations) to rank 1 with ``dist.send`` *right away*; stage 1 receives each
   with ``dist.recv`` into a buffer, makes it require grad, and computes that micro-batch's loss.
2. Backward: stage 1 backpropagates each micro-batch's loss and sends the
   gradient of its input (``buffer.grad``) back to rank 0; stage 0 receives
   it and continues the backward with ``output.backward(grad)``.
3. Gradients accumulate over micro-batches in ``.grad``: scale each
   micro-batch's loss so the sum is the mean loss of the whole batch.

The process group is already set up; ``stage`` is this rank's part of the
model. Check your work from the repository's root with ``make grade``
(every exercise) or ``.venv/bin/python -m autograder grade --exercise 7`` (this
one), or with ``check(7)`` in the notebook ``course/07_pipeline``.
The function raises ``NotImplementedError`` until you fill it in.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


def split_stages(model: nn.Sequential, boundary: int) -> tuple[nn.Sequential, nn.Sequential]:
    """Layers ``[:boundary]`` are stage 0, ``[boundary:]`` stage 1 (given, not graded)."""
    return model[:boundary], model[boundary:]


def gpipe_step(stage: nn.Module, x: torch.Tensor, y: torch.Tensor, *, n_microbatches: int,
               hidden: int) -> torch.Tensor | None:
    """One GPipe forward and backward (no optimiser step) of a 2-stage pipeline, on 2 ranks.

    Contract (the grader checks each point):

    * Rank 0 holds stage 0, rank 1 stage 1; both are given the whole batch
      ``x`` (``B x in_features``) and ``y`` (``B`` class labels).
    * Split the batch into ``n_microbatches`` equal micro-batches along dim 0
      (``torch.chunk``); ``B`` is a multiple of ``n_microbatches``.
    * Rank 0 calls ``stage`` once per micro-batch and sends each output to
      rank 1 before computing the next one (that is the pipelining).
    * Rank 1 receives each activation (shape ``B / n_microbatches x hidden``,
      dtype of ``x``), calls ``stage`` on it once and computes
      ``cross_entropy(logits, y_i) / n_microbatches``.
    * All forwards, then all backwards, in micro-batch order 0, 1, ... (the GPipe
      schedule; this order is the one point the grader does not check).
      Rank 1 sends the gradient of each received activation back to rank 0,
      which calls ``backward`` on that micro-batch's output with it.
    * Afterwards the ``.grad`` of every parameter of ``stage`` is what the unsplit
      model's backward of the mean cross-entropy over the whole batch gives.
    * Return the whole batch's mean loss (a detached scalar tensor) on rank 1,
      ``None`` on rank 0.
    """
    ### BEGIN SOLUTION
    rank = dist.get_rank()
    m = n_microbatches
    if rank == 0:
        outputs = []
        for x_i in x.chunk(m):
            out = stage(x_i)
            dist.send(out.detach().contiguous(), dst=1)  # stage 1 can start on it now
            outputs.append(out)
        for out in outputs:
            grad = torch.empty_like(out)
            dist.recv(grad, src=1)
            out.backward(grad)
        return None
    inputs, losses = [], []
    for y_i in y.chunk(m):
        act = torch.empty(y_i.shape[0], hidden, dtype=x.dtype, device=x.device)
        dist.recv(act, src=0)
        act.requires_grad_()
        loss = nn.functional.cross_entropy(stage(act), y_i) / m
        inputs.append(act)
        losses.append(loss)
    for act, loss in zip(inputs, losses):
        loss.backward()
        dist.send(act.grad.contiguous(), dst=0)
    return torch.stack(losses).sum().detach()
    ### END SOLUTION
