"""Exercise 6's α-β part, observed: what rank 0 reports of the learner's ``fit_alpha_beta`` and
``predict_efficiency`` on the grader's inputs (``reference``'s ``DATASETS`` and ``CASES``), in the first
launch (``..probes``). Plain data both ways: imported by the rank side and by the causes.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ....rank.observation import Observation


@dataclass
class Number(Observation):
    """A number one line of ``predict_efficiency`` assigned to a local (or returned)."""

    file: str    # the learner's file (its name)
    line: int    # the line that made it
    name: str    # the local's name ("return" for the returned value)
    value: float
    code: str    # the line's source, stripped


@dataclass
class Fit(Observation):
    """The learner's ``fit_alpha_beta`` on one of ``DATASETS``."""

    value: tuple[float, float] | None  # ``(alpha, beta)``; None: it raised, or returned None
    error: str | None  # what it raised, at the learner's line; None: it returned


@dataclass
class Prediction(Observation):
    """The learner's ``predict_efficiency`` on one of ``CASES``."""

    value: float | None  # the efficiency; None: it raised, or returned None
    error: str | None    # what it raised, at the learner's line; None: it returned
    numbers: list[Number] = field(default_factory=list)  # the numbers its lines made, in order (at most ~50)


@dataclass
class ModelObservation(Observation):
    """Rank 0's observation of the α-β part: one fit per dataset, one prediction per case, in their order."""

    fits: list[Fit] = field(default_factory=list)
    predictions: list[Prediction] = field(default_factory=list)
