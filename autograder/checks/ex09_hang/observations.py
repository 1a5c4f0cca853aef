"""Exercise 9's observations: the typed record each rank returns for one file (:class:`RankObservation`:
its collectives, the backwards that reached its parameters, where the ranks parted), and one file's run
on every rank with what follows from it (each rank's collectives by step, the mismatch where the ranks
parted, the single-process reference)."""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch
from torch import nn

from distlab.lab.hang import EMPTY_STEPS, KEEP_STEPS, masked_batch, small_classifier

from ...rank.observation import Observation
from .partings import Parting
from .uneven.observations import ScenarioRun

STEPS, LR = KEEP_STEPS, 0.5
EMPTY = EMPTY_STEPS
model, batch = small_classifier, masked_batch


@dataclass
class Collective(Observation):
    """One collective the rank made (``probes.Ledger``: ``CollectiveRecorder``'s op and the grader's tags)."""

    kind: str           # the op: "all_reduce", "barrier", ...
    shape: list[int]    # its first tensor's shape ([] for a scalar or no tensor)
    step: int | None    # the step the learner's loop was at (None: before the first batch)
    at: str | None      # the learner's line that made it, "ex09_hang.py:78 (code)" (None: outside the file)
    n: int              # its number among the rank's collectives, from 1
    input_abs: float    # the sum of |input| of its floating-point tensors, before it ran


@dataclass
class Backward(Observation):
    """One gradient a backward accumulated into one of the model's parameters."""

    step: int | None  # the step the learner's loop was at
    after: int        # the collectives the rank had made by then
    grad_abs: float   # the sum of |grad| of that parameter after it


@dataclass
class RankObservation(Observation):
    """What one rank observed of one file: its ``train``, and its ``train_uneven`` (part 2: ``uneven``)."""

    rank: int
    final: dict[str, torch.Tensor] = field(default_factory=dict)  # the model's weights after train (CPU)
    calls: list[Collective] = field(default_factory=list)  # every collective made, in order
    counts: dict[str, int] = field(default_factory=dict)   # collective kind ("all-reduce", ...) -> calls made
    mismatch: Parting | None = None  # where the ranks' collectives parted (None: they never did)
    error: str | None = None  # what train raised, other than the parting ("Type: message"; None: nothing)
    where: str = ""           # the learner's line it raised at ("": none, or no error)
    backwards: list[Backward] = field(default_factory=list)  # every gradient accumulated, in order
    traceback: str | None = None  # that error's traceback, its last 2000 characters
    uneven: list[ScenarioRun] = field(default_factory=list)  # part 2: train_uneven in each scenario, in order


@dataclass
class Run:
    """One file's run: every rank's observation (``probes._observe``), in rank order."""

    ranks: list[RankObservation]

    @property
    def world(self) -> int:
        return len(self.ranks)

    @property
    def mismatch(self) -> Parting | None:
        """The first rank's report of where the ranks' collectives parted (``None``: they never did)."""
        return next((r.mismatch for r in self.ranks if r.mismatch), None)

    def at_step(self, rank: int, step: int, kind: str = "all_reduce") -> list[Collective]:
        return [c for c in self.ranks[rank].calls if c.step == step and c.kind == kind]

    def grad_reduces(self, rank: int, step: int) -> list[Collective]:
        """The all-reduces of ``rank`` at ``step`` of more than one number (gradients, not counts or flags)."""
        return [c for c in self.at_step(rank, step) if c.shape]

    @functools.cached_property
    def param_shapes(self) -> list[list[int]]:
        return [list(p.shape) for p in model().parameters()]

    def count_reduces(self, rank: int, step: int) -> list[Collective]:
        """The all-reduces of ``rank`` at ``step`` of a tensor shaped like no parameter (a count, a flag)."""
        return [c for c in self.at_step(rank, step) if c.shape not in self.param_shapes]

    def backwards(self, rank: int, step: int) -> list[Backward]:
        """The gradients a backward accumulated into ``rank``'s parameters at ``step`` (``probes.Backwards``)."""
        return [b for b in self.ranks[rank].backwards if b.step == step]

    @functools.cached_property
    def unchanged(self) -> bool:
        """Whether every rank's weights came back as they started (no update was applied)."""
        start = model().state_dict()
        return all(torch.equal(r.final[k], v) for r in self.ranks for k, v in start.items())

    def kept(self, rank: int, step: int) -> int:
        return int(batch(rank, step)[2].sum())

    def empty_steps(self) -> list[tuple[int, int]]:
        """``(rank, step)`` where that rank kept no sample while another rank kept some."""
        return [(r, s) for r in range(self.world) for s in EMPTY.get(r, ())
                if any(self.kept(o, s) for o in range(self.world))]

    @property
    def reference(self) -> dict:
        """One process, SGD on the mean cross-entropy over the kept samples of each global batch."""
        return reference(self.world)


@functools.cache
def reference(world: int) -> dict:
    """:attr:`Run.reference` at ``world`` ranks: the same for every file, computed once per grading process."""
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    for step in range(STEPS):
        parts = [batch(r, step) for r in range(world)]
        x = torch.cat([x[k] for x, _, k in parts])
        y = torch.cat([y[k] for _, y, k in parts])
        if len(y) == 0:
            continue  # no sample on any rank: nothing to learn
        opt.zero_grad()
        nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in net.state_dict().items()}
