"""What the learner's code raised, and where in the learner's file: the one way the rank side and the
grading process say it.

A rank catches an error in one part of the learner's code (:func:`attempt`) so that the parts that
could still be judged keep their marks, and reports it as :func:`raised` writes it, at the
:func:`learner_frame` it came from. The grading process reads the same frames back from a rank's
traceback text (``run_one.explain``), so both say ``"ex01_ddp.py line 42 in train_ddp: <code>"``.
"""
from __future__ import annotations

import re
import traceback
from pathlib import Path
from typing import Any, Callable, NamedTuple

MESSAGE_CHARS = 300  # of an error's message, in feedback: enough for PyTorch's, not a page of it


class Frame(NamedTuple):
    """One frame of a traceback: the file, the line number, the function and its line of code."""

    filename: str
    lineno: int
    name: str
    line: str

    def __str__(self) -> str:
        return f"{Path(self.filename).name} line {self.lineno} in {self.name}: {self.line}"


def frames(error: BaseException | str) -> list[Frame]:
    """The frames of an exception's traceback, or of a traceback's text (``Traceback (most recent...``)."""
    if isinstance(error, BaseException):
        return [Frame(f.filename, f.lineno, f.name, (f.line or "").strip())
                for f in traceback.extract_tb(error.__traceback__)]
    return [Frame(file, int(line), func, code.strip())
            for file, line, func, code in re.findall(r'File "([^"]*)", line (\d+), in (\S+)\n\s*(.*)', error)]


def learner_frame(error: BaseException | str, path: str | Path) -> Frame | None:
    """The last frame of ``error``'s traceback in the learner's file at ``path`` (``None``: none is)."""
    mine = [f for f in frames(error) if Path(f.filename).resolve() == Path(path).resolve()]
    return mine[-1] if mine else None


def raised(exc: BaseException | None) -> str | None:
    """``"Type: message"`` (the message's first characters) of ``exc``; ``None`` for no exception."""
    if exc is None:
        return None
    return f"{type(exc).__name__}: {str(exc).strip()[:MESSAGE_CHARS]}"


def attempt(fn: Callable, *args, **kwargs) -> tuple[Any, Exception | None]:
    """``(fn(*args, **kwargs), None)``, or ``(None, the exception)`` when it raised: one part of the
    learner's code that raises costs only its own marks, and the verdict explains it."""
    try:
        return fn(*args, **kwargs), None
    except Exception as exc:  # noqa: BLE001 - any error is the learner's code's, reported as feedback
        return None, exc
