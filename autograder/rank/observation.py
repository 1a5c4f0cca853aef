"""The typed contract between a rank and the grading process: what a check's probes observed, as dataclasses.

A check's ``observations.py`` declares what its rank side reports, one :class:`Observation` subclass per
record (a dataclass: each field named, typed and documented where it is declared), and its probes fill
them in. They cross from the ranks to the grader through ``torch.load(weights_only=True)``, which loads
plain data only, so a rank returns :meth:`Observation.to_wire` (a dict of str, int, float, bool, ``None``,
tensors, and lists, tuples and dicts of them) and the grading process reads it back with
:meth:`Observation.from_wire`, which rebuilds the nested observations its type hints name. A key that
one side writes and the other does not know is an :class:`ObservationError` naming both, at the moment
the record is read, not a ``KeyError`` deep in a criterion.

Nothing here imports torch or the grader: it runs on both sides of the seam.
"""
from __future__ import annotations

import dataclasses
import functools
import types
import typing


class ObservationError(ValueError):
    """A rank's record does not match the observation class that reads it (the grader's own bug)."""


class Observation:
    """Base of the check's observation dataclasses (decorate each subclass with ``@dataclass``)."""

    def to_wire(self) -> dict:
        """The record as plain data, for ``torch.save``/``torch.load(weights_only=True)``."""
        return {f.name: _to_wire(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_wire(cls, wire: dict):
        """The record a rank sent (:meth:`to_wire`), as an instance of ``cls``, nested observations included."""
        if not isinstance(wire, dict):
            raise ObservationError(f"{cls.__qualname__}: a rank sent {type(wire).__name__}, not a record")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(wire) - set(fields))
        missing = sorted(name for name, f in fields.items() if name not in wire and f.default is dataclasses.MISSING
                         and f.default_factory is dataclasses.MISSING)
        if unknown or missing:
            raise ObservationError(f"{cls.__qualname__}: the rank's record has {unknown or 'no unknown key'} "
                                   f"that the class does not declare, and lacks {missing or 'nothing'}")
        hints = _hints(cls)
        return cls(**{name: _from_wire(hints[name], value) for name, value in wire.items()})


def _to_wire(value):
    if isinstance(value, Observation):
        return value.to_wire()
    if isinstance(value, list):
        return [_to_wire(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_to_wire(v) for v in value)
    if isinstance(value, dict):
        return {k: _to_wire(v) for k, v in value.items()}
    return value


@functools.cache
def _hints(cls: type) -> dict:
    return typing.get_type_hints(cls)


def _from_wire(hint, value):
    """``value`` as ``hint`` declares it: observations (also inside ``list``, ``tuple``, ``dict`` and
    ``X | None``) are rebuilt; everything else is plain data and stays as it came."""
    if value is None:
        return None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if isinstance(hint, type) and issubclass(hint, Observation):
        return hint.from_wire(value)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return _from_wire(inner[0], value) if len(inner) == 1 else value
    if origin is list and args:
        return [_from_wire(args[0], v) for v in value]
    if origin is tuple and args:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_from_wire(args[0], v) for v in value)
        return tuple(_from_wire(a, v) for a, v in zip(args, value))
    if origin is dict and len(args) == 2:
        return {k: _from_wire(args[1], v) for k, v in value.items()}
    return value
