"""Measuring memory the same way on every device.

* :func:`saved_tensor_bytes` counts the bytes of the tensors autograd saves
  for backward while ``fn`` runs (``torch.autograd.graph.saved_tensors_hooks``),
  each storage once. These activations are what mixed precision and
  activation checkpointing shrink, and the count is exact on any device.
  It is also exercise 3's graded ``saved_bytes``: the grader recognises it
  (imported, aliased or called, also through :func:`peak_memory`:
  :mod:`autograder.answers`) and gives it no marks.
* :func:`peak_memory` is the device's own answer where it has one:
  ``torch.cuda.max_memory_allocated`` on a GPU (the peak above what was
  allocated before ``fn``), and the saved-tensor bytes on the CPU, whose
  allocator keeps no peak statistic. It returns which method it used, so a
  report can say what was measured.
* :func:`saved_tensor_bytes_by_kind` splits the same count into the
  activations and the weights a layer saves (``linear`` keeps its weight for
  the gradient of its input): the parameters themselves, which exist anyway,
  and the 16-bit copies of them that ``torch.autocast`` makes for the step,
  which are extra memory.
"""
from __future__ import annotations

from typing import Callable, Iterable

import torch


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's shard on this rank (the memory it holds here); any other tensor itself."""
    if hasattr(t, "to_local"):  # a DTensor (FSDP2, tensor parallelism), without importing torch.distributed
        with torch.no_grad():
            return t.to_local()
    return t


def _key(t: torch.Tensor) -> tuple:
    t = local_tensor(t)
    return (t.device.type, t.device.index, t.untyped_storage().data_ptr())


def saved_tensor_bytes(fn: Callable[[], object], *, exclude: Iterable[torch.Tensor] = ()) -> int:
    """Bytes of the distinct tensors autograd saved for backward while ``fn()`` ran.

    Storages of the tensors in ``exclude`` (e.g. ``model.parameters()``, which
    ``linear`` saves but which exist anyway) are not counted. A DTensor counts as its
    shard on this rank.
    """
    seen: dict[tuple, int] = {}
    skip = {_key(t) for t in exclude}

    def pack(t: torch.Tensor) -> torch.Tensor:
        mine = local_tensor(t)
        key = _key(mine)
        if key not in skip:
            seen[key] = max(seen.get(key, 0), mine.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


def peak_memory(fn: Callable[[], object], device: torch.device | str, *,
                exclude: Iterable[torch.Tensor] = ()) -> tuple[int, str]:
    """``(bytes, method)``: the peak allocated while ``fn()`` ran on a GPU, else saved-tensor bytes
    (without the storages of ``exclude``)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before, "torch.cuda.max_memory_allocated (peak above the start)"
    return saved_tensor_bytes(fn, exclude=exclude), "bytes of tensors saved for backward (saved_tensors_hooks)"


ACTIVATIONS, PARAMETERS, PARAMETER_COPIES = "activations", "parameters", "parameter copies"


# autograd nodes of ops whose output is a cast, a copy or a view of their one input
_COPY_OR_VIEW = frozenset({
    "ToCopyBackward0", "CloneBackward0", "TBackward0", "TransposeBackward0", "PermuteBackward0",
    "ViewBackward0", "UnsafeViewBackward0", "AliasBackward0", "ExpandBackward0", "SliceBackward0",
    "SelectBackward0", "SqueezeBackward0", "SqueezeBackward1", "UnsqueezeBackward0",
})


def _copy_of_parameter(t: torch.Tensor, params: set[tuple]) -> bool:
    """Whether ``t`` is a cast, copy or view of a parameter (through any chain of them).

    Follows ``t.grad_fn`` back through :data:`_COPY_OR_VIEW` nodes; an ``AccumulateGrad``
    node at the end holds the leaf (``.variable``), a parameter or not. Any other op (``w * x``,
    a matmul) makes ``t`` an activation.
    """
    node = t.grad_fn
    while node is not None:
        leaf = getattr(node, "variable", None)
        if leaf is not None:
            return _key(leaf) in params
        if type(node).__name__ not in _COPY_OR_VIEW:
            return False
        inputs = [n for n, _ in node.next_functions if n is not None]
        if len(inputs) != 1:
            return False
        node = inputs[0]
    return False


def saved_tensor_bytes_by_kind(fn: Callable[[], object], parameters: Iterable[torch.Tensor]) -> dict[str, int]:
    """Bytes autograd saved for backward while ``fn()`` ran, each storage once, by kind.

    ``{"activations": ..., "parameters": ..., "parameter copies": ...}``:

    * ``"parameters"``: storages of ``parameters`` themselves (``linear`` saves its
      weight in float32); they exist whether or not a step runs, so they are no extra memory.
    * ``"parameter copies"``: casts, copies and views of a parameter, such as the
      bfloat16/float16 copy of a weight that ``torch.autocast`` casts for ``linear``; extra
      memory, held until backward.
    * ``"activations"``: everything else (the layers' inputs and outputs, the input batch).

    ``activations`` is :func:`saved_tensor_bytes` with ``exclude=parameters`` less the copies;
    the three add up to :func:`saved_tensor_bytes` without ``exclude``.
    """
    params = {_key(p) for p in parameters}
    seen: dict[tuple, tuple[str, int]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = _key(t)
        kind = (PARAMETERS if key in params else
                PARAMETER_COPIES if _copy_of_parameter(t, params) else ACTIVATIONS)
        old = seen.get(key)
        nbytes = max(old[1] if old else 0, t.untyped_storage().nbytes())
        # a storage saved both as a parameter's copy and as something else counts as an activation
        seen[key] = (kind if old is None or old[0] == kind else ACTIVATIONS, nbytes)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    out = {ACTIVATIONS: 0, PARAMETERS: 0, PARAMETER_COPIES: 0}
    for kind, nbytes in seen.values():
        out[kind] += nbytes
    return out
