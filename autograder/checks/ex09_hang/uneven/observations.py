"""Exercise 9's part 2 (``train_uneven``): the scenarios, each rank's batches in them, the typed record each rank
returns for one scenario (:class:`ScenarioRun`), and one scenario's run on every rank with what follows from it
(:class:`Scenario`: the steps, the ranks that had a batch at each, and the single-process reference that replays
the global stream of batches). Read on both sides of the seam: it imports nothing of either.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch
from torch import nn

from distlab.lab.hang import KEEP_C, KEEP_D, small_classifier

from ....rank.observation import Observation
from ..partings import Parting

LR = 0.5
ROWS = 4   # samples in every batch of every rank: the mean over samples is then the mean of the ranks' means
# name -> each rank's number of batches. The edge cases the contract names: the longest rank is not rank 0; a rank
# with no batch at all (rank 0, whose weights every other rank's DDP broadcast would start from); equal lengths.
SCENARIOS: dict[str, tuple[int, ...]] = {"uneven": (2, 4), "no_batch": (0, 2), "equal": (2, 2)}
# At W=4, train_uneven alone: ranks of 3 different counts, one with none, the most on ranks 0 and 3 (so that the
# pairs {0, 1} and {2, 3}, and {0, 2} and {1, 3}, each run as many steps): a sum over part of the ranks, right at W=2,
# is seen in the weights, not as a hang.
WIDE: dict[str, tuple[int, ...]] = {"wide": (3, 1, 0, 3)}
LENGTHS = {**SCENARIOS, **WIDE}
# Ops a rank may make per step of the longest rank (and one more step) before the Ledger calls the loop endless:
# the reference makes 1 (its count and gradients in one buffer), by parameter 1 + 4, DDP's with join() about 5.
OPS_PER_STEP = 40
MAX_PAST_END = 200   # asks for a batch after this rank's last before the stream calls the loop endless
model = small_classifier


def uneven_batch(rank: int, index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s batch number ``index`` (the same in every scenario): ``x`` (ROWS x features), ``y``."""
    gen = torch.Generator().manual_seed(90_000 + 100 * rank + index)
    return torch.randn(ROWS, KEEP_D, generator=gen), torch.randint(0, KEEP_C, (ROWS,), generator=gen)


def label(lengths: tuple[int, ...]) -> str:
    """``"ranks with 2 and 4 batches"``: a scenario as feedback names it."""
    counts = [str(n) for n in lengths]
    return f"ranks with {', '.join(counts[:-1])} and {counts[-1]} batches"


@dataclass
class UnevenCall(Observation):
    """One collective a rank made in ``train_uneven`` (the :class:`~..ledger.Ledger`'s op and its tags)."""

    kind: str            # the op: "all_reduce", "broadcast", ...
    shape: list[int]     # its first tensor's shape ([] for a scalar or no tensor)
    step: int | None     # the index of the last batch the rank had taken (None: none yet)
    exhausted: bool      # the rank's stream had already said it had no more batches
    at: str | None       # the learner's line that made it, "ex09_hang.py:120 (code)" (None: outside the file)
    n: int               # its number among the rank's collectives in the scenario, from 1
    input_abs: float     # the sum of |input| of its floating-point tensors, before it ran

    @property
    def numel(self) -> int:
        return int(torch.Size(self.shape).numel())


@dataclass
class Joined(Observation):
    """One ``torch.distributed.algorithms.Join`` the learner's code made (``DDP.join()`` makes one too)."""

    joinables: list[str]             # the class names of what it joins ("DistributedDataParallel", ...)
    divide_by_initial_world_size: bool  # the keyword DDP's join hook reads (its default: True)


