"""Exercise 8's likely mistakes, tested against what the ranks observed (see autograder/grader/diagnosis.py).

Each takes the :class:`~.observations.Run` of one file at one world size and
the part being judged (``"shards"``, ``"forward"``, ``"bias"``, ``"communication"``, ``"x_grad"``,
``"grads"``, or the stage that raised: ``"build"``, ``"backward"``). The check's
criteria ask for them, most specific first. The helpers at the top (where a shard came from, what the
collectives were) are the measurements they share with the criteria; how many biases a tensor holds is
the run's own (:meth:`~.observations.Run.bias_fit`).
"""
from __future__ import annotations

import re

import torch

from ...grader.diagnosis import KnownError, mistake
from .observations import Collective, Run
from .reference import B, D, LAYER_CLASS, LEAD, PARTS, SHARD_DIM, X_SHAPE


KNOWN_ERRORS = [
    KnownError("matmul shapes that do not match: a shard or the input cut wrong",
               r"mat1 and mat2 shapes cannot be multiplied",
               "a layer's matmul got an input and a weight shard that do not fit: ColumnParallelLinear keeps "
               "out_features / world_size rows of the weight and takes the whole input; RowParallelLinear keeps "
               "in_features / world_size columns and takes the column layer's output"),
    KnownError("a bias of the wrong size",
               r"The size of tensor a \(\d+\) must match the size of tensor b \(\d+\) at non-singleton dimension",
               "a bias does not fit the layer's output: ColumnParallelLinear keeps the bias elements of its own "
               "output features, RowParallelLinear the whole bias, added after the all-reduce"),
    TWO_D := KnownError("a forward that takes only a 2-D input",
               r"(self|mat1|mat2) must be a matrix|expects a tensor with <= 2 dimensions",
               f"an op in the layer's forward takes matrices (2-D) only, but the contract's x has shape (..., in): "
               f"the grader's is {X_SHAPE}, 4 sequences of 3 tokens as in a transformer. Use ops that act on the last "
               "dimension whatever the leading ones (matmul broadcasts them; torch.mm and torch.addmm take "
               "matrices only, .t() at most 2 dimensions)"),
]


def _shape(t) -> str:
    return "x".join(map(str, t.shape if isinstance(t, torch.Tensor) else t))


def locate(value: torch.Tensor, full: torch.Tensor, world: int) -> tuple[int | None, int] | None:
    """Which piece of ``full`` ``value`` is: ``(dim, i)`` for ``full.chunk(world, dim)[i]``, ``(None, 0)``
    for all of it, ``None`` for none of them."""
    if value.shape == full.shape and torch.equal(value, full):
        return None, 0
    for dim in range(full.dim()):
        for i, piece in enumerate(full.chunk(world, dim)):
            if piece.shape == value.shape and torch.equal(piece, value):
                return dim, i
    return None


def describe(full: torch.Tensor, dim: int | None, index: int, world: int) -> str:
    """``"rows 48:96 of the unsplit 96x16 weight"``."""
    what = "bias" if full.dim() == 1 else "weight"
    if dim is None:
        return f"the whole unsplit {_shape(full)} {what}"
    n = full.shape[dim] // world
    cut = "elements" if full.dim() == 1 else ("rows", "columns")[dim]
    return f"{cut} {index * n}:{(index + 1) * n} of the unsplit {_shape(full)} {what}"


def summary(calls: list[Collective]) -> str:
    """``"2 collectives: all_reduce in ColumnParallelLinear (12x16), all_gather (12x48)"``."""
    if not calls:
        return "no collective"
    each = [f"{c.kind}" + (f" in {LAYER_CLASS[c.layer]}" if c.layer else "") + f" ({_shape(c.shape)})"
            for c in calls]
    return f"{len(calls)} collective{'s' if len(calls) > 1 else ''}: {', '.join(each)}"


def _alike(tensors: list[torch.Tensor | None]) -> bool:
    """Every rank's tensor is there and equal to rank 0's (a collective's input that was the same everywhere)."""
    return all(t is not None and torch.equal(t, tensors[0]) for t in tensors)


def multiple_of(got: torch.Tensor | None, ref: torch.Tensor) -> float | None:
    """``got`` over ``ref`` when ``got`` is a multiple of it (least squares), else ``None``."""
    if got is None or got.shape != ref.shape:
        return None
    k = float((got.double() * ref.double()).sum() / (ref.double() ** 2).sum())
    # Looser than RTOL: ``got`` went through W partial sums in float32 and a division; a ratio that does
    # not explain it leaves differences of 1e-2 and more.
    return k if torch.allclose(got.double(), k * ref.double(), rtol=1e-4, atol=1e-5) else None


