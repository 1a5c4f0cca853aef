"""distlab: the small runtime shared by the course notebooks, the solutions and the grader.

The names below load on first use (PEP 562): a process that only supervises jobs (the grader's
CLI, a notebook's ``check(N)``) then never imports torch, which costs seconds per process.
"""
from __future__ import annotations

import importlib

_WHERE = {
    "backend": "distributed", "device": "distributed", "init_distributed": "distributed",
    "pick_backend": "distributed", "rank": "distributed", "shutdown": "distributed",
    "world_size": "distributed",
    "LaunchError": "launch", "LaunchHang": "launch", "LaunchTimeout": "launch", "MachineTooSlow": "launch",
    "RankFailure": "launch", "RunResult": "launch",
    "torchrun": "launch",
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
    from .magic import load_ipython_extension as load

    load(ipython)
