"""Exercise 2's observations: one file's run, as one :class:`Scenario` per scenario (window sizes and
micro-batch sizes), each with the micro-steps, optimizer steps and all-reduce rounds its ranks showed.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from .probes import SCENARIOS, windows
from .reference import window_gradients


@dataclass
class Scenario:
    """One scenario of one file: rank 0's and rank 1's observations, and the single-process reference."""

    name: str
    ranks: list[dict]

    @property
    def obs(self) -> dict:  # rank 0's: DDP leaves both ranks with the same steps
        return self.ranks[0]

    def __post_init__(self):
        self.sizes, self.k = SCENARIOS[self.name]
        self.n_windows = len(windows(len(self.sizes), self.k))
        self.micro = [step["micro"] for step in self.obs["steps"]]  # micro-steps before each optimizer step
        self.expected_micro = [len(w) for w in windows(len(self.sizes), self.k)]
        total = self.obs["total_rounds"]  # all-reduce rounds so far at each micro-step's forward, and at the end
        self.window_rounds = [total[min(w.stop, len(total) - 1)] - total[w.start]
                              for w in windows(len(self.sizes), self.k) if w.start < len(total)]

    @functools.cached_property
    def references(self) -> list[dict]:
        """Each window's big-batch gradient and the usual wrong ones, at the weights rank 0 stepped from."""
        steps = self.obs["steps"][:self.n_windows]
        return [window_gradients(self.name, w, step["params"]) for w, step in enumerate(steps)]


@dataclass
class Run:
    """One file's run: every rank's observation, as one :class:`Scenario` per scenario."""

    ranks: list[dict]

    def __post_init__(self):
        self.scenarios = {name: Scenario(name, [r[name] for r in self.ranks]) for name in SCENARIOS}
