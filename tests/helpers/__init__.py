"""Shared test helpers: the repo's paths and 'mutants' (a solution with a known mistake)."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SOLUTIONS = REPO / "solutions"
EXERCISES = REPO / "exercises"
# Exercise 6: the real benchmark's steps in the tests (a learner's: the check's REAL), shared by
# tests/exercises/test_ex06_scaling.py and its instruments' tests.
REAL_FEW_STEPS = dict(warmup=2, iters=5)


def mutant(tmp_path: Path, filename: str, replacements: dict[str, str]) -> Path:
    """Copy ``solutions/<filename>`` into ``tmp_path`` with each ``old`` text replaced by ``new``.

    Every ``old`` must occur in the solution, so a test fails loudly (instead of
    silently testing the unmodified solution) when the solution is rewritten.
    """
    text = (SOLUTIONS / filename).read_text()
    for old, new in replacements.items():
        assert old in text, f"mutant: {old!r} not found in solutions/{filename}"
        text = text.replace(old, new)
    out = tmp_path / filename
    out.write_text(text)
    return out


def session_processes() -> list:
    """Live processes started by this test session (they carry its marker), except this one and its
    warm launch server (:mod:`distlab.runtime.warm`), which outlives every launch by design."""
    import os

    import psutil

    from distlab.runtime import warm
    from distlab.runtime.process import environ_of

    marker = os.environ["DISTLAB_TEST_SESSION"]
    ours = {os.getpid(), *warm.server_pids()}
    found = []
    for p in psutil.process_iter():
        try:
            if p.pid not in ours and environ_of(p).get("DISTLAB_TEST_SESSION") == marker \
                    and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.Error, OSError):
            continue
    return found


# How the launcher names a rank that gloo ended (SIGABRT; at times SIGSEGV, as the abort unwinds), as a regex.
ABORTED = r"rank \d was killed by signal (6 \(SIGABRT\)|11 \(SIGSEGV\)) without raising a Python exception"


def failed(report) -> dict[str, str]:
    """``{criterion name: feedback}`` for every criterion of ``report`` that lost points."""
    return {c.name: c.feedback for c in report.criteria if c.earned < c.points}


def feedback_of(report, criterion: str) -> str:
    """The feedback of the first failed criterion whose name contains ``criterion``."""
    return next(v for k, v in failed(report).items() if criterion in k)


def solution_and_mutants(tmp_path: Path, filename: str, mutants: dict[str, dict[str, str]]) -> dict[str, Path]:
    """``{"solution": solutions/<filename>, name: <mutant file>...}``, each mutant in its own folder."""
    paths = {"solution": SOLUTIONS / filename}
    for name, change in mutants.items():
        (tmp_path / name).mkdir()
        paths[name] = mutant(tmp_path / name, filename, change)
    return paths


def requires_gpus(n: int):
    """Decorator: mark a test ``gpu`` and skip it, with the reason, on a machine with fewer than ``n``
    CUDA GPUs (PyTorch's ``skip_if_lt_x_gpu``, as a pytest mark): it runs wherever the GPUs are."""
    import pytest
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    skip = pytest.mark.skipif(count < n, reason=f"needs {n} CUDA GPU{'s' if n > 1 else ''}; this machine has {count}")

    def mark(test):
        return pytest.mark.gpu(skip(test))

    return mark


def pinned_tool(name: str, package: str) -> str:
    """The command ``name`` that requirements.txt pins through ``package`` (its wheel puts it next to
    this Python), else the one on PATH."""
    found = Path(sys.executable).with_name(name)
    if found.exists():
        return str(found)
    found = shutil.which(name)
    assert found, f"{name} is missing: pip install -r requirements.txt ({package})"
    return found
