"""Exercise 3, written independently of the reference: the autocast context chosen up front, clipping
imported by name, a hand-written timing loop on ``timeit``'s clock imported by name (``from timeit
import default_timer``) with ``statistics.median``, the saved storages counted by a hooks object, and
the accumulation window weighting each micro-batch's loss by its share of the samples, with the loss summed as a tensor.
Graded by tests/exercises/test_ex03_amp.py."""
from __future__ import annotations

import statistics
from contextlib import nullcontext
from timeit import default_timer
from typing import Callable

import torch
import torch.nn.functional as F
from torch import autocast, nn
from torch.autograd.graph import saved_tensors_hooks
from torch.nn.utils import clip_grad_norm_
from typing import Sequence


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, *,
               amp_dtype: torch.dtype | None, scaler: torch.amp.GradScaler | None = None,
               max_norm: float = 1.0) -> torch.Tensor:
    """One step on the mean cross-entropy; the loss, detached, in float32."""
    optimizer.zero_grad(set_to_none=True)
    region = nullcontext() if amp_dtype is None else autocast(device_type=x.device.type, dtype=amp_dtype)
    with region:
        logits = model(x)
        loss = F.cross_entropy(logits, y)
    params = [p for p in model.parameters() if p.requires_grad]
    if scaler is not None:
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        clip_grad_norm_(params, max_norm=max_norm)
        scaler.step(optimizer)
        scaler.update()
    else:
        loss.backward()
        clip_grad_norm_(params, max_norm=max_norm)
        optimizer.step()
    return loss.detach().to(torch.float32)


def median_seconds(fn: Callable[[], object], sync: Callable[[], None], *, warmup: int = 3,
                   min_run_time: float = 0.2) -> float:
    """The median seconds of one ``fn(); sync()``, after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
        sync()
    samples: list[float] = []
    while sum(samples) < min_run_time or len(samples) < 5:
        began = default_timer()
        fn()
        sync()
        samples.append(default_timer() - began)
    return statistics.median(samples)


class _StorageCounter(saved_tensors_hooks):
    """Packs nothing away; notes each saved tensor's storage once."""

    def __init__(self):
        self.sizes: dict[int, int] = {}
        super().__init__(self._pack, lambda packed: packed)

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        self.sizes.setdefault(storage.data_ptr(), storage.nbytes())
        return tensor


def saved_bytes(fn: Callable[[], object]) -> int:
    """Bytes of the storages autograd saves for backward while ``fn()`` runs, each storage once."""
    counter = _StorageCounter()
    with counter:
        fn()
    return sum(counter.sizes.values())


def compare(baseline: Callable[[], object], candidate: Callable[[], object], *, sync: Callable[[], None],
            warmup: int = 3, min_run_time: float = 0.2) -> dict:
    """Speed-up and memory ratio of ``candidate`` against ``baseline``."""
    seconds = {name: median_seconds(fn, sync, warmup=warmup, min_run_time=min_run_time)
               for name, fn in (("baseline", baseline), ("candidate", candidate))}
    sizes = {name: saved_bytes(fn) for name, fn in (("baseline", baseline), ("candidate", candidate))}
    result = {"baseline_s": seconds["baseline"], "candidate_s": seconds["candidate"],
              "baseline_bytes": sizes["baseline"], "candidate_bytes": sizes["candidate"]}
    result["speedup"] = result["baseline_s"] / result["candidate_s"]
    result["memory_ratio"] = result["candidate_bytes"] / result["baseline_bytes"]
    print(f"speed-up {result['speedup']:.2f}x, memory ratio {result['memory_ratio']:.2f}")
    return result


def accumulated_step(model: nn.Module, optimizer: torch.optim.Optimizer,
                     micro_batches: Sequence[tuple[torch.Tensor, torch.Tensor]], *,
                     scaler: torch.amp.GradScaler, max_norm: float = 1.0) -> torch.Tensor:
    """One float16 step over the window; each micro-batch weighted by its share of the samples."""
    for p in model.parameters():
        p.grad = None
    samples = sum(len(mb_y) for _, mb_y in micro_batches)
    window_loss = torch.zeros((), device=micro_batches[0][0].device)
    for mb_x, mb_y in micro_batches:
        share = len(mb_y) / samples
        with autocast(device_type=mb_x.device.type, dtype=torch.float16):
            part = F.cross_entropy(model(mb_x), mb_y) * share
        scaler.scale(part).backward()
        window_loss += part.detach().float()
    scaler.unscale_(optimizer)
    clip_grad_norm_([p for p in model.parameters() if p.grad is not None], max_norm)
    scaler.step(optimizer)
    scaler.update()
    return window_loss