@mistake("the bias added on every rank, before the all-reduce")
def bias_on_every_rank(run: Run, part: str) -> str | None:
    fit = run.bias_fit()
    if not fit or not fit.fits or any(abs(k - 1) > 1e-2 for k in fit.before):
        return None
    off = (run.ranks[0].out - run.ref.out).abs().max().item()
    return (f"each of the {run.world} ranks added the row bias before the all-reduce (its partial sum holds "
            f"{sum(fit.before) / run.world:.2f}x the bias), so the all-reduce summed it {run.world} times: the "
            f"output is the unsplit block's plus {fit.total - 1:.0f}x the bias (max abs difference {off:.3g}). "
            "Add self.bias once, after ReduceFromParallelRegion")


@mistake("the row bias inside the partial sums")
def bias_in_partial_sums(run: Run, part: str) -> str | None:
    """The output holds the bias once, but it went through the all-reduce in the ranks' partial sums."""
    fit = run.bias_fit()
    if not fit or not fit.fits or abs(fit.total - 1) > 1e-2 or abs(sum(fit.before) - 1) > 1e-2:
        return None
    shares = [k if abs(k) > 5e-3 else 0.0 for k in fit.before]
    held = ", ".join(f"rank {r}'s {k:.2f}x" for r, k in enumerate(shares))
    short = ", ".join(f"rank {r}'s {k:.2f}x" for r, k in enumerate(shares) if abs(k - 1) > 1e-2)
    return (f"the output holds the row bias once, but inside the partial sums the all-reduce added up ({held}); a "
            f"rank's bias then gets its share of the bias's gradient ({short} of the unsplit layer's), where every "
            "rank's must get all of it: add self.bias once, after ReduceFromParallelRegion, on every rank")


@mistake("a shard cut along the wrong dimension")
def wrong_dimension(run: Run, part: str) -> str | None:
    for obs in run.ranks:
        for part_ in ("column.weight", "row.weight"):
            layer = part_.split(".")[0]
            if part != "shards" and layer in obs.substituted:  # the grader's layer made the step: not this cause
                continue
            p, full = obs.param(part_), run.ref.weights[part_]
            where = locate(p.value, full, run.world) if p else None
            right = SHARD_DIM[part_]
            if where and where[0] is not None and where[0] != right:
                kept, should = ("input", "output") if right == 0 else ("output", "input")
                return (f"rank {obs.rank}'s {LAYER_CLASS[layer]}.weight is {_shape(p.shape)}: "
                        f"{describe(full, *where, run.world)}, that is {kept} features. A {layer}-parallel layer "
                        f"splits the {should} features, so rank {obs.rank} keeps "
                        f"{describe(full, right, obs.rank, run.world)}"
                        + (" and the matching elements of the bias" if right == 0 else " and the whole bias"))
    return None


@mistake("a shard that is not the rank's own")
def not_own_shard(run: Run, part: str) -> str | None:
    for obs in run.ranks:
        for part_ in (p for p in PARTS if SHARD_DIM[p] is not None):
            layer, name = part_.split(".")
            if part != "shards" and layer in obs.substituted:
                continue
            p, full = obs.param(part_), run.ref.weights[part_]
            where = locate(p.value, full, run.world) if p else None
            if where and where[0] == SHARD_DIM[part_] and where[1] != obs.rank:
                n = full.shape[where[0]] // run.world
                cut = "elements" if full.dim() == 1 else ("rows", "columns")[where[0]]
                return (f"rank {obs.rank}'s {LAYER_CLASS[layer]}.{name} holds {describe(full, *where, run.world)}, "
                        f"rank {where[1]}'s shard: rank r keeps {cut} r·{n}:(r+1)·{n} (chunk(world_size)[rank]), so "
                        f"that the {run.world} ranks together hold each of the {full.shape[where[0]]} once")
    return None


@mistake("the input not replicated: split across the ranks")
def input_not_replicated(run: Run, part: str) -> str | None:
    for obs in run.ranks:
        shape = obs.shapes.get("column") or [*LEAD, 0]
        rows = torch.Size(shape[:-1]).numel()
        if rows < B:  # fewer rows than x has (one with all of them, its leading dimensions merged, is not this)
            return (f"ColumnParallelLinear returned {_shape(shape)} for the {X_SHAPE} input on rank {obs.rank}: "
                    f"{rows} of its {B} rows of {D} features. Each rank took its part of the batch, but tensor "
                    "parallelism splits the weights, not the batch: every rank applies its shard to the whole input "
                    "x (f hands it over unchanged)")
        m = re.search(r"mat1 and mat2 shapes cannot be multiplied \((\d+)x(\d+) and (\d+)x(\d+)\)",
                      obs.error or obs.replaced)  # replaced: what the step raised before a stand-in stepped again
        if m and int(m[2]) < D and int(m[3]) == D:
            return (f"ColumnParallelLinear's matmul got a {m[1]}x{m[2]} input on rank {obs.rank}, {m[2]} of x's {D} "
                    f"features: every rank needs the whole input, since its weight shard has all {D} input features "
                    "(f hands x over unchanged)")
    return None


