"""Exercise 5's observations: the typed contract between the ranks (``probes``) and the grading process.

A rank writes its records to files as it goes (a killed process returns nothing, but its files survive):
per phase, one :class:`StepRecord` a step (``{phase}-rank{R}.jsonl``), one :class:`CallRecord` a DCP or
state-dict call (``{phase}-calls-rank{R}.jsonl``), one :class:`ErrorRecord` an error
(``{phase}-errors.jsonl``), and rank 0 the :class:`FinalState` of a phase that finished
(``{phase}-final.pt``); ``rank_main`` returns one :class:`RankObservation` a file. :class:`Run` is the
grader's view of one file's phases, read back from those files, and what the launches raised.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from distlab import LaunchError
from distlab.checkpoint import complete_checkpoints

from ...rank.observation import Observation

WORLD = 2  # the ranks of every launch but the reshard


@dataclass
class PreStep(Observation):
    """What a step started from: this rank's snapshot just before its (last) ``optimizer.step()``."""

    fp: float         # the float64 sum of this rank's local parameter shards
    adam_step: float  # Adam's step count (of the first parameter)
    moments: float    # the float64 sum of Adam's exp_avg and exp_avg_sq over this rank's shards
    lr: float         # the learning rate the step trained with
    rng: str          # a hash of this rank's RNG state (CPU's, and CUDA's under NCCL)


@dataclass
class StepRecord(Observation):
    """One step of one rank in a phase, written when the learner's ``on_step`` reported it."""

    attempt: int  # the torchrun attempt (0, then 1 after the first restart)
    tag: str      # the phase's tag: "ref", "first", "resume", "restart", "reshard"
    step: int     # the step number the learner reported
    data: list[int]  # the sample indices this rank read since the previous step
    fp: float     # the float64 sum of this rank's local parameter shards after the step
    lr: float     # the learning rate after the step (the scheduler's next value)
    pre: PreStep | None = None  # what the step started from; None: no optimizer.step() since the last step


@dataclass
class CallRecord(Observation):
    """One call of a DCP or state-dict function (a collective), or of the learner's own ``torch.save``,
    written before the call ran (a call that hangs or raises is on disk already)."""

    call: str        # the name logged: "dcp.save", "get_state_dict", "torch.save", ...
    after_step: int  # the last step reported before the call (0: before the first)
    attempt: int     # the torchrun attempt
    tag: str         # the phase's tag
    held: list[str] | str | None = None  # a save's or load's state: its keys (``outer.inner``), or its type
    file: str | None = None  # the learner's file the call came from (a save or load; None: not on the stack)
    line: int | None = None  # and its line there
    checkpoint: str | None = None  # a DCP save's or load's directory, or a torch.save's file's, by name
    #                                 ("step_00000003", ".tmp-step_00000003"; None: not given by path)


@dataclass
class ErrorRecord(Observation):
    """What a rank raised in a phase (a restarted attempt's error is the telling one)."""

    attempt: int  # the torchrun attempt
    rank: int     # the rank that raised
    error: str    # the last line of the error that names one ("...Error: ..."), at most 300 characters
    at: str       # the learner's line it came from ("" when none of its frames is the learner's)


@dataclass
class CommitKillRecord(Observation):
    """Where rank 1 was killed inside a checkpoint's save (``commit_kill``), and what looked complete then."""

    at: str                 # "torch.save" or "dist.barrier" (the learner's call it was about to make), or "step"
    line: str | None        # that call's line in the learner's file ("ex05_checkpoint.py:95")
    complete: int | None    # the step latest_complete() found at the kill (None: no checkpoint)
    after: int              # the step after which the kill was armed (the save killed is the next one)


@dataclass
class FinalState(Observation):
    """A finished phase's trained state, which rank 0 saves (the full, unsharded state)."""

    model: dict[str, torch.Tensor]  # the model's full state dict, by parameter name
    optim: dict[str, dict[str, torch.Tensor]]  # the optimizer's state, by parameter name, then by state name
    step: int             # the step ``train`` returned
    lr: float             # the optimizer's learning rate at the end
    scheduler_epoch: int  # the scheduler's last_epoch


