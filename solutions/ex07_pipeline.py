"""Exercise 7: GPipe and 1F1B schedules by hand, with point-to-point send and recv.

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

Then write ``one_f_one_b_step``, the same step under the 1F1B schedule
(PipeDream-Flush): each stage starts a micro-batch's backward as soon as it
can, so it keeps fewer micro-batches' activations alive than GPipe's ``m``.

The process group is already set up; ``stage`` is this rank's part of the
model. Check your work from the repository's root with ``make grade``
(every exercise) or ``.venv/bin/python -m autograder grade --exercise 7`` (this
one), or with ``check(7)`` in the notebook ``course/07_pipeline``.
Each function raises ``NotImplementedError`` until you fill it in.
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


def one_f_one_b_step(stage: nn.Module, x: torch.Tensor, y: torch.Tensor, *, n_microbatches: int,
                     hidden: int) -> torch.Tensor | None:
    """One 1F1B forward and backward (no optimiser step) of a ``p``-stage pipeline, on ``p`` ranks.

    1F1B (Narayanan et al., 2021, "Memory-Efficient Pipeline-Parallel DNN Training", PipeDream-Flush; the
    schedule of Megatron-LM and of ``torch.distributed.pipelining.Schedule1F1B``): stage ``s`` of ``p`` runs
    ``w = min(p - 1 - s, m)`` warm-up forwards, then alternates one forward and one backward (forward of
    micro-batch ``w + i``, backward of micro-batch ``i``) while forwards remain, then the remaining backwards.
    A micro-batch's activations are freed by its backward, so stage ``s`` never holds more than
    ``min(p - s, m)`` of them, against GPipe's ``m``.

    Contract (the grader checks each point):

    * Rank ``s`` holds stage ``s`` of ``p = world size``; every rank is given the whole batch ``x`` and ``y``.
      Micro-batches: ``torch.chunk`` along dim 0 into ``n_microbatches`` (``m >= p``).
    * Stage 0 feeds ``x``'s micro-batches to ``stage``; any other stage receives each activation from
      rank ``s - 1`` (``B / m x hidden``, dtype of ``x``) and makes it require grad. The last stage computes
      ``cross_entropy(logits, y_i) / m`` and backpropagates it; any other stage receives the gradient of its
      output from rank ``s + 1`` and calls ``output.backward(grad)``. A stage other than the first sends the
      gradient of its received activation back to rank ``s - 1`` after each backward.
    * Each stage runs its forwards and backwards in exactly the 1F1B order above, and sends each output
      (or input gradient) as soon as it is computed, before its next forward or backward starts.
    * Two neighbours each send to the other in 1F1B's steady state: post sends with ``dist.isend`` (a
      blocking ``dist.send`` would wait for a receive the peer is not yet at) and wait on their Works before
      returning; receives may block.
    * Afterwards the ``.grad`` of every parameter of ``stage`` is what the unsplit model's backward of the
      mean cross-entropy over the whole batch gives. Return the batch's mean loss (a detached scalar
      tensor) on the last stage, ``None`` on the others.
    """
    ### BEGIN SOLUTION
    rank, p, m = dist.get_rank(), dist.get_world_size(), n_microbatches
    first, last = rank == 0, rank == p - 1
    xs, ys = torch.chunk(x, m), torch.chunk(y, m)
    inputs, outputs, losses, sends = {}, {}, [], []

    def forward(i: int) -> None:
        if first:
            inp = xs[i]
        else:
            inp = torch.empty(ys[i].shape[0], hidden, dtype=x.dtype, device=x.device)
            dist.recv(inp, src=rank - 1)
            inp.requires_grad_()
        out = stage(inp)
        if last:
            out = nn.functional.cross_entropy(out, ys[i]) / m
            losses.append(out.detach())
        else:
            sends.append(dist.isend(out.detach().contiguous(), dst=rank + 1))  # the next stage can start now
        inputs[i], outputs[i] = inp, out

    def backward(i: int) -> None:
        inp, out = inputs.pop(i), outputs.pop(i)  # dropped here: micro-batch i's activations are freed
        if last:
            out.backward()
        else:
            grad = torch.empty_like(out)
            dist.recv(grad, src=rank + 1)
            out.backward(gradient=grad)
        if not first:
            sends.append(dist.isend(inp.grad.contiguous(), dst=rank - 1))

    warm = min(p - 1 - rank, m)
    for i in range(warm):
        forward(i)
    for i in range(m):
        if warm + i < m:
            forward(warm + i)
        backward(i)
    for work in sends:
        work.wait()
    return sum(losses) if last else None
    ### END SOLUTION
