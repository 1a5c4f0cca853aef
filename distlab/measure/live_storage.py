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
        # every storage seen, with its bytes when last seen; dead ones are dropped at the next purge
        self._live: dict[int, tuple[StorageWeakRef, int]] = {}
        self._bound = 0  # the bytes of self._live, dead storages not yet purged included: >= the live bytes
        self.start = 0
        self.peak = 0

    @property
    def current(self) -> int:
        """The bytes of live storage now."""
        self._purge()
        return self._bound

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
        if t.device.type in ("cpu", "cuda"):
            self._count(t.untyped_storage())

    def _count(self, st: torch.UntypedStorage) -> None:
        """A storage's bytes, new, or again: an op or ``resize_`` may have resized it in place."""
        key, size = st._cdata, st.nbytes()
        old = self._live.get(key)
        if old is not None and not old[0].expired():
            ref, counted = old
        else:  # new, or a dead storage's address taken by a new one
            ref, counted = StorageWeakRef(st), (old[1] if old is not None else 0)
        self._live[key] = (ref, size)
        self._bound += size - counted

    def _purge(self) -> None:
        for key in [k for k, (ref, _) in self._live.items() if ref.expired()]:
            self._bound -= self._live.pop(key)[1]

    def _sample(self) -> None:
        """A new peak, if there is one. Only a bound above the peak can hide one: then the dead storages are
        purged, and what is left is exact. (Purging at every op, the cost was quadratic in the number of
        storages: most ops, views and in-place updates, make no new bytes.)"""
        if self._bound > self.peak:
            self._purge()
            self.peak = max(self.peak, self._bound)

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
            tracker._count(storage)
            tracker._sample()
            return result

        self._original_resize = original
        torch.UntypedStorage.resize_ = resize_
        super().__enter__()
        self.start = self.current
        self.peak = max(self.peak, self.start)
        return self

    def __exit__(self, *exc):
        super().__exit__(*exc)
        torch.UntypedStorage.resize_ = self._original_resize
        return False
