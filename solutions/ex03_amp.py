"""Exercise 3: mixed precision, and measuring what it buys.

Mixed-precision training (Micikevicius et al. 2018, "Mixed Precision
Training") runs the matrix multiplications in a 16-bit type while the master
weights, the optimizer and the reductions stay in float32. In PyTorch that is
``torch.autocast``: inside it, ops on autocast's lower-precision list (``mm``,
``linear``, ``conv``...) cast their inputs to ``dtype`` and ops that need the
range (losses such as ``cross_entropy`` everywhere; ``softmax``, ``sum``, norms
on CUDA) run in float32. bfloat16
has float32's exponent range and needs nothing else; float16 has a 5-bit
exponent, so small gradients underflow to zero unless the loss is scaled up
before backward and the gradients scaled down before the step:
``torch.amp.GradScaler`` (older code spells it ``torch.cuda.amp.GradScaler()``
and ``torch.cuda.amp.autocast()``: deprecated, same thing for CUDA only).

Write:

1. ``train_step``: one optimizer step in float32, bfloat16 or float16 (with a scaler).
2. ``median_seconds`` and ``saved_bytes``: honest measurements of time and memory.
3. ``compare``: the speedup and the memory ratio of a candidate over a baseline.
4. ``accumulated_step``: float16 with loss scaling over k micro-batches, one optimizer step per window
   (notebook 02's accumulation meets the GradScaler: work out where each scaler call belongs).

The grader checks the measuring functions on simulated workloads whose true
cost it knows (slow first calls, outliers, asynchronous work), then reports
what your functions measure on the real model. Check your work from the
repository's root with ``make grade`` (every exercise) or
``.venv/bin/python -m autograder grade --exercise 3`` (this one), or with
``check(3)`` in the notebook ``course/03_mixed_precision``.
Every function raises ``NotImplementedError`` until you fill it in.

The notebooks time and count with ``distlab.measure.timing.median_seconds`` and
``distlab.measure.memory.saved_tensor_bytes``; write your own: the grader recognises
those (imported, aliased, or called from your functions) and gives them no marks.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import nn
from torch.utils import benchmark


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, *,
               amp_dtype: torch.dtype | None, scaler: torch.amp.GradScaler | None = None,
               max_norm: float = 1.0) -> torch.Tensor:
    """One training step on the mean cross-entropy of ``(x, y)``; returns the loss (detached, float32).

    Contract (the grader checks each point):

    * Start with ``optimizer.zero_grad()``.
    * ``amp_dtype=None``: plain float32. Otherwise run the forward pass *and*
      the loss under ``torch.autocast(device_type=x.device.type, dtype=amp_dtype)``
      and the backward pass outside it. Never cast the model: its parameters
      (the master weights) and their gradients stay float32.
    * Clip the gradients' total norm to ``max_norm`` with
      ``torch.nn.utils.clip_grad_norm_`` before the optimizer step.
    * With a ``scaler`` (float16): ``scaler.scale(loss).backward()``, then
      ``scaler.unscale_(optimizer)`` *before* clipping (clip the true gradients,
      not the scaled ones), then ``scaler.step(optimizer)`` (which skips the
      step if any gradient is inf/NaN) and ``scaler.update()``.
    """
    ### BEGIN SOLUTION
    optimizer.zero_grad()
    with torch.autocast(device_type=x.device.type, dtype=amp_dtype or torch.bfloat16,
                        enabled=amp_dtype is not None):
        loss = nn.functional.cross_entropy(model(x), y)
    if scaler is None:
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        optimizer.step()
    else:
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)  # true gradients from here on
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(optimizer)      # skipped when unscale_ found inf/NaN
        scaler.update()             # lower the scale after a skip, raise it after a run of good steps
    return loss.detach().float()
    ### END SOLUTION


def median_seconds(fn: Callable[[], object], sync: Callable[[], None], *, warmup: int = 3,
                   min_run_time: float = 0.2) -> float:
    """The median wall-clock seconds of one ``fn()`` call.

    * Call ``fn(); sync()`` ``warmup`` times untimed first: the first calls of
      a real step are slow (allocator growth, kernel selection, caches).
    * Time ``fn(); sync()`` together: on a GPU ``fn`` returns as soon as its
      kernels are queued, and ``sync()`` waits for them (``torch.cuda.synchronize``).
    * Keep timing until at least ``min_run_time`` seconds were measured, and
      return the *median* per-call time, which one slow call cannot drag.
    * Use a host clock: ``torch.utils.benchmark.Timer`` (recommended: its
      ``blocked_autorange(min_run_time=...)`` returns a ``Measurement`` with a
      ``.median``) or ``time.perf_counter``.
    * Time ``fn`` as its caller runs it, on the caller's torch threads: a ``Timer``
      runs ``stmt`` with its own ``num_threads``, 1 unless it is given
      ``torch.get_num_threads()``.
    """
    ### BEGIN SOLUTION
    for _ in range(warmup):
        fn()
        sync()
    timer = benchmark.Timer(stmt="fn(); sync()", globals={"fn": fn, "sync": sync},
                            num_threads=torch.get_num_threads())
    return timer.blocked_autorange(min_run_time=min_run_time).median
    ### END SOLUTION


def saved_bytes(fn: Callable[[], object]) -> int:
    """Bytes of the tensors autograd saves for backward while ``fn()`` runs.

    That is the activations and also the weights layers keep for backward
    (``linear`` saves its weight: the float32 parameter itself, or under
    autocast its 16-bit copy); notebook 03 shows the two apart.

    Count every tensor passed to the pack hook of
    ``torch.autograd.graph.saved_tensors_hooks`` once per distinct storage
    (``t.untyped_storage().data_ptr()``), as ``t.untyped_storage().nbytes()``.
    The same count works on any device.
    """
    ### BEGIN SOLUTION
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(storages.values())
    ### END SOLUTION


def compare(baseline: Callable[[], object], candidate: Callable[[], object], *, sync: Callable[[], None],
            warmup: int = 3, min_run_time: float = 0.2) -> dict:
    """How much faster and smaller ``candidate`` is than ``baseline`` (e.g. bf16 vs fp32 steps).

    Return a dict with ``baseline_s`` and ``candidate_s`` (``median_seconds``
    of each, with ``sync``, ``warmup`` and ``min_run_time``), ``speedup`` =
    ``baseline_s / candidate_s`` (above 1: the candidate is faster),
    ``baseline_bytes`` and ``candidate_bytes`` (``saved_bytes`` of one call
    each) and ``memory_ratio`` = ``candidate_bytes / baseline_bytes`` (below
    1: the candidate saves memory).
    """
    ### BEGIN SOLUTION
    baseline_s = median_seconds(baseline, sync, warmup=warmup, min_run_time=min_run_time)
    candidate_s = median_seconds(candidate, sync, warmup=warmup, min_run_time=min_run_time)
    baseline_bytes, candidate_bytes = saved_bytes(baseline), saved_bytes(candidate)
    return {
        "baseline_s": baseline_s, "candidate_s": candidate_s, "speedup": baseline_s / candidate_s,
        "baseline_bytes": baseline_bytes, "candidate_bytes": candidate_bytes,
        "memory_ratio": candidate_bytes / baseline_bytes,
    }
    ### END SOLUTION


def accumulated_step(model: nn.Module, optimizer: torch.optim.Optimizer,
                     micro_batches: Sequence[tuple[torch.Tensor, torch.Tensor]], *,
                     scaler: torch.amp.GradScaler, max_norm: float = 1.0) -> torch.Tensor:
    """One float16 optimizer step over a window of ``k = len(micro_batches)`` micro-batches ``(x, y)`` of
    equal size, with loss scaling; returns the window's loss (detached, float32).

    The step is ``train_step(..., amp_dtype=torch.float16, scaler=scaler)`` on the whole batch (the
    micro-batches concatenated), up to float16 rounding, while autograd holds the activations of one
    micro-batch at a time. Invariants (the grader checks each):

    * Memory: each micro-batch's forward, under float16 autocast, is followed by its own backward
      before the next micro-batch's forward: k backwards per window; the window starts from no gradients.
    * Every backward is of a loss the ``scaler`` has scaled (float16's small gradients would underflow).
    * When the optimizer steps, ``.grad`` holds the gradient of the *whole batch's mean* cross-entropy
      (not the sum of the micro-batches' means), true (no longer multiplied by the scale), with its
      total norm clipped to ``max_norm`` (``torch.nn.utils.clip_grad_norm_``).
    * The scaler takes one step per window: one ``scaler.step(optimizer)`` and one ``scaler.update()``.
      A GradScaler unscales an optimizer's gradients at most once between two updates (it raises
      otherwise) and divides whatever ``.grad`` holds then.
    * If any micro-batch's gradients overflow (inf/NaN), the whole window is skipped (the weights do not
      change) and the scale is lowered once (halved), not once per micro-batch.
    * The loss returned is the whole batch's mean cross-entropy, unscaled.
    """
    ### BEGIN SOLUTION
    optimizer.zero_grad(set_to_none=True)
    k = len(micro_batches)
    window_losses = []
    for xs, ys in micro_batches:
        with torch.autocast(device_type=xs.device.type, dtype=torch.float16):
            micro_loss = nn.functional.cross_entropy(model(xs), ys)
        scaler.scale(micro_loss / k).backward()  # .grad accumulates the scaled mean over the window
        window_losses.append(micro_loss.detach().float())
    scaler.unscale_(optimizer)  # once per window, after the last backward: the true mean gradient
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)  # skips the whole window if any micro-batch overflowed
    scaler.update()         # one update per window: the scale drops once after an overflow
    return torch.stack(window_losses).mean()
    ### END SOLUTION
