"""What a trace's events hold, as plain data (:mod:`.trace` records them): a checksum of tensors, a hash of
the RNG state, the keys a saved dict held, a returned value in short, a call's plain arguments, and the line
at which one of the learner's functions returns.

All of it travels back to the grader through ``torch.load(weights_only=True)``: str, int, float, ``None``,
and lists and dicts of them.
"""
from __future__ import annotations

import ast
import hashlib
import inspect
import os
import textwrap
from typing import Any, Callable

import torch

KEYS_SHOWN = 12     # of a saved dict's keys
SMALL = 16          # a collective of at most this many elements (a metric's sums) is recorded with its values


def checksum(tensors) -> float:
    """The float64 sum of ``tensors`` (a DTensor's: this rank's shard): equal runs give equal sums."""
    with torch.no_grad():
        return float(sum(getattr(t, "_local_tensor", t).detach().double().sum().item() for t in tensors))


def rng_checksum() -> str:
    """This rank's CPU RNG state (and the current CUDA device's, where there is one), hashed."""
    state = torch.get_rng_state().numpy().tobytes()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state += torch.cuda.get_rng_state().numpy().tobytes()
    return hashlib.sha1(state).hexdigest()[:12]


def held(obj: Any) -> list[str] | str:
    """What a saved or loaded object held: a dict's keys (a nested dict's as ``outer.inner``), or its type."""
    if not isinstance(obj, dict):
        return type(obj).__name__
    keys = []
    for k, v in obj.items():
        inner = list(v)[:4] if isinstance(v, dict) and len(v) <= 4 else []
        keys += [f"{k}.{j}" for j in inner] or [str(k)]
    return keys[:KEYS_SHOWN]


def summary(value: Any) -> Any:
    """A returned value as plain data: numbers and strings as they are, a short tuple or list of them
    element by element, a small tensor by its values (a larger one by its shape), a dict by :func:`held`,
    anything else by its type (and so is anything that cannot be read: a meta tensor's values)."""
    try:
        return _summary(value)
    except Exception:  # noqa: BLE001 - an observation must never change what the learner's code does
        return type(value).__name__


def _summary(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value if not isinstance(value, str) else value[:80]
    if isinstance(value, torch.Tensor):
        return f"tensor{list(value.shape)}" if value.numel() > SMALL else \
            [float(v) for v in getattr(value, "_local_tensor", value).detach().double().flatten().tolist()]
    if isinstance(value, (tuple, list)) and len(value) <= 4:
        return [_summary(v) for v in value]
    if isinstance(value, dict):
        return held(value)
    return type(value).__name__


PLAIN = (type(None), bool, int, float, str)


def plain_arguments(fn: Callable, args: tuple, kwargs: dict) -> dict:
    """The arguments of a call (defaults included, so that any way of writing it reads the same) whose
    values are plain numbers, strings or ``None``: a sampler's ``shuffle`` and ``seed``, an epoch."""
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return {}
    bound.apply_defaults()
    return {k: v for k, v in bound.arguments.items()  # not a path: each run has its own directory
            if isinstance(v, PLAIN) and k != "self" and not (isinstance(v, str) and os.sep in v)}


def return_line(fn) -> tuple[int, str]:
    """The line of ``fn``'s one ``return`` statement (its last statement's where it has none or several) and
    its code."""
    try:
        lines, start = inspect.getsourcelines(fn)
        tree = ast.parse(textwrap.dedent("".join(lines)))
    except (OSError, TypeError, SyntaxError):
        return fn.__code__.co_firstlineno, ""
    returns = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Return)]
    at = returns[0] if len(returns) == 1 else tree.body[0].body[-1].lineno
    return start + at - 1, lines[at - 1].strip()[:120]
