"""Counting the bytes FSDP leaves on a rank: the exact expected figure, the measured one, the peak.

Four tools, used by the FSDP notebook, exercise 4's grader and its benchmark:

* :func:`expected_bytes` is the arithmetic. FSDP2 (``fully_shard``) splits
  every parameter on dim 0 like ``torch.chunk``: rank ``r`` of ``W`` gets rows
  ``[r*c, (r+1)*c)`` with ``c = ceil(rows / W)``, and every rank *stores* ``c``
  rows (the last shards are padded so all-gathers are uniform). Gradients come
  out of the reduce-scatter in the same padded layout. Adam's ``exp_avg`` and
  ``exp_avg_sq`` are made with ``zeros_like`` of the shard, so they hold only
  the rank's real rows; each parameter also has a 4-byte ``step`` tensor.
  This is the ZeRO-3 accounting of Rajbhandari et al. (2020), padding included.
* :func:`measured_bytes` reads what is really there: the distinct storages
  behind the local shards, gradients and optimizer state of this rank.
* :class:`LiveStorageTracker` measures the peak of *live tensor storage*
  during a step on any device, including the CPU, which has no
  ``max_memory_allocated``. It is a ``TorchDispatchMode``: after every aten op
  it records the storages of the op's inputs and outputs (unwrapping DTensors
  to their local tensors) with a weak reference, and sums the ``nbytes`` of
  those still alive. FSDP2 allocates and frees unsharded parameters by
  resizing storages in place (``UntypedStorage.resize_``, which does not go
  through the dispatcher), so the tracker also wraps ``resize_``. A storage
  counts from the first op that touches it until it is freed; bytes never
  passed through an op (allocator slack, a library's private C++ buffers) are
  not counted, which is why the GPU path uses ``torch.cuda.max_memory_allocated``.
* :func:`peak_bound` is what per-block sharding promises for that peak: the
  sharded state, :data:`UNITS_IN_FLIGHT` unsharded units and the activations
  (:func:`activation_bytes`) of a :class:`~distlab.resmlp.ResidualMLP`.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn

# Re-exported: notebook 04 imports these from here
from distlab.lab.training_memory import LEVELS, OPTIMIZER_STATES, training_memory  # noqa: F401
from distlab.measure.memory import LiveStorageTracker, local_tensor  # noqa: F401

# Everything counted here is fp32: a parameter, its gradient and each Adam moment take 4 bytes per element.
BYTES_PER_PARAM = 4
# fp32 parameter + fp32 gradient + Adam's two fp32 moments = 16 bytes per parameter
ADAM_BYTES_PER_PARAM = {"params": BYTES_PER_PARAM, "grads": BYTES_PER_PARAM, "optimizer": 2 * BYTES_PER_PARAM}
# Per-block FSDP keeps at most this many units' worth of unsharded bytes alive at once: the unit
# computing (gathered params + all-gather buffer, then its full gradients + the reduce-scatter
# buffer) and the one being prefetched. Root-only wrapping needs the whole model instead.
UNITS_IN_FLIGHT = 6


def memory_per_gpu(n_params: float, param_bytes: int = BYTES_PER_PARAM, optimizer: str = "adam", world: int = 1,
                   level: str = "full") -> dict[str, float]:
    """Bytes per GPU for params, grads, fp32 master copy and optimizer state under a ZeRO level:
    :func:`distlab.lab.training_memory.training_memory` (the course's one accounting) with the
    precision named by its parameter size: 4 bytes fp32, 2 bytes bf16 mixed precision, which keeps
    a 4-byte master copy (2 + 2 + 4 + 8 = 16 bytes with Adam). Activations are extra."""
    precisions = {4: "fp32", 2: "bf16"}
    if param_bytes not in precisions:
        raise ValueError(f"param_bytes must be 4 (fp32) or 2 (bf16 mixed precision), not {param_bytes}")
    return training_memory(n_params, precision=precisions[param_bytes], optimizer=optimizer, world=world, level=level)


def shard_rows(rows: int, world: int, rank: int) -> tuple[int, int]:
    """``(real rows, stored rows)`` of rank ``rank``'s dim-0 shard (``torch.chunk`` + padding)."""
    chunk = math.ceil(rows / world)
    real = max(0, min(chunk, rows - rank * chunk))
    return real, chunk


def expected_bytes(shapes: dict[str, tuple[int, ...]], world: int, rank: int,
                   element_size: int = BYTES_PER_PARAM) -> dict[str, int]:
    """Bytes rank ``rank`` holds for params, grads and Adam state when every parameter is sharded."""
    out = {"params": 0, "grads": 0, "optimizer": 0, "padding": 0}
    for shape in shapes.values():
        rest = math.prod(shape[1:]) * element_size
        real, stored = shard_rows(shape[0], world, rank)
        out["params"] += stored * rest
        out["grads"] += stored * rest
        out["optimizer"] += 2 * real * rest + 4  # exp_avg, exp_avg_sq, and the fp32 step
        out["padding"] += (stored - real) * rest
    return out


def _storage_bytes(tensors) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        st = local_tensor(t).untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def measured_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict[str, int]:
    """Bytes of the distinct storages behind this rank's parameters, gradients and optimizer state."""
    params = list(model.parameters())
    out = {"params": _storage_bytes(params),
           "grads": _storage_bytes(p.grad for p in params if p.grad is not None),
           "optimizer": 0}
    if optimizer is not None:
        out["optimizer"] = _storage_bytes(v for s in optimizer.state.values() for v in s.values()
                                          if isinstance(v, torch.Tensor))
    return out


def full_shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """Global (unsharded) shape of every parameter, for :func:`expected_bytes`."""
    return {n: tuple(p.shape) for n, p in model.named_parameters()}


def module_bytes(module: nn.Module, element_size: int = BYTES_PER_PARAM) -> int:
    """Unsharded bytes of a module's parameters."""
    return sum(p.numel() for p in module.parameters()) * element_size


def unsharded_bytes(shapes: dict[str, Sequence[int]]) -> int:
    """Params + grads + Adam's two moments of parameters with these shapes, unsharded, on one rank
    (:func:`memory_per_gpu` at ZeRO level "none", for these exact shapes)."""
    return int(memory_per_gpu(sum(math.prod(s) for s in shapes.values()), level="none")["total"])


def activation_bytes(micro_batch: int, *, in_features: int, hidden: int, depth: int, out_features: int) -> int:
    """A bound on what a :class:`~distlab.resmlp.ResidualMLP` keeps for backward on a micro-batch.

    Every layer's input and output per sample (the input, the input layer's output, in each
    block ``hidden`` in, ``2*hidden`` out of ``fc1`` and again out of the ReLU, ``hidden`` out of
    ``fc2``, and the logits), in fp32, twice: a margin for what autograd saves besides.
    """
    per_sample = in_features + hidden + depth * (hidden + 2 * hidden + 2 * hidden + hidden) + out_features
    return 2 * per_sample * micro_batch * BYTES_PER_PARAM


def peak_bound(state_bytes: int, model: nn.Module, activations: int) -> dict[str, int]:
    """What per-block sharding promises for the peak of a training step, and its parts.

    ``state_bytes`` is this rank's sharded state (params, grads, optimizer) before the step;
    ``model`` has one ``fully_shard`` unit per block in ``model.blocks`` and the root unit for
    the rest (sharded or not: a DTensor's ``numel`` is the unsharded one); ``activations`` from
    :func:`activation_bytes`. The bound is the state + :data:`UNITS_IN_FLIGHT` x the largest
    unit's unsharded parameters + the activations.
    """
    units = [module_bytes(b) for b in model.blocks]
    units.append(module_bytes(model) - sum(units))  # the root unit: input layer and head
    one_unit = max(units)
    return {"state": state_bytes, "unit": one_unit, "activations": activations,
            "bound": state_bytes + UNITS_IN_FLIGHT * one_unit + activations}
