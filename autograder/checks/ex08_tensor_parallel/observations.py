"""Exercise 8's observations: the typed contract between the ranks (``probes``) and the grader.

Each rank returns one :class:`StepObservation` per file: what the learner's two layers hold (a
:class:`Holdings` each, with a :class:`Param` for ``weight`` and ``bias`` and a :class:`Held` per storage),
the output, the gradients, and every collective (a :class:`Collective`) with its phase and layer. The
grader reads them in a :class:`Run`, one file's step at one world size, next to the unsplit block's figures.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ...rank.observation import Observation
from .reference import Unsplit, shard, unsplit_step

STAGES = ("build", "forward", "backward")  # a step's stages, in order (StepObservation.stage)
FIT_TOL = 1e-4  # what float32 rounding leaves of a tensor once its bias multiple is removed (values ~1)


@dataclass
class Param(Observation):
    """A layer's ``weight`` or ``bias``, as the learner's layer holds it."""

    parameter: bool       # whether it is one of the layer's parameters (an nn.Parameter it registered)
    shape: list[int]
    value: torch.Tensor   # a copy of its values, on the CPU


@dataclass
class Held(Observation):
    """One distinct storage a layer keeps (a parameter, a buffer, a tensor attribute, a submodule's)."""

    name: str             # the first name it is reachable by, from the layer ("weight", "linear.weight")
    shape: list[int]
    bytes: int            # the tensor's own bytes (numel x element size)
    storage_bytes: int    # the bytes of the storage behind it (more than ``bytes``: a view of a larger tensor)
    unsplit: bool         # whether that storage is one of the unsplit layer's


@dataclass
class Holdings(Observation):
    """What one of the learner's layers keeps."""

    params: dict[str, Param | None]   # by attribute name ("weight", "bias"); None: no tensor of that name
    tensors: list[Held]               # every distinct storage it holds on to


@dataclass
class Collective(Observation):
    """One collective the rank issued, as the dispatcher ran it."""

    kind: str                         # the torch.distributed call's name ("all_reduce", "broadcast", ...)
    shape: list[int]                  # its first tensor's shape
    phase: str                        # "forward" or "backward"
    layer: str | None                 # the learner's layer whose forward was running ("column", "row"), if any
    input: torch.Tensor | None        # an all-reduce's input, copied before it ran (None for other kinds)


@dataclass
class StepObservation(Observation):
    """One rank's step through one learner file: build the two layers, one forward, one backward."""

    rank: int
    world: int
    stage: str | None = "build"       # the stage running when it raised (STAGES); None: the step got through
    not_implemented: str | None = None  # where the learner's code raised NotImplementedError
    error: str | None = None          # what the step raised (not NotImplementedError), as ``rank.raised`` puts it
    where: str | None = None          # the learner's line that raised ("" if none of theirs)
    layers: dict[str, Holdings] | None = None  # by layer ("column", "row"); None: building them raised
    out: torch.Tensor | None = None   # the block's output on this rank
    x_grad: torch.Tensor | None = None  # the input's gradient
    grads: dict[str, torch.Tensor | None] | None = None  # by part ("column.weight", ...): the shards' gradients
    comm: list[Collective] = field(default_factory=list)  # every collective, in order
    # by layer: the shape of what its forward returned (None: not a tensor)
    shapes: dict[str, list[int] | None] = field(default_factory=dict)
    # the layers the grader's stood in for ("column", "row"): the step raised on every rank and they did not hold
    # their shards; out, x_grad, grads and comm are then the second step's, ``replaced`` what the first raised
    substituted: list[str] = field(default_factory=list)
    replaced: str = ""
    raised_in: str = ""  # the learner's layer whose forward was running when the (first) step raised ("": none)
    off_shard: list[str] = field(default_factory=list)  # where the first step raised: its layers not holding shards
    # the layers built again on this rank for every other rank r (keyed str(r)): each part's value (None: missing)
    built_for: dict[str, dict[str, torch.Tensor | None]] = field(default_factory=dict)
    wide_dtypes: dict[str, str] = field(default_factory=dict)  # each part's dtype, built from a float64 block
    rebuild_error: str = ""  # what building them again raised ("": nothing)

    def param(self, part: str) -> Param | None:
        """The learner's tensor for ``part`` (``"row.bias"``: RowParallelLinear's ``bias``); ``None`` when the
        layer has no tensor of that name, or the layers were not built."""
        layer, name = part.split(".")
        return self.layers[layer].params[name] if self.layers else None


@dataclass
class Run:
    """One file's step at one world size: every rank's observation (rank order)."""

    ranks: list[StepObservation]

    @classmethod
    def from_wire(cls, ranks: list[dict]) -> Run:
        """The run of one file from what its ranks sent (``launch_files``: one wire record per rank)."""
        return cls([StepObservation.from_wire(r) for r in ranks])

    @property
    def world(self) -> int:
        return len(self.ranks)

    @property
    def ref(self) -> Unsplit:
        return unsplit_step()

    def expected(self, part: str, rank: int, of: str = "weights") -> torch.Tensor:
        """Rank ``rank``'s shard of the unsplit block's ``part`` (``of="grads"``: of its gradient)."""
        return shard(getattr(self.ref, of)[part], part, rank, self.world)

    def partial(self, rank: int) -> torch.Tensor:
        """What rank ``rank``'s row layer should hand to the all-reduce, before any bias: the hidden features its
        column shard holds times its row shard's columns. Its own shards where its column shard is rows of the
        unsplit block's (in any order: strided, say), so that the bias is judged apart from the sharding; else
        the contiguous shards of the contract."""
        obs, full = self.ranks[rank], self.ref.weights["column.weight"]
        col, row = (obs.param(part) if obs.layers else None for part in ("column.weight", "row.weight"))
        if col is not None and row is not None and col.value.dim() == 2 and col.value.shape[1] == full.shape[1]:
            found = [(full == r).all(dim=1).nonzero().flatten().tolist() for r in col.value]
            if all(len(f) == 1 for f in found) and list(row.value.shape) == [full.shape[1], len(found)]:
                return self.ref.hidden.double()[..., [f[0] for f in found]] @ row.value.double().T
        cols = self.ref.hidden.double().chunk(self.world, dim=-1)[rank]
        return cols @ self.expected("row.weight", rank).double().T

    def calls(self, rank: int, phase: str, kind: str | None = None) -> list[Collective]:
        return [c for c in self.ranks[rank].comm if c.phase == phase and kind in (None, c.kind)]

    def failure(self, stage: str) -> StepObservation | None:
        """The first rank whose step raised at ``stage`` or before it."""
        return next((r for r in self.ranks if r.error and STAGES.index(r.stage) <= STAGES.index(stage)), None)

    def bias_fit(self) -> BiasFit | None:
        """How many biases each rank put into the row layer's all-reduce (``before``, one per rank) and how many
        the output holds (``total``); ``fits`` is False when a tensor differs by more than bias multiples.
        ``None`` when RowParallelLinear made no all-reduce in its forward."""
        bias, ref = self.ref.weights["row.bias"], self.ref.out.double()
        before, totals = [], []
        for obs in self.ranks:
            reduces = [c for c in self.calls(obs.rank, "forward", "all_reduce") if c.layer == "row"]
            if not reduces:
                return None
            got, want = reduces[-1].input, self.partial(obs.rank)
            if got.shape != want.shape:
                return BiasFit(fits=False, unfit=f"rank {obs.rank}'s partial sum (of shape {list(got.shape)})")
            if obs.out is None or obs.out.shape != ref.shape:
                return BiasFit(fits=False, unfit=f"rank {obs.rank}'s output")
            k, left = _multiple(got.double() - want, bias)
            total, left_out = _multiple(obs.out.double() - (ref - bias.double()), bias)
            tol = FIT_TOL * (1 + float(ref.abs().max()))
            if max(left, left_out) > tol:
                return BiasFit(fits=False, unfit=f"rank {obs.rank}'s " + ("partial sum" if left > tol else "output"))
            before.append(k)
            totals.append(total)
        return BiasFit(fits=True, before=before, total=sum(totals) / len(totals))


@dataclass
class BiasFit:
    """How many row biases the ranks' tensors hold (:meth:`Run.bias_fit`; the grader's figure, not a rank's)."""

    fits: bool                 # False when a tensor differs by more than bias multiples (then nothing else)
    unfit: str = ""            # which ("rank 1's partial sum", "rank 0's output"), where one does
    before: list[float] = field(default_factory=list)  # per rank: biases in what it put into the all-reduce
    total: float = 0.0         # biases in the output (the ranks' mean)


def _multiple(d: torch.Tensor, bias: torch.Tensor) -> tuple[float, float]:
    """``d`` as ``k`` x ``bias`` on every row (any leading dimensions): ``k`` (least squares) and what is left
    (max abs)."""
    b = bias.double().expand_as(d)
    k = float((d.double() * b).sum() / (b * b).sum())
    return k, float((d.double() - k * b).abs().max())
