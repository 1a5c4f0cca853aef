"""The peak of live tensor storage on any device, the CPU included, which keeps no peak statistic.

:class:`LiveStorageTracker` is a ``TorchDispatchMode``: after every aten op it records the storages
of the op's inputs and outputs (unwrapping DTensors to their local tensors) with a weak reference,
and sums the ``nbytes`` of those still alive. FSDP2 allocates and frees unsharded parameters by
resizing storages in place (``UntypedStorage.resize_``, which does not go through the dispatcher), so
the tracker also wraps ``resize_``. A storage counts from the first op that touches it (or from
:meth:`LiveStorageTracker.track`) until it is freed; bytes never passed through an op (allocator
slack, a library's private C++ buffers) are not counted, which is why a GPU reads
``torch.cuda.max_memory_allocated`` instead (:class:`distlab.measure.memory.PeakMemory` chooses).
"""
from __future__ import annotations

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves


class LiveStorageTracker(TorchDispatchMode):
    """Peak bytes of live tensor storage while the ``with`` block runs (see the module docstring).

        with LiveStorageTracker() as mem:
            train_step(...)
        mem.peak, mem.peak - mem.start
    """

    def __init__(self):
        super().__init__()
        self._refs: dict[int, StorageWeakRef] = {}
        self.start = 0
        self.peak = 0
        self.current = 0

    def track(self, *tensors) -> None:
        """Count these tensors' storages from now on (e.g. the state that exists before the step)."""
        for t in tensors:
            self._see(t)
        self._sample()

    def _see(self, t) -> None:
        if not isinstance(t, torch.Tensor):
            return
        if is_traceable_wrapper_subclass(t):  # a DTensor: count its local shard
            names, _ = t.__tensor_flatten__()
            for name in names:
                self._see(getattr(t, name))
            return
        if t.device.type not in ("cpu", "cuda"):
            return
        st = t.untyped_storage()
        key = st._cdata
        old = self._refs.get(key)
        if old is None or old.expired():
            self._refs[key] = StorageWeakRef(st)

    def _sample(self) -> None:
        total = 0
        for key in list(self._refs):
            ref = self._refs[key]
            if ref.expired():
                del self._refs[key]
                continue
            storage = torch.UntypedStorage._new_with_weak_ptr(ref.cdata)  # None if freed meanwhile
            if storage is None:  # (a collective's worker thread may drop the last reference)
                del self._refs[key]
                continue
            total += storage.nbytes()
            del storage
        self.current = total
        self.peak = max(self.peak, total)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves((args, kwargs, out)):
            self._see(t)
        self._sample()
        return out

    def __enter__(self):
        tracker, original = self, torch.UntypedStorage.resize_

        def resize_(storage, size):
            result = original(storage, size)
            key = storage._cdata
            if key not in tracker._refs or tracker._refs[key].expired():
                tracker._refs[key] = StorageWeakRef(storage)
            tracker._sample()
            return result

        self._original_resize = original
        torch.UntypedStorage.resize_ = resize_
        super().__enter__()
        self._sample()
        self.start = self.current
        return self

    def __exit__(self, *exc):
        super().__exit__(*exc)
        torch.UntypedStorage.resize_ = self._original_resize
        return False
