"""Finding code: the repo's root, a Python file imported by path, a ``"module:function"`` resolved.

Used by the torchrun worker (to call a job's target), by the grader (to import a
learner's file by path, never from ``sys.path``) and by the launcher (the repo
goes on the ranks' path).
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def with_repo_on_path(env: dict[str, str]) -> str:
    """``PYTHONPATH`` for a child process: the repo first, then what ``env`` had."""
    return os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))


def import_path(path: str | Path, name: str | None = None):
    """Import the Python file at ``path`` as a module (named ``name``, default from the file)."""
    path = Path(path).resolve()
    mod_name = name or f"_distlab_{path.stem}"
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    spec.loader.exec_module(module)
    return module


def resolve(target: str):
    """Turn ``"pkg.mod:fn"`` or ``"path/to/file.py:fn"`` into the function it names."""
    where, _, name = target.rpartition(":")
    if where.endswith(".py"):
        module = import_path(where)
    else:
        module = importlib.import_module(where)
    obj = module
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj
