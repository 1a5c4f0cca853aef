"""Exercise 4's typed rank -> grader contract: each rank's observation of one file at one world size
(:class:`FsdpRank`: part 2's shards, bytes held and peak memory in the measured step, the trained weights,
the export; part 1's :class:`~.zero1.observations.Zero1`), and :class:`Run`, the grading process's view of
every rank's, with the byte counts that follow and part 1's reading against the flat reference.

Imported by the probes (rank side) and the grading process alike: nothing here imports either.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field

import torch

from distlab.lab.fsdp_memory import unsharded_bytes

from ...rank.observation import Observation
from .reference import zero1_reference
from .zero1.observations import Zero1

PARTS = ("params", "grads", "optimizer")  # what each rank holds: the bytes of each, against 1/W of the whole


@dataclass
class PeakBound(Observation):
    """What per-block sharding promises for the peak of the measured step (``fsdp_memory.peak_bound``), in bytes."""

    state: int        # the rank's sharded params, grads and Adam state before the step
    unit: int         # the largest fully_shard unit's unsharded parameters
    activations: int  # a bound on what autograd keeps for backward on one micro-batch
    bound: int        # state + UNITS_IN_FLIGHT x unit + activations


@dataclass
class MeasuredStep(Observation):
    """Step ``MEASURE_STEP`` of ``train_fsdp``, observed from inside the wrapped ``train_step``."""

    before: dict[str, int]  # storage bytes held before the step, by part (PARTS)
    after: dict[str, int]   # and after it
    peak: int               # the peak of live tensor storage during the step (CPU), max_memory_allocated (GPU)
    bound: PeakBound        # what the peak is judged against
    blocks_unsharded_after_forward: list[int]  # the FSDP blocks whose parameters were not DTensors after forward
    leftover_grad_norm: float | None  # the gradient norm in .grad when backward began (None: no backward began)
    optimizer_steps: int    # the optimizer.step() calls in the step
    placements: list[str]   # the parameters' distinct placements, "(Shard(dim=0),)" or "plain tensor"
    dtensors: int           # how many parameters are DTensors
    n_params: int           # the model's parameters
    plain: list[str]        # the names of those that are not DTensors
    opt_foreign: int        # parameters the optimizer does not hold (built before sharding)
    blocks_wrapped: int     # the blocks that are FSDP units
    root_wrapped: bool      # whether the root is one


@dataclass
class TrainingError(Observation):
    """An error ``train_fsdp`` raised after its last training step (the export)."""

    error: str   # "Type: message"
    where: str   # "line N: code", the learner's line (else the last frame's)
    fsdp1: bool  # whether it came from FSDP1's module (fully_sharded_data_parallel.py)


@dataclass
class StateDictCall(Observation):
    """One call of a state-dict collective (``get_model_state_dict``...), as the rank's spy recorded it."""

    fn: str                       # which one
    options: dict[str, bool]      # its StateDictOptions' flags, by name (empty: no options given)
    tensors: int | None = None    # tensors in the dict it returned (None: it raised)
    bytes: int | None = None      # their bytes
    for_rank: int | None = None   # in ``partnered``: the rank that waited in this call, which this rank never made


