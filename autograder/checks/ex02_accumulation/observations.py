"""Exercise 2's observations: the typed record each rank returns for one file (:class:`RankObservation`: one
:class:`ScenarioObservation` per scenario, with its optimizer steps and zero_grad calls), and one file's run
as one :class:`Scenario` per scenario (window sizes and micro-batch sizes), each with the micro-steps,
optimizer steps and all-reduce rounds its ranks showed.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch

from ...rank.observation import Observation
from .reference import window_gradients
from .scenarios import SCENARIOS, windows


@dataclass
class Step(Observation):
    """One optimizer step of the learner's loop, as it began."""

    grads: dict[str, torch.Tensor]   # parameter name -> the .grad it stepped with (zeros where None), on the CPU
    params: dict[str, torch.Tensor]  # parameter name -> the weights it stepped from
    micro: int                       # the micro-steps (forwards) since the previous optimizer step


@dataclass
class ZeroGrad(Observation):
    """One ``zero_grad()`` call, the optimizer's or the model's (DDP wrapper or inner module)."""

    steps: int  # the optimizer steps made before it
    micro: int  # the micro-steps (forwards) since the last optimizer step


@dataclass
class ScenarioObservation(Observation):
    """One rank's run of one scenario: ``train_accumulated`` over its micro-batches, from the same weights."""

    steps: list[Step] = field(default_factory=list)  # every optimizer step, in order
    final: dict[str, torch.Tensor] = field(default_factory=dict)  # the weights after the loop
    # the gradients at the first forward that followed another in the same window (None: none did)
    mid_grads: dict[str, torch.Tensor] | None = None
    zero_grads: list[ZeroGrad] = field(default_factory=list)  # every zero_grad() call, in order
    start_cleared: list[bool] = field(default_factory=list)  # each window's but the first: .grad zero at its start?
    end_cleared: bool = True  # .grad zero (or None) when train_accumulated returned, as on entry
    device_count_at: str = ""  # where train_accumulated first called torch.cuda.device_count() ("": nowhere)
    # where the file first read LOCAL_WORLD_SIZE, at its import or in train_accumulated ("": nowhere or not watched)
    local_world_size_at: str = ""
    # DDP's all-reduce rounds so far at each micro-step's forward, then the rounds at the end
    total_rounds: list[int] = field(default_factory=list)


@dataclass
class RankObservation(Observation):
    """What one rank observed of one file: every scenario's run."""

    scenarios: dict[str, ScenarioObservation] = field(default_factory=dict)  # scenario name -> its run


@dataclass
class Scenario:
    """One scenario of one file: every rank's observations (rank order), and the single-process reference."""

    name: str
    ranks: list[ScenarioObservation]

    @property
    def obs(self) -> ScenarioObservation:  # rank 0's: DDP leaves both ranks with the same steps
        return self.ranks[0]

    def __post_init__(self):
        self.world = len(self.ranks)
        self.sizes, self.k = SCENARIOS[self.name]
        self.n_windows = len(windows(len(self.sizes), self.k))
        self.micro = [step.micro for step in self.obs.steps]  # micro-steps before each optimizer step
        self.expected_micro = [len(w) for w in windows(len(self.sizes), self.k)]
        total = self.obs.total_rounds  # all-reduce rounds so far at each micro-step's forward, and at the end
        self.window_rounds = [total[min(w.stop, len(total) - 1)] - total[w.start]
                              for w in windows(len(self.sizes), self.k) if w.start < len(total)]

    @functools.cached_property
    def references(self) -> list[dict]:
        """Each window's big-batch gradient and the usual wrong ones, at the weights rank 0 stepped from."""
        steps = self.obs.steps[:self.n_windows]
        return [window_gradients(self.name, w, step.params, self.world) for w, step in enumerate(steps)]


@dataclass
class Run:
    """One file's run at one world size: every rank's observation, as one :class:`Scenario` per scenario it
    ran."""

    ranks: list[RankObservation]

    def __post_init__(self):
        self.scenarios = {name: Scenario(name, [r.scenarios[name] for r in self.ranks]) for name in SCENARIOS
                          if name in self.ranks[0].scenarios}
