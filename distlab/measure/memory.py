"""Measuring memory the same way on every device: one counter of saved tensors, one peak.

* :class:`SavedTensors` is the one counter of what autograd saves for backward
  (``torch.autograd.graph.saved_tensors_hooks``), each storage once: every
  storage saved (``total``), those a graph still holds (``live``) and the most
  held at once (``peak``). These activations are what mixed precision,
  activation checkpointing and pipeline schedules shrink, and the count is
  exact on any device. Built on it:
* :func:`saved_tensor_bytes`, the bytes saved while ``fn`` runs. It is also
  exercise 3's graded ``saved_bytes``: the grader recognises it (imported,
  aliased or called, also through :func:`peak_memory`: :mod:`autograder.rank.runtime_copies`)
  and gives it no marks;
* :func:`saved_tensor_bytes_by_kind` splits the same count into the
  activations and the weights a layer saves (``linear`` keeps its weight for
  the gradient of its input): the parameters themselves, which exist anyway,
  and the 16-bit copies of them that ``torch.autocast`` makes for the step,
  which are extra memory;
* ``distlab.lab.pipeline.costs.SavedBytes``, a pipeline stage's live and peak bytes.
* :class:`PeakMemory` is the one peak of a block: ``torch.cuda.max_memory_allocated``
  on a GPU, the live tensor storage of :class:`~distlab.measure.live_storage.LiveStorageTracker`
  on the CPU, whose allocator keeps no peak statistic.
* :func:`peak_memory` is a step's memory as exercise 3 reports it: the GPU's peak
  (:class:`PeakMemory`), and on the CPU the saved-tensor bytes. It returns
  which method it used, so a report can say what was measured.
"""
from __future__ import annotations

import itertools
import weakref
from typing import Callable, Iterable

import torch

from distlab.measure.live_storage import LiveStorageTracker


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's shard on this rank (the memory it holds here); any other tensor itself."""
    if hasattr(t, "to_local"):  # a DTensor (FSDP2, tensor parallelism), without importing torch.distributed
        with torch.no_grad():
            return t.to_local()
    return t


def _key(t: torch.Tensor) -> tuple:
    t = local_tensor(t)
    return (t.device.type, t.device.index, t.untyped_storage().data_ptr())


class _Held:
    """What autograd keeps instead of a saved tensor: the tensor, and its counter, told when autograd frees it."""

    __slots__ = ("counter", "t", "key", "gen")

    def __init__(self, counter: "SavedTensors", t: torch.Tensor, key: tuple):
        self.counter, self.t, self.key, self.gen = counter, t, key, counter.gen

    def __del__(self):
        if self.counter.gen == self.gen:  # saved before a reset: no longer counted
            self.counter._drop(self.key)


class SavedTensors(torch.autograd.graph.saved_tensors_hooks):
    """The storages autograd saves for backward while entered, each counted once (see the module docstring).

    Each storage once, because a saved tensor's memory is its storage's: a ReLU's output is also
    the next Linear's saved input, a weight is saved as its transpose, and counting tensors would
    count them twice. ``saved`` maps each storage ever saved to its bytes (``total``, their sum);
    ``live`` counts those a graph still holds (autograd frees a graph's saved tensors after its
    backward), ``peak`` the most at once. A DTensor counts as its shard on this rank. Storages of
    ``exclude`` (``model.parameters()``, which exist anyway) are not counted.

    ``views_apart=True`` counts a saved view as its own bytes instead of its whole storage: a
    pipeline's micro-batches are views of one batch, and each holds only its own rows for its
    stage. ``on_pack(key, tensor)`` is told of every saved tensor (for a split by kind).
    Re-enterable: the counts add up over every ``with`` until :meth:`reset`.
    """

    def __init__(self, exclude: Iterable[torch.Tensor] = (), *, views_apart: bool = False,
                 on_pack: Callable[[tuple, torch.Tensor], None] | None = None):
        super().__init__(self._pack, lambda held: held.t)
        self.skip = {_key(t) for t in exclude}
        self.views_apart, self.on_pack = views_apart, on_pack
        self.saved: dict[tuple, int] = {}
        self._refs: dict[tuple, list[int]] = {}  # key -> [saved tensors holding it, bytes counted]
        # address -> (the storage seen there, its key): an address alone is no identity, since a storage
        # freed after one backward may be reallocated at the same address in the next forward
        self._at: dict[tuple, tuple[weakref.ref, tuple]] = {}
        self._fresh = itertools.count(1)
        self.live = self.peak = self.gen = 0

    @property
    def total(self) -> int:
        return sum(self.saved.values())

    def _identity(self, mine: torch.Tensor) -> tuple:
        """One key per storage while it lives: a new storage at a freed one's address gets a new key.

        A storage's Python object lives exactly as long as the storage (PyTorch preserves it), so a
        weak reference to it tells the same storage from a later one at the same address.
        """
        address, storage = _key(mine), mine.untyped_storage()
        seen = self._at.get(address)
        if seen is not None and seen[0]() is storage:
            return seen[1]
        key = address if seen is None else address + (next(self._fresh),)
        self._at[address] = (weakref.ref(storage), key)
        return key

    def _pack(self, t: torch.Tensor):
        mine = local_tensor(t)
        if _key(mine) in self.skip:
            return _Held(self, t, None)
        key = self._identity(mine)
        nbytes = mine.untyped_storage().nbytes()
        if self.views_apart:
            key, nbytes = key + (mine.data_ptr(), mine.nbytes), mine.nbytes
        self.saved[key] = max(self.saved.get(key, 0), nbytes)
        if self.on_pack is not None:
            self.on_pack(key, t)
        ref = self._refs.setdefault(key, [0, nbytes])
        ref[0] += 1
        if ref[0] == 1:
            ref[1] = nbytes
            self.live += nbytes
            self.peak = max(self.peak, self.live)
        return _Held(self, t, key)

    def _drop(self, key) -> None:
        ref = self._refs.get(key)
        if ref is None:
            return
        ref[0] -= 1
        if ref[0] == 0:
            del self._refs[key]
            self.live -= ref[1]

    def reset(self) -> None:
        """Count from zero again (after a warm-up step): what was saved before is forgotten, and its
        freeing later is not subtracted."""
        self.gen += 1
        self.saved.clear()
        self._refs.clear()
        self._at.clear()
        self.live = self.peak = 0


