"""Activation recomputation (activation checkpointing) on the residual MLP, measured.

Backward needs what the forward computed: every block of a
:class:`~distlab.resmlp.ResidualMLP` saves its input (for ``fc1``'s weight gradient) and its
ReLU output (for the ReLU and ``fc2``), so the bytes kept grow as O(L) with depth ``L``.
Checkpointing a segment of blocks keeps only the segment's input and runs its forward again
during the backward, when its gradients are needed (Chen et al., 2016, *Training Deep Nets
with Sublinear Memory Cost*):

* every block a segment: the forward keeps ``L`` block inputs, still O(L) but a third of
  the bytes here; the backward recomputes one block at a time;
* segments of ``k = √L`` blocks (Chen et al.'s schedule): the forward keeps ``L/k`` inputs and
  the backward holds one segment's activations, ``L/k + k`` blocks' worth: O(√L);
* the price is one more forward per step: with backward ≈ 2 forwards, ≈ 4/3 of the step.

Korthikanti et al. (2022) recompute *selectively* (only attention's cheap, large parts);
:mod:`distlab.lab.activation_memory` has their per-layer formulas. This module uses
``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``. The reentrant variant, the
default when ``use_reentrant`` is not given (torch 2.13 still runs it then, with a warning),
supports only ``.backward()`` (not ``torch.autograd.grad``) and computes no gradient for the
segment's parameters when none of its inputs requires grad; ``use_reentrant=False`` is the
recommended one.
"""
from __future__ import annotations

import functools
import math
import statistics

import torch
import torch.nn.functional as F
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.checkpoint import checkpoint

from distlab.data import seeded_batch
from distlab.measure.memory import saved_tensor_bytes
from distlab.resmlp import ResidualMLP, make_resmlp
from distlab.measure.timing import median_seconds

POLICIES = ("none", "every block", "every √L blocks")


def segment_length(depth: int, policy: str) -> int:
    """Blocks per checkpointed segment: 0 (no recomputation), 1, or ``round(√depth)``."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}")
    return {"none": 0, "every block": 1}.get(policy, max(1, round(math.sqrt(depth))))


def _run(blocks: list[nn.Module], x: torch.Tensor) -> torch.Tensor:
    for block in blocks:
        x = block(x)
    return x


class Recomputed(nn.Module):
    """A :class:`ResidualMLP` whose blocks run in checkpointed segments of ``every`` blocks
    (``every=0``: plain). It shares the model's parameters: same weights, same gradients."""

    def __init__(self, model: ResidualMLP, every: int):
        super().__init__()
        self.model, self.every = model, every

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m, blocks = self.model, list(self.model.blocks)
        x = torch.relu(m.inp(x))
        if not self.every:
            return m.head(_run(blocks, x))
        for i in range(0, len(blocks), self.every):
            # Only the segment's input is kept; its forward runs again inside the backward.
            x = checkpoint(functools.partial(_run, blocks[i:i + self.every]), x, use_reentrant=False)
        return m.head(x)


def workload(depth: int, *, hidden: int = 256, batch: int = 64, in_features: int = 64, out_features: int = 10,
             seed: int = 0) -> tuple[ResidualMLP, torch.Tensor, torch.Tensor]:
    """The model and one batch the notebook, the benchmark and the tests measure."""
    model = make_resmlp(seed, in_features=in_features, hidden=hidden, depth=depth, out_features=out_features)
    return (model, *seeded_batch(batch, in_features, out_features, seed=seed + 1))


def saved_bytes(model: ResidualMLP, every: int, x, y) -> int:
    """Bytes autograd keeps for backward at the end of the forward (parameters left out)."""
    run = Recomputed(model, every)
    return saved_tensor_bytes(lambda: F.cross_entropy(run(x), y), exclude=model.parameters())


class ActivationPeak(TorchDispatchMode):
    """Peak bytes of live tensor storage made while the ``with`` block runs, less ``exclude``'s.

    ``distlab.lab.fsdp_memory.LiveStorageTracker`` counts every storage an op touches, inputs included
    (the parameters, the batch). Here a storage is counted, with its size,
    when an op first outputs it (every tensor of a step is some op's output), the weak
    references of those still counted are checked after each op, and the storages of
    ``exclude`` (parameters, gradients: they exist anyway) are never counted.
    """

    def __init__(self, exclude=()):
        super().__init__()
        self._skip = {t.untyped_storage().data_ptr() for t in exclude}
        self._live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.current = self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for key in [k for k, (ref, _) in self._live.items() if ref.expired()]:
            self.current -= self._live.pop(key)[1]
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                st = t.untyped_storage()
                if st._cdata not in self._live and st.data_ptr() not in self._skip:
                    self._live[st._cdata] = (StorageWeakRef(st), st.nbytes())
                    self.current += st.nbytes()
        self.peak = max(self.peak, self.current)
        return out


