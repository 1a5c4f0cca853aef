"""distlab: the course's library, shared by the notebooks, the solutions, the benchmarks and the grader.

Three layers, each importing only the ones below it (``tests/project/test_layout.py`` holds them to it):

* :mod:`distlab.lab`: the notebooks' labs, one module per topic;
* :mod:`distlab.measure`: the instruments, each written once (timing, memory, communication, profiles);
* :mod:`distlab.runtime`: launching ranks and ending every process they start.

Beside them, what every layer trains: ``models``, ``resmlp``, ``data``, ``checkpoint``.

The names below load on first use (PEP 562): a process that only supervises jobs (the grader's
CLI, a notebook's ``check(N)``) then never imports torch, which costs seconds per process. The
module names distlab was released with keep working (:mod:`distlab._moved`).
"""
from __future__ import annotations

import importlib

from ._moved import install as _install_moved

_install_moved()

_WHERE = {
    "backend": "runtime.distributed", "device": "runtime.distributed", "init_distributed": "runtime.distributed",
    "pick_backend": "runtime.distributed", "rank": "runtime.distributed", "shutdown": "runtime.distributed",
    "world_size": "runtime.distributed",
    "LaunchError": "runtime.failures", "LaunchHang": "runtime.failures", "LaunchTimeout": "runtime.failures",
    "MachineTooSlow": "runtime.failures",
    "RankFailure": "runtime.failures", "RunResult": "runtime.launch",
    "torchrun": "runtime.launch",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'distlab' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))


def load_ipython_extension(ipython):  # ``%load_ext distlab`` registers ``%%torchrun``
    from .runtime.magic import load_ipython_extension as load

    load(ipython)
