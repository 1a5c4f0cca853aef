"""The module names distlab was released with, before its layers had folders of their own.

Notebooks and assignments already in learners' hands import ``distlab.fsdp_memory``,
``distlab.launch``, ``distlab.pipeline_bench``...; a finder on ``sys.meta_path`` answers each old
name with the module that now holds it (the same module object, so state and patches are shared).
A name that was split answers with a module that reads each attribute from the new ones, in order.
Each old name says once, as a :class:`DeprecationWarning` at the line that imported it, which module
to import instead; ``python -m OLD`` runs ``python -m NEW`` and says so on stderr. The old names are
to be removed in the release after next (the README's "Released names" says when).
:mod:`autograder._moved` answers the autograder's old names with the same finder.

New code imports the new names; ``tests/project/test_layout.py`` holds every table to the tree and fails on
any tracked file that imports an old name.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import os
import sys
import types
import warnings

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


_IMPORT_MACHINERY = ("<frozen importlib", os.path.dirname(importlib.__file__), __file__)


def _importer_stacklevel() -> int:
    """The ``stacklevel``, from :meth:`Finder.exec_module`, of the frame that imported the old name.

    ``warnings`` skips the import system's ``_bootstrap`` frames by itself; the others between here and
    the import statement (``importlib.import_module``, this file) are counted.
    """
    frame, level = sys._getframe(2), 1  # exec_module's caller; exec_module itself is level 1
    while frame is not None and frame.f_code.co_filename.startswith(_IMPORT_MACHINERY):
        name = frame.f_code.co_filename
        level += not ("importlib" in name and "_bootstrap" in name)
        frame = frame.f_back
    return level + 1


class Finder(importlib.abc.MetaPathFinder, importlib.abc.InspectLoader):
    """Answers the old names of ``table`` (old name -> the new modules, in order).

    Thread-safe: the only state is filled under the import system's per-module lock (the new modules'
    specs, one entry per old name, written once and never changed).
    """

    def __init__(self, table: dict[str, tuple[str, ...]], scripts: dict[str, str] | None = None):
        self.table = table
        self.scripts = scripts or {}  # old name -> what ``python -m OLD`` runs instead of ``python -m NEW``
        self._specs: dict[str, object] = {}

    def find_spec(self, fullname, path=None, target=None):
        return importlib.util.spec_from_loader(fullname, self) if fullname in self.table else None

    def create_module(self, spec):
        parts = [importlib.import_module(name) for name in self.table[spec.name]]
        self._specs[spec.name] = parts[0].__spec__  # the import system sets __spec__ to the alias's: restored below
        return parts[0] if len(parts) == 1 else _Union(spec.name, parts)

    def exec_module(self, module):
        old = module.__spec__.name
        if not isinstance(module, _Union):
            module.__spec__ = self._specs[old]
        warnings.warn(f"{old} is {' and '.join(self.table[old])} now: import that (the old name goes in a "
                      "later release)", DeprecationWarning, stacklevel=_importer_stacklevel())

    def get_source(self, fullname):  # ``python -m OLD``: runpy runs this shim as __main__
        if fullname in self.scripts:
            return self.scripts[fullname]
        new = self.table[fullname][0]
        return (f"import runpy, sys\nprint({f'{fullname} is {new} now: python -m {new}'!r}, file=sys.stderr)\n"
                f"runpy.run_module({new!r}, run_name='__main__', alter_sys=True)\n")

    def is_package(self, fullname):
        return False


def install(table: dict[str, tuple[str, ...]] = MOVED, scripts: dict[str, str] | None = None) -> None:
    """Answer ``table``'s old names from now on (idempotent per table); ``scripts``: what ``python -m OLD``
    runs, where that is not ``python -m NEW``.

    First on ``sys.meta_path``: a checkout from before a move keeps the old folder with its ``__pycache__``
    (git leaves untracked files), which the path finder would import as an empty namespace package."""
    if not any(isinstance(f, Finder) and f.table is table for f in sys.meta_path):
        sys.meta_path.insert(0, Finder(table, scripts))
