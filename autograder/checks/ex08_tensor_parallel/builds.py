"""Exercise 8's layers built again on each rank (``probes._rebuilt``): for every other rank, and from a float64 block.

The contract's layers are functions of their arguments: ``ColumnParallelLinear(linear, rank, world_size)`` holds
rank ``rank``'s block of ``linear``, in ``linear``'s dtype. The graded step builds each rank's own layers from a
float32 block, where a shard cut by ``dist.get_rank()`` or made with torch's default dtype is right by chance:
these builds tell them apart (Megatron-LM builds a layer's shard from its arguments, not from the process).
"""
from __future__ import annotations

import torch

from ...grader.diagnosis import mistake
from .observations import Run
from .reference import LAYER_CLASS, PARTS, SHARD_DIM
from .causes import describe


def _owner(run: Run, part: str, value: torch.Tensor) -> int | None:
    """The rank whose shard of ``part`` ``value`` is (None: no rank's)."""
    return next((r for r in range(run.world) if value.shape == run.expected(part, r).shape
                 and torch.equal(value, run.expected(part, r))), None)


@mistake("a shard cut by the process's rank, not the rank given")
def rank_argument_ignored(run: Run) -> str | None:
    for obs in run.ranks:
        for given, parts in obs.built_for.items():
            for part in (p for p in PARTS if SHARD_DIM[p] is not None):
                got, want = parts[part], run.expected(part, int(given))
                if got is not None and got.shape == want.shape and torch.equal(got, want):
                    continue
                layer, name = part.split(".")
                owner = _owner(run, part, got) if got is not None else None
                held = (f"{describe(run.ref.weights[part], SHARD_DIM[part], owner, run.world)}, rank {owner}'s"
                        if owner is not None else "another tensor")
                follows = (": the shard follows the process's rank, not the rank it is given"
                           if owner == obs.rank else "")
                return (f"{LAYER_CLASS[layer]}(linear, rank={given}, world_size={run.world}), built on rank "
                        f"{obs.rank}, holds as its {name} {held}, where rank {given}'s is "
                        f"{describe(run.ref.weights[part], SHARD_DIM[part], int(given), run.world)}{follows}. Cut "
                        "the shard with the rank argument: a layer is built from its arguments alone")
    return None


@mistake("a shard in torch's default dtype, not the layer's")
def dtype_not_kept(run: Run) -> str | None:
    for obs in run.ranks:
        bad = [p for p in PARTS if obs.wide_dtypes.get(p, "float64") != "float64"]
        if bad:
            layer, name = bad[0].split(".")
            dtype = obs.wide_dtypes[bad[0]]
            default = ", torch's default dtype," if dtype == str(torch.get_default_dtype()).removeprefix("torch.") \
                else ""
            return (f"built from a float64 block, rank {obs.rank}'s {LAYER_CLASS[layer]}.{name} is {dtype}{default} "
                    "not the layer's float64: a shard is the layer's own numbers, in its dtype and on its device. "
                    "Make it from the layer's tensor (a slice, .clone()), or pass dtype= and device= of "
                    "linear.weight to what creates it")
    return None


def rebuilt_wrong(run: Run) -> str | None:
    """Why the layers built again are not their arguments' shards (None: they are, or were not built)."""
    if err := next((o for o in run.ranks if o.rebuild_error), None):
        return (f"building the layers again on rank {err.rank} for another rank or from a float64 block raised "
                f"{err.rebuild_error}: a layer is built from its arguments alone, for any rank and dtype")
    return rank_argument_ignored(run) or dtype_not_kept(run)
