"""Instruments the grader places around a learner's code inside each rank.

They observe; they never decide. Each rank returns what they saw (plain
tensors, lists, strings) and the verdict is computed in the grading process.
"""
from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path

import torch

from distlab.worker import import_path


def load_learner(path: str | Path):
    """Import the learner's exercise file by path (never from ``sys.path``)."""
    return import_path(path, name=f"learner_{Path(path).stem}")


class CapturedPrints(contextlib.AbstractContextManager):
    """Captures what the learner's code prints on this rank (stdout and stderr)."""

    def __init__(self):
        self.buffer = io.StringIO()
        self._stack = contextlib.ExitStack()

    def __enter__(self):
        self._stack.enter_context(contextlib.redirect_stdout(self.buffer))
        self._stack.enter_context(contextlib.redirect_stderr(self.buffer))
        return self

    def __exit__(self, *exc):
        self._stack.close()
        return False

    @property
    def lines(self) -> list[str]:
        return [ln for ln in self.buffer.getvalue().splitlines() if ln.strip()]


class SaveSpy(contextlib.AbstractContextManager):
    """Counts ``torch.save`` calls on this rank (and still performs them)."""

    def __init__(self):
        self.paths: list[str] = []
        self._real = torch.save

    def __enter__(self):
        real = self._real

        def spy(obj, f, *args, **kwargs):
            self.paths.append(str(f))
            return real(obj, f, *args, **kwargs)

        torch.save = spy
        return self

    def __exit__(self, *exc):
        torch.save = self._real
        return False


def echo(lines: list[str]) -> None:
    """Show captured learner output in the job log, so a learner debugging sees it."""
    for ln in lines:
        print(ln, file=sys.stdout)