def _held(run: Run):
    """``(rank's observations, layer, tensor)`` for every distinct storage each rank's layers keep."""
    for obs in run.ranks:
        for layer, held in obs.layers.items():
            for t in held.tensors:
                yield obs, layer, t


@mistake("a shard that is a view of the unsplit weight")
def view_kept(run: Run, part: str) -> str | None:
    for obs, layer, t in _held(run):
        if t.name in ("weight", "bias") and (t.unsplit or t.storage_bytes > t.bytes):
            return (f"rank {obs.rank}'s {LAYER_CLASS[layer]}.{t.name} is a view into the unsplit layer's "
                    f"tensor: its storage is {t.storage_bytes:,} B for its own {t.bytes:,} B, so every "
                    "rank keeps the whole tensor alive: copy the slice, nn.Parameter(piece.clone())")
    return None


@mistake("the unsplit layer kept next to the shard")
def unsplit_kept(run: Run, part: str) -> str | None:
    for obs, layer, t in _held(run):
        if t.name not in ("weight", "bias") and t.unsplit:
            return (f"rank {obs.rank}'s {LAYER_CLASS[layer]} also keeps {t.name} ({_shape(t.shape)}, "
                    f"{t.storage_bytes:,} B), the unsplit layer's: keep only the shard's copies, and no "
                    "reference to the nn.Linear they were cut from (it keeps all of its weights alive)")
    return None


@mistake("averaged instead of summed")
def averaged(run: Run, part: str) -> str | None:
    if part == "x_grad":
        ratio, what = multiple_of(run.ranks[0].x_grad, run.ref.x_grad), "the input's gradient"
    else:
        bias = run.ref.weights["row.bias"]
        out = run.ranks[0].out
        ratio = multiple_of(None if out is None else out - bias, run.ref.out - bias)
        what = "the output minus the bias"
    if ratio is None or abs(ratio * run.world - 1) > 1e-3:
        return None
    return (f"{what} is {ratio:.2f}x the unsplit block's with {run.world} ranks: the "
            f"{'backward' if part == 'x_grad' else 'forward'} all-reduce averaged the ranks' parts (ReduceOp.AVG, or "
            "a division by the world size). Each part is one share of the result, not an estimate of it: sum them "
            "(op=ReduceOp.SUM, the default)")


def _no_grad(t: torch.Tensor | None) -> bool:
    return t is None or not bool(t.abs().sum())


def _names(parts) -> str:
    return ", ".join(f"{LAYER_CLASS[p.split('.')[0]]}.{p.split('.')[1]}" for p in parts)


@mistake("a backward that returns no gradient")
def gradient_stopped(run: Run, part: str) -> str | None:
    for obs in run.ranks:
        g, r = obs.grads, obs.rank
        if not g or obs.error:
            continue
        before = ("column.weight", "column.bias", "row.weight")
        if not _no_grad(g["row.bias"]) and all(_no_grad(g[p]) for p in before):
            return (f"on rank {r} RowParallelLinear.bias, added after ReduceFromParallelRegion, got its gradient, but "
                    f"none of {_names(before)}, before it, did: the gradient stopped at "
                    "ReduceFromParallelRegion.backward, which returned None (or zeros). g's backward is the identity: "
                    "return the output's gradient as it came in")
        if all(not _no_grad(g[p]) for p in PARTS) and obs.x_grad is None:
            reduces = run.calls(r, "backward", "all_reduce")
            ran = f" (its all-reduce of {_shape(reduces[0].shape)} ran)" if reduces else ""
            return (f"on rank {r} every shard got its gradient but the input x got none: "
                    f"CopyToParallelRegion.backward returned None{ran}. Return the gradient it all-reduced")
    return None


@mistake("a layer's forward that returns no tensor")
def forward_returned_nothing(run: Run, part: str) -> str | None:
    for obs in run.ranks:
        for layer in ("column", "row"):
            if layer in obs.shapes and obs.shapes[layer] is None:
                return (f"on rank {obs.rank} {LAYER_CLASS[layer]}.forward returned None, not a tensor, so the "
                        f"{'GELU after it' if layer == 'column' else 'block'} had nothing to work on: every path "
                        "through forward must end in `return` of the layer's output")
    return None
