"""The module names distlab was released with, before its layers had folders of their own.

Notebooks and assignments already in learners' hands import ``distlab.fsdp_memory``,
``distlab.launch``, ``distlab.pipeline_bench``...; a finder on ``sys.meta_path`` answers each old
name with the module that now holds it (the same module object, so state and patches are shared).
A name that was split answers with a module that reads each attribute from the new ones, in order.
New code imports the new names; ``tests/test_layout.py`` holds this table to the tree.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types

_R, _M, _L = "distlab.runtime.", "distlab.measure.", "distlab.lab."
MOVED: dict[str, tuple[str, ...]] = {
    **{f"distlab.{m}": (_R + m,) for m in ("agent", "distributed", "forkserver", "heartbeat", "importing", "launch",
                                           "magic", "process", "reaper", "sandbox", "warm", "worker")},
    "distlab.multinode": (_R + "multinode", _L + "launching"),
    **{f"distlab.{m}": (_M + m,) for m in ("memory", "profiling", "timing")},
    "distlab.comm_bytes": (_M + "comm", _L + "comm_volume"),
    **{f"distlab.{m}": (_L + m,) for m in ("accumulation", "activation_memory", "bandwidth", "comm_job",
                                           "ddp_overlap", "examples", "fsdp_memory", "hang", "mfu", "recompute",
                                           "tensor_parallel")},
    "distlab.pipeline": (_L + "pipeline.timeline",),
    "distlab.pipeline_run": (_L + "pipeline.run",),
    "distlab.pipeline_bench": (_L + "pipeline.sweep", _L + "pipeline.costs"),
}


class _Union(types.ModuleType):
    """An old module that was split: each attribute from the first new module that has it."""

    def __init__(self, name: str, parts: list[types.ModuleType]):
        super().__init__(name, f"moved to {', '.join(p.__name__ for p in parts)}")
        self._parts = parts

    def __getattr__(self, attr: str):
        for part in self._parts:
            if hasattr(part, attr):
                return getattr(part, attr)
        raise AttributeError(f"module {self.__name__!r} (now {', '.join(p.__name__ for p in self._parts)}) "
                             f"has no attribute {attr!r}")

    def __dir__(self):
        return sorted({a for p in self._parts for a in dir(p)})


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        return importlib.util.spec_from_loader(fullname, self) if fullname in MOVED else None

    def create_module(self, spec):
        parts = [importlib.import_module(name) for name in MOVED[spec.name]]
        self._spec = parts[0].__spec__  # the import system sets __spec__ to the alias's: restored below
        return parts[0] if len(parts) == 1 else _Union(spec.name, parts)

    def exec_module(self, module):
        if not isinstance(module, _Union):
            module.__spec__ = self._spec


def install() -> None:
    """Answer the old names from now on (idempotent)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())