@dataclass
class FsdpRank(Observation):
    """One rank's observation of one file: part 2's training (its fields left at their defaults where
    ``train_fsdp`` was not written yet, ``not_implemented``, or ended its launch), and part 1's."""

    rank: int
    world: int
    steps: int    # train_step calls train_fsdp made
    zero1: Zero1 = field(default_factory=Zero1)  # part 1, ZeRO-1 by hand (joined by the grading process)
    not_implemented: str | None = None  # where train_fsdp raised NotImplementedError before training (None: it ran)
    shapes: dict[str, list[int]] = field(default_factory=dict)  # every parameter's unsharded shape, by name
    final: dict[str, torch.Tensor] = field(default_factory=dict)  # rank 0: the trained full state dict ({} else)
    saves: list[str] = field(default_factory=list)    # the paths torch.save was called with, on this rank
    printed: list[str] = field(default_factory=list)  # what train_fsdp printed
    expected: dict[str, int] = field(default_factory=dict)  # bytes the rank should hold, by part (and "padding")
    device: str = ""  # "cpu" or "cuda"
    export: str = ""  # the export_path train_fsdp was given
    after_training_error: TrainingError | None = None  # what the export raised (None: nothing)
    export_returned: str | None = None  # what export_full_state_dict returned here, said ("None"; None: not called)
    train_step_error: TrainingError | None = None  # what train_step first raised: the grader's step went on
    state_dict_calls: list[StateDictCall] = field(default_factory=list)  # this rank's own, in order
    partnered: list[StateDictCall] = field(default_factory=list)  # those its spy made for a rank waiting in one
    completed: int = 0  # train_step calls that returned
    returned: str = ""  # what the learner's train_step returned where it was no detached tensor, said ("" if it was)
    last_loss: float | None = None  # the loss the last train_step returned, as a number (None: no number)
    step: MeasuredStep | None = None  # step MEASURE_STEP (None: train_fsdp never called train_step that often)
    shards: dict[str, torch.Tensor] = field(default_factory=dict)  # part "fsdp": this rank's rows of each weight
    sharded: list[str] = field(default_factory=list)  # the names in ``shards`` that are Shard(0) rows (else whole)


def _joined(ranks: list[FsdpRank]) -> dict[str, torch.Tensor]:
    """The trained weights, whole: every rank's Shard(0) rows of each in rank order, as FSDP2 cuts them."""
    r0 = ranks[0]
    return {name: torch.cat([r.shards[name] for r in ranks]) if name in r0.sharded else value
            for name, value in r0.shards.items()}