@dataclass
class RankObservation(Observation):
    """What ``rank_main`` returns for one file: which rank ran it (what it saw is in the files above)."""

    rank: int


def _read(f: Path, cls: type) -> list:
    """The records of one of a rank's files (``[]`` when it wrote none), as ``cls``."""
    return [cls.from_wire(json.loads(ln)) for ln in f.read_text().splitlines() if ln.strip()] if f.is_file() else []


@dataclass
class Run:
    """One file's phases: where the ranks recorded each, and what the launches raised.

    Filled in as the launches go; what a later launch could change (A's directory) is read at once.
    """

    out: Path
    reshard_world: int
    path: Path | None = None       # the learner's file (for a failure's line in it)
    ref: FinalState | None = None  # A's final state: the uninterrupted run
    ref_rec: list[list[StepRecord]] = field(default_factory=list)  # A's records, per rank
    checkpoints: list[str] = field(default_factory=list)  # what A's directory held after the run
    committed: list[int] = field(default_factory=list)    # the steps of its complete checkpoints
    reached: int = 0               # the last step rank 1 recorded in C before the job stopped
    fresh_error: LaunchError | None = None   # what ended the launch the fresh job resumed in (None: nothing)
    resume_error: LaunchError | None = None  # what ended the restart scenario's launch
    reshard_error: LaunchError | None = None

    def load_reference(self) -> bool:
        """Read the uninterrupted run (A) and how far C got before its job stopped; False if A did not finish."""
        if (ref := self.final("A")) is None:
            return False
        self.ref, self.ref_rec = ref, self.records("A")
        saved = (self.out / "A").is_dir()  # a run that never saved made no directory
        self.checkpoints = sorted(p.name for p in (self.out / "A").iterdir()) if saved else []
        self.committed = [s for s, _ in complete_checkpoints(self.out / "A")] if saved else []
        self.reached = max((x.step for x in self.records("C", tag="first")[1]), default=0)
        return True

    def records(self, name: str, world: int = WORLD, **match) -> list[list[StepRecord]]:
        """Per rank, the phase's step records whose fields equal ``match``."""
        return self._per_rank(f"{name}-rank{{r}}.jsonl", StepRecord, world, match)

    def calls(self, name: str, world: int = WORLD, **match) -> list[list[CallRecord]]:
        """Per rank, the phase's DCP and state-dict calls whose fields equal ``match``."""
        return self._per_rank(f"{name}-calls-rank{{r}}.jsonl", CallRecord, world, match)

    def _per_rank(self, pattern: str, cls: type, world: int, match: dict) -> list[list]:
        return [[x for x in _read(self.out / pattern.format(r=r), cls)
                 if all(getattr(x, k) == v for k, v in match.items())] for r in range(world)]

    def ref_at(self, rank: int, step: int) -> StepRecord | None:
        return next((x for x in self.ref_rec[rank] if x.step == step), None)

    def final(self, name: str) -> FinalState | None:
        f = self.out / f"{name}-final.pt"
        return FinalState.from_wire(torch.load(f, weights_only=True)) if f.is_file() else None

    def commit_kill(self, name: str) -> CommitKillRecord | None:
        f = self.out / f"{name}-commit-kill.json"
        return CommitKillRecord.from_wire(json.loads(f.read_text())) if f.is_file() else None

    def attempt_steps(self, attempt: int) -> list[int]:
        """The steps rank 0 trained in B during torchrun attempt ``attempt``."""
        return [x.step for x in self.records("B", attempt=attempt)[0]]

    def phase_error(self, name: str, first_attempt: int = 0) -> str:
        """What a phase raised (not a peer's "connection closed" after a kill), as ``attempt A, rank R raised
        ...``, at the learner's line."""
        errors = [e for e in _read(self.out / f"{name}-errors.jsonl", ErrorRecord)
                  if e.attempt >= first_attempt and "Connection" not in e.error]
        if not errors:
            return ""
        at = f", at {errors[0].at}" if errors[0].at else ""
        return f"attempt {errors[0].attempt}, rank {errors[0].rank} raised {errors[0].error}{at}"
