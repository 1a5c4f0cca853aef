"""Exercise 11's observations: the typed contract between the ranks (``probes``) and the grader.

Each rank returns one :class:`MoEStep` per file: what each learner function returned
(:class:`Returned`), which results the grader substituted, what raised (a :class:`StageError` per stage),
the output, the gradients, and every all-to-all (a :class:`Collective`) with its stage. The grader reads
them in a :class:`Run`, next to the single-process MoE's figures (``reference``)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ...rank.observation import Observation
from ...rank.runtime_copies import Answers
from .reference import Reference, Slots, T, reference

STAGES = ("sort", "exchange", "dispatch", "combine", "backward")  # the learner's functions, then the backward


@dataclass
class StageError(Observation):
    """What one stage raised (not NotImplementedError)."""

    error: str                # as ``rank.raised`` puts it: "RuntimeError: ..."
    where: str                # the learner's line that raised ("" if none of theirs)


@dataclass
class Collective(Observation):
    """One collective the rank issued, as the dispatcher ran it."""

    kind: str                 # the torch.distributed call's name ("all_to_all", "all_reduce", ...)
    shape: list[int]          # its first tensor's shape
    stage: str | None         # the stage running (STAGES); None: between them
    phase: str                # "forward" or "backward"
    aliased: bool = False     # its output and its input are one storage (all_to_all_single(t, t))


@dataclass
class Returned(Observation):
    """What the learner's functions returned, as the checks read it (None: that function did not run)."""

    perm: torch.Tensor | str | None = None  # sort_by_expert's perm (a copy), or the repr of what came instead
    send: list[int] | str | None = None     # its input_split_sizes (Python ints), or the repr of what came
    recv: list[int] | str | None = None     # exchange_split_sizes' output_split_sizes, or the repr of what came
    dispatched: torch.Tensor | None = None  # dispatch's rows (a copy), where it returned the shape they have
    # set when dispatch returned no tensor of the shape the split sizes give: its shape (or its repr)
    dispatch_shape: list[int] | str | None = None
    combine_shape: list[int] | str | None = None   # the same for combine


@dataclass
class EdgeCase(Observation):
    """``sort_by_expert`` on one of the inputs its contract names (:data:`..probes.EDGE_CASES`), in the rank."""

    name: str                 # what is special about it ("the last experts get no slot")
    expert: list[int]         # the input
    keep: list[bool]
    send: list[int] | str | None = None  # the input_split_sizes returned (the repr of anything else)
    perm_ok: bool = False     # whether perm lists exactly the kept slots, in expert order
    error: str = ""           # what it raised ("": nothing)


@dataclass
class MoEStep(Observation):
    """One rank's MoE step through one learner file, one function at a time."""

    rank: int
    world: int
    not_implemented: str | None = None  # where the learner's code first raised NotImplementedError
    errors: dict[str, StageError] = field(default_factory=dict)   # by stage (STAGES)
    returned: Returned = field(default_factory=Returned)
    substituted: list[str] = field(default_factory=list)  # the stages whose wrong result the grader replaced
    unfinished: list[str] = field(default_factory=list)  # of those, the ones that had ended an earlier launch
    returned_none: list[str] = field(default_factory=list)  # the stages whose function returned None
    received_grad_fn: bool | None = None  # whether dispatch's rows have a grad_fn (None: no such rows)
    combined_grad_fn: bool | None = None  # whether combine's rows have a grad_fn (None: no such rows)
    dispatch_want: torch.Tensor | None = None  # what dispatch must return: the grader's all-to-all of the same rows
    y_slots: torch.Tensor | None = None   # combine's rows, one per slot
    y_slots_want: torch.Tensor | None = None  # what combine must return, given the rows it was given
    y: torch.Tensor | None = None         # the layer's output on this rank's T tokens
    x_grad: torch.Tensor | None = None    # the input's gradient
    router_grad: torch.Tensor | None = None  # the router's gate weight's gradient (this rank's tokens' share)
    expert_grads: dict[str, torch.Tensor | None] | None = None  # by parameter name: the rank's expert's
    comm: list[Collective] = field(default_factory=list)  # every collective, in order
    edges: list[EdgeCase] = field(default_factory=list)  # sort_by_expert on the contract's edge cases
    answers: Answers = field(default_factory=Answers)  # whether a graded function is the runtime's copy (``ANSWERS``)
    # dispatch's and combine's result on float64 rows, run again after the step: its dtype ("float64"), or what it
    # raised; absent where the function was wrong on some rank (not run again)
    wide: dict[str, str] = field(default_factory=dict)


@dataclass
class Run:
    """One file's step at one world size: every rank's observation (rank order)."""

    ranks: list[MoEStep]

    @classmethod
    def from_wire(cls, ranks: list[dict]) -> Run:
        """The run of one file from what its ranks sent (``launch_files``: one wire record per rank)."""
        return cls([MoEStep.from_wire(r) for r in ranks])

    @classmethod
    def from_parts(cls, file, world: int) -> Run:
        """One file's run from its parts (``grader.parts.Parted``): the step's record (split, forward, backward:
        each holds what the ranks observed until then, so the last one kept is the whole step; where none was,
        every part ended or was not run, and nothing of it is judged), with the float64 calls of the "dtype"
        part, which a later launch may have made on its own."""
        kept = {p: file.part(p) for p in ("sort", "exchange", "dispatch", "combine", "backward")}
        kept = {p: v for p, v in kept.items() if v and all(v)}
        step = next((kept[p] for p in ("backward", "combine", "dispatch", "exchange", "sort") if p in kept), None)
        run = cls.from_wire(step) if step else cls([MoEStep(rank=r, world=world) for r in range(world)])
        for part in ("sort", "exchange"):  # where a later launch went on from the grader's own values, say why
            if part in kept and kept[part] is not step:
                for obs, wire in zip(run.ranks, kept[part]):
                    if part in MoEStep.from_wire(wire).substituted and part not in obs.substituted:
                        obs.substituted.append(part)
        if (wide := file.part("dtype")) and all(wide):
            for obs, kept in zip(run.ranks, wide):
                obs.wide = MoEStep.from_wire(kept).wide
        return run

    @property
    def world(self) -> int:
        return len(self.ranks)

    @property
    def ref(self) -> Reference:
        return reference(self.world)

    def rows(self, rank: int) -> slice:
        return slice(rank * T, (rank + 1) * T)

    def slots(self, rank: int) -> Slots:
        """Rank ``rank``'s slots in the reference: expert, keep, token, ungated expert output, counts."""
        return self.ref.ranks[rank]

    def calls(self, rank: int, stage: str | None = None, phase: str | None = None) -> list[Collective]:
        return [c for c in self.ranks[rank].comm
                if stage in (None, c.stage) and phase in (None, c.phase)]

    def error(self, stage: str) -> tuple[int, StageError] | None:
        """The first rank whose ``stage`` raised, and its error."""
        return next(((o.rank, o.errors[stage]) for o in self.ranks if stage in o.errors), None)