@dataclass
class ScenarioRun(Observation):
    """What one rank observed of one ``train_uneven`` call in one scenario."""

    rank: int
    scenario: str        # a key of LENGTHS
    batches: int         # this rank's batches in it
    final: dict[str, torch.Tensor] = field(default_factory=dict)  # the model's weights after train_uneven (CPU)
    # batch index -> the model's weights when that batch first went through its forward (after `index` steps)
    forwarded: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)
    direct: int = 0      # forwards of a batch that called the model itself while a DDP wrapper of it existed
    taken: int = 0       # batches the learner took from the stream
    read_ahead: int = 0  # the most batches taken past the one going through the forward (1: a look-ahead)
    exhausted: bool = False  # the learner asked for a batch past the last
    calls: list[UnevenCall] = field(default_factory=list)  # every collective made, in order
    mismatch: Parting | None = None  # where the ranks' collectives parted (None: they never did)
    error: str | None = None  # what train_uneven raised, other than the parting ("Type: message"; None: nothing)
    where: str = ""      # the learner's line it raised at ("": none, or no error)
    not_implemented: bool = False  # it raised NotImplementedError (the stub)
    wrapped: int = 0     # DistributedDataParallel wrappers built around the model
    joins: list[Joined] = field(default_factory=list)  # every Join made, in order
    traceback: str | None = None  # that error's traceback, its last 2000 characters


@dataclass
class Scenario:
    """One scenario's run: every rank's :class:`ScenarioRun` (rank order), and the reference it is judged against."""

    name: str
    ranks: list[ScenarioRun]

    @property
    def lengths(self) -> tuple[int, ...]:
        return LENGTHS[self.name]

    @property
    def world(self) -> int:
        return len(self.ranks)

    @property
    def steps(self) -> int:
        """The job's steps: the longest rank's batches."""
        return max(self.lengths)

    @property
    def label(self) -> str:
        return label(self.lengths)

    @property
    def longest(self) -> int:
        """The highest rank with the most batches (a rank that has a batch at every step)."""
        return max(range(self.world), key=lambda r: (self.lengths[r], r))

    def active(self, step: int) -> list[int]:
        """The ranks that have a batch at ``step``."""
        return [r for r in range(self.world) if step < self.lengths[r]]

    @property
    def mismatch(self) -> Parting | None:
        """The first rank's report of where the ranks' collectives parted (``None``: they never did)."""
        return next((r.mismatch for r in self.ranks if r.mismatch), None)

    @property
    def finished(self) -> bool:
        """Every rank returned from ``train_uneven``, with no error, its collectives matching the others'."""
        return self.mismatch is None and not any(r.error for r in self.ranks)

    def step_from(self, state: dict[str, torch.Tensor], step: int) -> dict[str, torch.Tensor]:
        """One process's SGD step ``step`` from the weights ``state``: the mean loss over that step's samples."""
        return step_from(self.name, state, step)

    @property
    def reference(self) -> list[dict[str, torch.Tensor]]:
        """One process replaying the global stream: its weights after 0, 1, ..., ``steps`` steps."""
        return reference(self.name)


def step_from(name: str, state: dict[str, torch.Tensor], step: int,
              ranks: tuple[int, ...] | None = None) -> dict[str, torch.Tensor]:
    """One process's SGD step ``step`` of scenario ``name`` from the weights ``state``: the mean loss over the
    samples of the batches of every rank (of ``ranks``; ``None``: all) that has one at that step."""
    parts = [uneven_batch(r, step) for r, n in enumerate(LENGTHS[name]) if step < n and (ranks is None or r in ranks)]
    if not parts:
        return state
    x, y = torch.cat([x for x, _ in parts]), torch.cat([y for _, y in parts])
    net = model()
    net.load_state_dict(state)
    nn.functional.cross_entropy(net(x), y).backward()
    with torch.no_grad():
        for p in net.parameters():
            p -= LR * p.grad
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


@functools.cache
def reference(name: str, ranks: tuple[int, ...] | None = None) -> list[dict[str, torch.Tensor]]:
    """:attr:`Scenario.reference`: the same for every file, computed once per grading process. ``ranks``: one
    process that replays the batches of those ranks only (what a sum over part of the job learns)."""
    states = [{k: v.detach().clone() for k, v in model().state_dict().items()}]
    for step in range(max(LENGTHS[name])):
        states.append(step_from(name, states[-1], step, ranks))
    return states
