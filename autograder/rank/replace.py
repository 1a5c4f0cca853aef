"""Library functions replaced by an instrument's stand-ins, wherever the learner's code reaches them.

:class:`Replace` is what every spy that patches a function is made of (:mod:`.spies`); :func:`watched`
counts a module as the learner's, so that every replacement covers the names it bound.
"""
from __future__ import annotations

import contextlib
from types import ModuleType
from typing import Callable, Mapping


def watched(module: ModuleType) -> ModuleType:
    """Count ``module`` as the learner's: every :class:`Replace` entered now or later covers its names."""
    _LEARNERS.append(module)
    for replacement in _ACTIVE:
        replacement.cover(module)
    return module


def transparent(stand_in: Callable) -> Callable:
    """Mark ``stand_in`` as passing its call straight on: the general layer's trace then records the collective
    it forwards as called by the learner's line itself (:meth:`~.trace.Tracer.called_directly`), as it would be
    without the instrument, so that an instrument changes no trace (the reference's as well as the learner's)."""
    TRANSPARENT.add(stand_in.__code__)
    return stand_in


TRANSPARENT: set = set()           # the code of the stand-ins marked transparent
_LEARNERS: list[ModuleType] = []   # every learner module this process imported, in order
_ACTIVE: list["Replace"] = []      # the replacements entered now, outermost first
_MISSING = object()


class Replace(contextlib.AbstractContextManager):
    """Library functions replaced by an instrument's stand-ins, wherever the learner's code reaches them.

    ``Replace({(time, "perf_counter"): make, (timeit, "default_timer"): make, ...})``: while entered,
    ``owner.name`` is ``make(real)`` (``real``: what it was on entry), and so is every global of a
    learner module (:func:`load_learner`) that *is* ``real``. A module binds what it imports once,
    when it is imported: ``from time import perf_counter``, ``from timeit import default_timer as
    clock`` or a default argument ``clock=time.perf_counter`` keep the real function after a plain
    ``setattr(time, ...)``, and would measure something else than ``time.perf_counter()``. So:

    * enter it *before* ``load_learner``: the module binds the stand-ins themselves (names, default
      arguments, closures, class attributes alike);
    * and for a module imported before it was entered, its globals that are the real function are
      replaced too, for the duration (``import X as Y`` and ``X.name`` need nothing more).

    On exit everything is put back, in reverse order, so replacements nest. A name the module bound
    to a stand-in at import keeps it afterwards: a stand-in must behave as the real function
    whenever its instrument is not observing. ``real[(owner, name)]`` is the replaced function.
    """

    def __init__(self, targets: Mapping[tuple[object, str], Callable[[Callable], Callable]]):
        self.targets = dict(targets)
        self.real: dict[tuple[object, str], Callable] = {}
        self._stand_ins: dict[int, Callable] = {}  # id(real) -> its stand-in
        self._undo: list[tuple[object, str, object]] = []

    def __enter__(self) -> "Replace":
        stand_ins: dict = {}
        for (owner, name), make in self.targets.items():
            real = getattr(owner, name)
            self.real[(owner, name)] = real
            if id(real) not in stand_ins:  # aliases of one function (torch.save, serialization.save) share one
                stand_ins[id(real)] = make(real)
            self._set(owner, name, stand_ins[id(real)])
        self._stand_ins = stand_ins
        _ACTIVE.append(self)
        for module in _LEARNERS:
            self.cover(module)
        return self

    def _set(self, owner: object, name: str, value: object) -> None:
        self._undo.append((owner, name, vars(owner).get(name, _MISSING)))
        setattr(owner, name, value)

    def cover(self, module: ModuleType) -> None:
        """Replace the names ``module`` bound to a replaced function (``from X import name``), until exit."""
        reals = {id(real): real for real in self.real.values()}
        for key, value in list(vars(module).items()):
            if id(value) in reals and value is reals[id(value)] and not key.startswith("__"):
                self._set(module, key, self._stand_ins[id(value)])

    def __exit__(self, *exc) -> bool:
        if self in _ACTIVE:
            _ACTIVE.remove(self)
        for owner, name, old in reversed(self._undo):
            if old is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, old)
        self._undo.clear()
        return False
