"""Graded answers the runtime ships, and how a check tells them from the learner's own work.

``distlab`` carries working versions of some graded functions, because the
notebooks and benchmarks need them (exercise 3's ``median_seconds`` is
``distlab.measure.timing.median_seconds``, its ``saved_bytes`` is
``distlab.measure.memory.saved_tensor_bytes``). They stay there; a check names them in
a :class:`RuntimeCopies` and recognises a learner who hands one in instead of
writing it:

* :meth:`RuntimeCopies.identify` (static, before any learner call): the graded
  name *is* a runtime function: imported (``from distlab.measure.timing import
  median_seconds``), aliased (``median_seconds = distlab.measure.timing.median_seconds``),
  a ``functools.partial`` or bound method of one, a function rebuilt from its
  code object, or any other function defined in ``distlab``/``autograder``.
* :meth:`RuntimeCopies.watch` (dynamic, around the learner's calls): while it is
  entered, each copy's *function object* runs a recording stand-in (its
  ``__code__`` is swapped, not the module attribute, so a name bound at the
  learner's import time, ``from distlab.measure.timing import median_seconds as ms``,
  records too), which calls the real code and logs which of the learner's
  functions were on the stack: a thin wrapper, or a ``compare`` that calls the
  runtime's copy instead of the learner's own, is seen. Indirect routes count
  as well: ``distlab.measure.memory.peak_memory`` on the CPU calls
  ``saved_tensor_bytes``.

Both run in the rank and return plain data (dotted names, lists of strings);
:meth:`RuntimeCopies.feedback` turns that data into the message, in the
grading process: ``"median_seconds is distlab's copy (distlab.measure.timing.median_seconds):
write your own"``.

Rules for a check that uses it:

* Construct the :class:`RuntimeCopies` when the rank-side module is imported,
  before any learner file is loaded: the copies are resolved then, so a learner
  file that rebinds ``distlab.measure.timing.median_seconds`` cannot swap in its own.
* Enter the watch around the learner's calls only, never around the grader's
  own instruments: every run of a copy's code while the watch is entered counts
  as the learner's (a copy reached from a thread or a callback, with no
  learner frame on the stack, still counts).

Not recognised: the runtime's source text pasted into the learner's file (its
own code object), and a function rebuilt from a copy's code object called only
through a wrapper (the static check sees a rebuilt function handed in directly).
"""
from __future__ import annotations

import functools
import importlib
import inspect
import os
import sys
import types
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

from .observation import Observation

RUNTIME_PACKAGES = ("distlab", "autograder", "solutions")  # code that is not the learner's to hand in
_STAND_IN = "_autograder_answers_stand_in_"


def _trampoline(*args, _autograder_answers_stand_in_, **kwargs):
    """The code a watched copy runs: its keyword default (set by the watch) is the recording stand-in."""
    return _autograder_answers_stand_in_(*args, **kwargs)