def peak_activation_bytes(model: ResidualMLP, every: int, x, y) -> int:
    """Peak bytes of the storages a forward and backward make, beyond the parameters and their
    gradients (:class:`ActivationPeak`): the activations, those recomputed in the backward
    included, and the step's temporaries (e.g. a weight gradient before it is added to
    ``.grad``; the ``.grad`` tensors exist already, so adding into them makes nothing new)."""
    run = Recomputed(model, every)
    F.cross_entropy(run(x), y).backward()  # makes the .grad tensors
    with ActivationPeak(exclude=[*model.parameters(), *(p.grad for p in model.parameters())]) as mem:
        F.cross_entropy(run(x), y).backward()
    model.zero_grad(set_to_none=True)
    return mem.peak


def grads(model: ResidualMLP, every: int, x, y) -> list[torch.Tensor]:
    """The gradients of one step with this recomputation (the model's ``.grad`` left cleared)."""
    model.zero_grad(set_to_none=True)
    F.cross_entropy(Recomputed(model, every)(x), y).backward()
    out = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return out


def step_seconds(model: ResidualMLP, every: int, x, y, min_run_time: float = 0.2) -> float:
    """Median seconds of a forward and backward (``distlab.measure.timing.median_seconds``)."""
    run = Recomputed(model, every)

    def step():
        model.zero_grad(set_to_none=True)
        F.cross_entropy(run(x), y).backward()

    return median_seconds(step, warmup=1, min_run_time=min_run_time)


def step_time_ratios(depth: int, *, rounds: int = 3, min_run_time: float = 0.1, threads: int = 1,
                     **shape) -> dict[str, float]:
    """Per recomputing policy, its step time over the plain model's (median over ``rounds``), and
    ``"forward share"``: the plain model's forward (recording the graph) over its step, F/(F+B),
    so that ``1 + F/(F+B)`` is what one more forward should cost.

    The policies are timed in turn each round and each round gives its own ratios: a burst of
    load from elsewhere (a machine whose cores are shared) hits a round's policies alike.
    On ``threads`` torch threads, as :func:`sweep`.
    """
    model, x, y = workload(depth, **shape)
    every = {p: segment_length(depth, p) for p in POLICIES}
    plain = Recomputed(model, 0)
    ratios: dict[str, list[float]] = {p: [] for p in POLICIES if every[p]}
    ratios["forward share"] = []
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for _ in range(rounds):
            t = {p: step_seconds(model, every[p], x, y, min_run_time) for p in POLICIES}
            for p in POLICIES[1:]:
                ratios[p].append(t[p] / t["none"])
            ratios["forward share"].append(median_seconds(lambda: plain(x), warmup=1, min_run_time=min_run_time)
                                           / t["none"])
    finally:
        torch.set_num_threads(before)
    return {name: statistics.median(v) for name, v in ratios.items()}


MEASURES = ("saved", "peak", "grads")


def sweep(depths=(4, 8, 16), policies=POLICIES, *, measure=MEASURES, progress=None, threads: int = 1,
          **shape) -> list[dict]:
    """Every (depth, policy): what ``measure`` names of the forward-saved bytes (``saved_bytes``),
    the peak activation bytes (``peak_bytes``) and whether the gradients equal the plain model's
    bit for bit (``grads_equal``: the same ops run on the same inputs); step times are
    :func:`step_time_ratios`'. ``progress(text)`` is called before each depth (a sweep takes seconds).

    It runs on ``threads`` torch threads, then puts the count back: on a machine whose cores
    other jobs share, two threads that wait for each other spin, and the timings (and the
    sweep's own duration) vary tenfold; one thread measures the same work every time.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return [row for depth in depths for row in _measure(depth, policies, measure, progress, shape)]
    finally:
        torch.set_num_threads(before)


def _measure(depth: int, policies, measure, progress, shape: dict) -> list[dict]:
    if progress:
        progress(f"depth {depth}: {', '.join(policies)} ...")
    model, x, y = workload(depth, **shape)
    plain = grads(model, 0, x, y) if "grads" in measure else None
    rows = []
    for policy in policies:
        every = segment_length(depth, policy)
        row = {"depth": depth, "policy": policy, "every": every}
        if "saved" in measure:
            row["saved_bytes"] = saved_bytes(model, every, x, y)
        if "peak" in measure:
            row["peak_bytes"] = peak_activation_bytes(model, every, x, y)
        if "grads" in measure:
            row["grads_equal"] = all(torch.equal(a, b) for a, b in zip(plain, grads(model, every, x, y)))
        rows.append(row)
    return rows
