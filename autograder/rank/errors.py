"""What the learner's code raised, and where in the learner's file: the one way the rank side and the
grading process say it.

A rank catches an error in one part of the learner's code (:func:`attempt`) so that the parts that
could still be judged keep their marks, and reports it as :func:`raised` writes it, at the
:func:`learner_frame` it came from. The grading process reads the same frames back from a rank's
traceback text (``grader.main.explain``), so both say ``"ex01_ddp.py line 42 in train_ddp: <code>"``.
"""
from __future__ import annotations

import re
import traceback
from pathlib import Path
from typing import Any, Callable, NamedTuple

MESSAGE_CHARS = 300  # of an error's message, in feedback: enough for PyTorch's, not a page of it
# the log prefix c10's checks put before their message ("[rank0]:[F1207 19:49:03.501851262 ProcessGroupGloo.cpp:1536]
# Check failed: ..."): a time stamp and PyTorch's source line, neither a fact of the learner's code
_C10_PREFIX = re.compile(r"(\[rank\d+\]:)?\[[IWEF]\d{4} [\d:.]+ [^\]\s]+:\d+\] ")


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


def raised(exc: BaseException | None, path: str | Path | None = None) -> str | None:
    """``"Type: message"`` (the message's first characters) of ``exc``; ``None`` for no exception. With the
    learner's ``path``: and the tensors named on the learner's line (:func:`values_at`)."""
    if exc is None:
        return None
    values = values_at(exc, path) if path is not None else ""
    message = _C10_PREFIX.sub("", str(exc).strip())
    return f"{type(exc).__name__}: {message[:MESSAGE_CHARS]}" + (f" ({values})" if values else "")


def raised_at(exc: BaseException | None, path: str | Path) -> str | None:
    """:func:`raised` with the tensors on the learner's line, then where: ``"NameError: name 'device' is not
    defined, at ex06_scaling.py line 91 in make_ddp_step: ..."`` (without where when no frame is the learner's)."""
    if exc is None:
        return None
    frame = learner_frame(exc, path)
    return raised(exc, path) + (f", at {frame}" if frame else "")


VALUES_NOTE = "values at your line:"  # how a rank's traceback carries them to the grading process (a note)


def describe_value(value: Any) -> str | None:
    """A tensor as feedback shows it: dtype, shape, and for autograd whether it requires grad and has a
    ``.grad``; a list or tuple of tensors by its first shapes; anything else ``None``."""
    import torch

    if isinstance(value, torch.Tensor):
        grad = "" if not value.is_leaf else f", grad {'None' if value.grad is None else list(value.grad.shape)}"
        return (f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)}, requires_grad={value.requires_grad}"
                f"{grad}")
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, torch.Tensor) for v in value):
        shapes = ", ".join(str(list(v.shape)) for v in value[:4])
        return f"{len(value)} tensors [{shapes}{', ...' if len(value) > 4 else ''}]"
    return None


def values_at(exc: BaseException, path: str | Path) -> str:
    """The tensors named in the code of the learner's frame ``exc`` went through (``act: float32[16, 64],
    requires_grad=False, grad None``): what a shape error or a missing gradient was about."""
    tb, frame = exc.__traceback__, None
    while tb is not None:
        if Path(tb.tb_frame.f_code.co_filename).resolve() == Path(path).resolve():
            frame, lineno = tb.tb_frame, tb.tb_lineno
        tb = tb.tb_next
    if frame is None:
        return ""
    import linecache

    code = linecache.getline(frame.f_code.co_filename, lineno)
    shown = []
    for name in dict.fromkeys(re.findall(r"\b[A-Za-z_]\w*\b", code)):
        if name in frame.f_locals and (text := describe_value(frame.f_locals[name])):
            shown.append(f"{name}: {text}")
    return "; ".join(shown[:6])


def note_values(exc: BaseException, path: str | Path | None) -> None:
    """Add the values at the learner's line to ``exc`` as a note: its traceback's text carries it."""
    if path is not None and (values := values_at(exc, path)):
        exc.add_note(f"{VALUES_NOTE} {values}")


def values_noted(traceback_text: str) -> str:
    """The values :func:`note_values` added to an exception, read back from its traceback's text."""
    found = re.findall(rf"^{re.escape(VALUES_NOTE)} (.*)$", traceback_text, flags=re.M)
    return found[-1] if found else ""


def attempt(fn: Callable, *args, **kwargs) -> tuple[Any, Exception | None]:
    """``(fn(*args, **kwargs), None)``, or ``(None, the exception)`` when it raised: one part of the
    learner's code that raises costs only its own marks, and the verdict explains it."""
    try:
        return fn(*args, **kwargs), None
    except Exception as exc:  # noqa: BLE001 - any error is the learner's code's, reported as feedback
        _note(exc)
        return None, exc


def _note(exc: Exception) -> None:
    """Tell this rank's heartbeat what the learner's code raised, where: a rank that goes on after it may leave
    the others waiting in a collective it never reached, and a hang's report then says so."""
    from distlab.runtime import heartbeat
    from distlab.runtime.waits import is_runtime

    mine = [f for f in frames(exc) if not is_runtime(f.filename)]
    if mine:  # "Type: message" as raised() says it, its first line, 120 characters of the message at most
        said = raised(exc).splitlines()[0][:len(type(exc).__name__) + 2 + 120].removesuffix(": ")
        heartbeat.note_raised(f"{mine[-1].name} raised {said} ({Path(mine[-1].filename).name}:{mine[-1].lineno})")