def _resolve(dotted: str):
    """A module-level function, or a function defined in a module-level class (``module.Class.method``:
    a class the runtime ships, such as a ``saved_tensors_hooks`` counter, whose method does the work)."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = vars(obj)[attr] if isinstance(obj, type) else getattr(obj, attr)
        break
    else:
        raise ImportError(f"{dotted}: no module")
    if not isinstance(obj, types.FunctionType) or obj.__closure__:
        raise TypeError(f"{dotted}: only Python functions (no closure) of a module or its classes can be watched")
    return obj


def _unwrap(fn):
    for _ in range(16):
        if isinstance(fn, functools.partial):
            fn = fn.func
        elif inspect.ismethod(fn):
            fn = fn.__func__
        else:
            break
    return fn


def _owner(dotted: str) -> str:
    return dotted.split(".")[0]


class Watch:
    """Records every run of the watched copies while entered (re-enterable, not nestable).

    ``calls``: ``[[dotted name of the copy, [learner functions on the stack, nearest first]], ...]``,
    each distinct pair once; plain data for the rank to return.
    """

    def __init__(self, copies: Mapping[str, types.FunctionType], learner_file: str, names_by_code: dict) -> None:
        self.copies = copies
        self.calls: list[list] = []
        self._file = os.path.realpath(learner_file) if learner_file else None
        self._names = names_by_code
        self._saved: dict[str, tuple] = {}
        self._real_paths: dict[str, str] = {}

    def _is_learner(self, filename: str) -> bool:
        if self._file is None:
            return False
        if filename not in self._real_paths:
            self._real_paths[filename] = os.path.realpath(filename)
        return self._real_paths[filename] == self._file

    def _stand_in(self, dotted: str, original: types.FunctionType):
        def stand_in(*args, **kwargs):
            chain: list[str] = []
            frame = sys._getframe(1)
            while frame is not None:
                code = frame.f_code
                if self._is_learner(code.co_filename):
                    name = self._names.get(code) or getattr(code, "co_qualname", code.co_name).split(".")[0]
                    if name not in chain:
                        chain.append(name)
                frame = frame.f_back
            if [dotted, chain] not in self.calls:
                self.calls.append([dotted, chain])
            return original(*args, **kwargs)
        return stand_in

    def __enter__(self) -> "Watch":
        if self._saved:
            raise RuntimeError("this watch is already entered")
        for dotted, fn in self.copies.items():
            if fn.__code__ is _trampoline.__code__:
                raise RuntimeError(f"{dotted} is already watched (nested watches)")
            original = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
            original.__kwdefaults__ = dict(fn.__kwdefaults__ or {})
            original.__qualname__, original.__module__ = fn.__qualname__, fn.__module__
            self._saved[dotted] = (fn.__code__, fn.__defaults__, fn.__kwdefaults__)
            fn.__code__, fn.__defaults__ = _trampoline.__code__, None
            fn.__kwdefaults__ = {_STAND_IN: self._stand_in(dotted, original)}
        return self

    def __exit__(self, *exc) -> bool:
        for dotted, (code, defaults, kwdefaults) in self._saved.items():
            fn = self.copies[dotted]
            fn.__code__, fn.__defaults__, fn.__kwdefaults__ = code, defaults, kwdefaults
        self._saved.clear()
        return False


class RuntimeCopies:
    """The runtime's working copies of an exercise's graded functions.

    ``graded``: ``{learner function name: dotted names of the runtime functions that answer it}``, e.g.
    ``{"median_seconds": ("distlab.measure.timing.median_seconds",)}``. Resolved (imported) on construction.
    """

    def __init__(self, graded: Mapping[str, Sequence[str]]) -> None:
        self.graded = {name: tuple(copies) for name, copies in graded.items()}
        self.functions = {dotted: _resolve(dotted) for copies in self.graded.values() for dotted in copies}
        self._codes = {fn.__code__: dotted for dotted, fn in self.functions.items()}

    # ---- rank side: observe, return plain data ----

    def identify(self, learner: types.ModuleType) -> dict[str, str]:
        """``{graded name: dotted name}`` for each graded name of ``learner`` that is a runtime function.

        Call it while no watch is entered (a watched copy runs another code object).
        """
        found = {}
        for name in self.graded:
            fn = _unwrap(getattr(learner, name, None))
            if fn is None:
                continue
            code = getattr(fn, "__code__", None)
            dotted = next((d for d, f in self.functions.items() if fn is f), None) or self._codes.get(code)
            if dotted is None:
                module = getattr(fn, "__module__", None) or ""
                if module != learner.__name__ and _owner(module) in RUNTIME_PACKAGES:
                    dotted = f"{module}.{getattr(fn, '__qualname__', getattr(fn, '__name__', '?'))}"
            if dotted:
                found[name] = dotted
        return found

    def watch(self, learner: types.ModuleType) -> Watch:
        """A :class:`Watch` of every copy, attributing calls to ``learner``'s functions by name."""
        names = {}
        for attr, obj in vars(learner).items():
            obj = _unwrap(obj)
            if isinstance(obj, types.FunctionType) and obj.__module__ == learner.__name__:
                names.setdefault(obj.__code__, attr)
        return Watch(self.functions, getattr(learner, "__file__", "") or "", names)

    # ---- grading process: the verdict's message ----

    def feedback(self, name: str, identified: Mapping[str, str], calls: Iterable[Sequence]) -> str:
        """Why ``name`` earns nothing ("" if it is the learner's own), from :meth:`identify` and
        :attr:`Watch.calls` data."""
        dotted = identified.get(name)
        if dotted:
            owner = _owner(dotted)
            if dotted in self.functions:
                return f"{name} is {owner}'s copy ({dotted}): write your own"
            return f"{name} is {dotted} from {owner}, not your own code: write your own"
        for dotted, chain in calls:
            if dotted not in self.graded[name]:
                continue
            owner = _owner(dotted)
            if name in chain:
                return f"{name} is {owner}'s copy (it calls {dotted}): write your own"
            if chain:
                return (f"{chain[0]} calls {owner}'s copy of {name} ({dotted}) instead of yours: "
                        f"write your own {name} and call it")
            return f"{owner}'s copy of {name} ({dotted}) ran during your code's calls: write your own {name}"
        return ""


@dataclass
class Answers(Observation):
    """What a rank saw of a check's :class:`RuntimeCopies`: which graded functions are the runtime's copies."""

    identified: dict[str, str] = field(default_factory=dict)  # graded name -> the copy it is, before any call
    # each copy that ran during the learner's calls: (its dotted name, the learner's functions on the stack,
    # nearest first)
    calls: list[tuple[str, list[str]]] = field(default_factory=list)