def saved_tensor_bytes(fn: Callable[[], object], *, exclude: Iterable[torch.Tensor] = ()) -> int:
    """Bytes of the distinct storages autograd saved for backward while ``fn()`` ran (:class:`SavedTensors`).

    Storages of the tensors in ``exclude`` (e.g. ``model.parameters()``, which
    ``linear`` saves but which exist anyway) are not counted. A DTensor counts as its
    shard on this rank.
    """
    counter = SavedTensors(exclude)
    with counter:
        fn()
    return counter.total


def _distinct_bytes(tensors: Iterable) -> int:
    seen = {}
    for t in tensors:
        if isinstance(t, torch.Tensor):
            t = local_tensor(t)
            seen[_key(t)] = t.untyped_storage().nbytes()
    return sum(seen.values())


class PeakMemory:
    """The most bytes live at once while the block runs, counting the ``state`` tensors that exist before it.

        with PeakMemory(device, state=[*params, *grads, *optimizer_state]) as mem:
            train_step()
        mem.peak, mem.method

    GPU: ``torch.cuda.max_memory_allocated`` (the allocator's own peak, exact) less what was
    allocated at the start, plus the distinct storages of ``state`` at the start: what existed before
    and is not state (the batch, cuBLAS's workspace) is left out. Only weak references to ``state``
    are kept: a tensor the block frees (``zero_grad``) stops counting. CPU, whose allocator keeps no peak:
    :class:`LiveStorageTracker`, ``state`` tracked from the start and every storage an op touches
    (the batch too) until it is freed.
    """

    def __init__(self, device: torch.device | str, state: Iterable = ()):
        self.device, self._state = torch.device(device), list(state)
        self.peak, self.method = 0, ("torch.cuda.max_memory_allocated" if self.device.type == "cuda"
                                     else "live tensor storage (LiveStorageTracker)")

    def __enter__(self) -> "PeakMemory":
        # Read the state, and let go of it: the block may free some (zero_grad), and that counts.
        state, self._state = self._state, []
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = _distinct_bytes(state) - torch.cuda.memory_allocated(self.device)
        else:
            self._tracker = LiveStorageTracker().__enter__()
            self._tracker.track(*state)
        return self

    def __exit__(self, *exc) -> bool:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak = self._base + torch.cuda.max_memory_allocated(self.device)
        else:
            self._tracker.__exit__(*exc)
            self.peak = self._tracker.peak
        return False


def peak_memory(fn: Callable[[], object], device: torch.device | str, *,
                exclude: Iterable[torch.Tensor] = ()) -> tuple[int, str]:
    """``(bytes, method)``: the peak allocated while ``fn()`` ran on a GPU (:class:`PeakMemory`, no
    state: above the start), else saved-tensor bytes (without the storages of ``exclude``)."""
    if torch.device(device).type == "cuda":
        with PeakMemory(device) as mem:
            fn()
        return mem.peak, "torch.cuda.max_memory_allocated (peak above the start)"
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
    kinds: dict[tuple, str] = {}

    def classify(key: tuple, t: torch.Tensor) -> None:
        kind = (PARAMETERS if key in params else
                PARAMETER_COPIES if _copy_of_parameter(t, params) else ACTIVATIONS)
        # a storage saved both as a parameter's copy and as something else counts as an activation
        kinds[key] = kind if kinds.get(key, kind) == kind else ACTIVATIONS

    counter = SavedTensors(on_pack=classify)
    with counter:
        fn()
    out = {ACTIVATIONS: 0, PARAMETERS: 0, PARAMETER_COPIES: 0}
    for key, nbytes in counter.saved.items():
        out[kinds[key]] += nbytes
    return out