@dataclass
class Run:
    """One file's run at one world size: every rank's observation (rank order), and how each part that ended its
    launch (a native abort, a hang, an error on some ranks) ended, in the learner's terms: part 2's
    (``part2_ended``, "fsdp"), ``shard_range``'s (``ranges_ended``); part 1's training is ``Zero1.aborted``."""

    ranks: list[FsdpRank]
    part2_ended: str | None = None
    ranges_ended: str | None = None
    export_ended: str | None = None  # how part 2's export ended its launch (its training is graded all the same)

    @classmethod
    def from_parts(cls, kept_ranks: list[dict], ended: dict[str, str]) -> "Run":
        """The run of what every rank kept of one file's parts (``probes.FILE_PARTS``: ``grader.parts.Parted``'s
        ``ranks``, ``ended``), joined: part 2 as its export kept it, or, where the export ended the launch, as
        its training did, with rank 0's trained weights joined from every rank's rows; part 1's answers and
        training in one :class:`Zero1` (``aborted``: how a launch ended in its training)."""
        world, ranks = len(kept_ranks), []
        for rank, kept in enumerate(kept_ranks):
            part2 = kept.get("export") or kept.get("fsdp")
            obs = FsdpRank.from_wire(part2) if part2 else FsdpRank(rank=rank, world=world, steps=0)
            ranges = Zero1.from_wire(kept["ranges"]) if kept.get("ranges") else Zero1()
            trained = Zero1.from_wire(kept["zero1"]) if kept.get("zero1") else Zero1(
                aborted=ended.get("zero1", ""))
            obs.zero1 = dataclasses.replace(trained, ranges=ranges.ranges, ranges_error=ranges.ranges_error,
                                            ranges_unwritten=ranges.ranges_unwritten)
            ranks.append(obs)
        if "export" in ended and all(kept.get("fsdp") for kept in kept_ranks):
            ranks[0].final = _joined(ranks)
        return cls(ranks, ended.get("fsdp"), ended.get("ranges"), ended.get("export"))

    @property
    def world(self) -> int:
        return self.ranks[0].world

    @property
    def stepped(self) -> bool:
        """Whether part 2's measured step ran at all, in a train_fsdp that is written (else there is nothing of
        it to judge)."""
        return self.ranks[0].step is not None and self.ranks[0].not_implemented is None

    @property
    def measured(self) -> list[MeasuredStep]:
        """Every rank's measured step (rank order), where the run ``stepped``."""
        return [r.step for r in self.ranks]

    # Part 1, ZeRO-1 -------------------------------------------------------------------------------------

    @property
    def z1(self) -> list[Zero1]:
        """Every rank's part 1 observation (rank order)."""
        return [r.zero1 for r in self.ranks]

    @functools.cached_property
    def z1_ref(self) -> dict:
        return zero1_reference(self.world)

    def z1_slice(self, s: int) -> tuple[int, int]:
        """Rank ``s``'s slice ``[s * c, (s + 1) * c)`` of the padded flat parameters."""
        c = self.z1_ref["c"]
        return s * c, (s + 1) * c

    def z1_shard_of(self, rank: int) -> int | None:
        """Whose slice of the initial flat parameters rank ``rank``'s shard copies (``None``: no one's)."""
        holdings = self.z1[rank].holdings
        shard = holdings.shard if holdings else None
        initial = self.z1_ref["initial"]
        if shard is None or shard.numel() != self.z1_ref["c"]:
            return None
        return next((s for s in range(self.world) if torch.equal(shard.float(), initial[slice(*self.z1_slice(s))])),
                    None)

    def z1_grad_ratio(self, rank: int) -> float | None:
        """Rank ``rank``'s gradient at its first step / the mean gradient of its slice (least squares), when
        one is a multiple of the other (``None`` otherwise)."""
        got = self.z1[rank].first_grad
        ref = self.z1_ref["first_grad"][slice(*self.z1_slice(rank))]
        if got is None or got.shape != ref.shape or not float(ref @ ref):
            return None
        ratio = float(got.double() @ ref.double() / (ref.double() @ ref.double()))
        return ratio if torch.allclose(got, ratio * ref, rtol=1e-3, atol=1e-6) else None

    def z1_final(self, rank: int) -> torch.Tensor:
        """Rank ``rank``'s flat parameters after the last step, zero-padded as the reference's."""
        final = self.z1[rank].final
        return torch.nn.functional.pad(final, (0, self.world * self.z1_ref["c"] - final.numel()))

    def z1_stale(self, rank: int) -> list[int]:
        """The ranks' slices of rank ``rank``'s final parameters still equal to their initial values."""
        final, initial, numel = self.z1_final(rank), self.z1_ref["initial"], self.z1_ref["numel"]
        return [s for s in range(self.world)
                if torch.equal(final[slice(*self.z1_slice(s))][:max(0, numel - s * self.z1_ref["c"])],
                               initial[slice(*self.z1_slice(s))][:max(0, numel - s * self.z1_ref["c"])])]

    def z1_counts(self, rank: int = 0) -> list[dict[str, int]]:
        """Per step, rank ``rank``'s collectives by kind."""
        out = []
        for ops in self.z1[rank].steps:
            counts: dict[str, int] = {}
            for op in ops:
                counts[op.kind] = counts.get(op.kind, 0) + 1
            out.append(counts)
        return out

    def block_bytes(self, blocks: list[int]) -> int:
        """The unsharded float32 bytes of the parameters of ``blocks``."""
        return sum(4 * math.prod(shape) for name, shape in self.ranks[0].shapes.items()
                   if name.split(".")[:2] in [["blocks", str(i)] for i in blocks])

    def bytes_summary(self) -> str:
        r0 = self.ranks[0]
        total = sum(r0.expected[p] for p in PARTS)
        unsharded = unsharded_bytes(r0.shapes)
        pad = max(r.expected["padding"] for r in self.ranks)
        return (f"rank 0 holds {sum(r0.step.after[p] for p in PARTS)} B of params+grads+Adam state (expected "
                f"{total} B; padding up to {pad} B per rank in params and again in grads) vs {unsharded} B "
                f"unsharded (1/W would be {unsharded // self.world} B)")
