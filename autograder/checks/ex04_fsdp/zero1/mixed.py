"""Exercise 4's part 1 in mixed precision: the learner's ZeRO-1 on a bfloat16 copy of the model.

ZeRO keeps the optimizer's fp32 master weights sharded (Rajbhandari et al., 2020, section 3.1: mixed-precision
Adam keeps an fp32 copy of the parameters), and the model's own low-precision parameters are written from them
after every step. The fp32 run of ``criteria`` cannot tell a bf16 master from an fp32 one, nor parameters written
in place from parameters replaced by the gathered fp32 tensors: this run (``probes.observe_half``) can. Graded from
what every rank kept, against the ranks' own shards: after each step every rank's parameters are the W updated
master shards, rounded to bfloat16.
"""
from __future__ import annotations

import torch

from ....grader.diagnosis import diagnose, mistake, translate
from ....grader.report import Verdict, failed, passed
from ..causes import KNOWN_ERRORS
from ..observations import Run
from .causes import z1_error


@mistake("ZeRO-1 parameters replaced by the gathered fp32 tensors")
def z1_retyped(run: Run) -> str | None:
    """``p.data = gathered[...]`` (or ``vector_to_parameters`` without a cast): a bf16 model turns fp32."""
    r = next((r for r in run.ranks if r.zero1.half and r.zero1.half.retyped), None)
    if r is None:
        return None
    h = r.zero1.half
    stored = " and hold new storage" if h.rebound else ""
    return (f"after zero1_step {h.steps} on a bfloat16 model, {len(h.retyped)} of rank {r.rank}'s parameters are "
            f"no longer bfloat16 ('{h.retyped[0]}'){stored}: the gathered {h.shard_dtype or 'fp32'} values replaced "
            "the parameters instead of being written into them, so the model is no longer the one it was, and its "
            "next forward mixes dtypes. Write them in place under torch.no_grad(): p.copy_(...) casts to the "
            "parameter's own dtype")


@mistake("ZeRO-1 master shard not fp32 under a bf16 model")
def z1_master_low(run: Run) -> str | None:
    r = next((r for r in run.ranks if r.zero1.half and r.zero1.half.shard_dtype not in ("", "float32")), None)
    if r is None:
        return None
    h = r.zero1.half
    moments = f" (Adam's moments: {', '.join(h.state_dtypes)})" if h.state_dtypes else ""
    return (f"for a bfloat16 model, rank {r.rank}'s make_zero1_optimizer returned a {h.shard_dtype} shard{moments}: "
            "the master shard must be fp32 (the copy cast with .float()). In bfloat16 an update smaller than half the "
            "gap between neighbouring bf16 numbers (0.2% to 0.4% of the weight) rounds away, so Adam's small late "
            "steps are lost; the fp32 master keeps them, and zero1_step rounds only the copy it writes into the model")


def z1_half_raised(run: Run) -> str | None:
    r = next((r for r in run.ranks if r.zero1.half and r.zero1.half.error), None)
    if r is None:
        return None
    h = r.zero1.half
    cause = translate(h.error, KNOWN_ERRORS)
    when = f"zero1_step {h.steps + 1}" if h.shard_dtype else "make_zero1_optimizer"
    mixed = any(word in h.error for word in ("BFloat16", "dtype", "different type", "scalar type"))
    fix = (f". There the model's parameters and gradients are bfloat16 and the shard {h.shard_dtype}: cast the flat "
           "gradient to the shard's dtype before the reduce-scatter, and write the gathered values into the "
           "parameters with p.copy_(...), which casts" if mixed and h.shard_dtype == "float32" else "")
    return (f"on a bfloat16 model (mixed precision: the model bf16, the master shard fp32), rank {r.rank}'s {when} "
            f"raised {h.error}, where the fp32 model's run did not{': ' + cause if cause else ''}{fix}")


HALF_CAUSES = [z1_half_raised, z1_retyped, z1_master_low]


def _gathered(run: Run) -> torch.Tensor | None:
    """The W ranks' updated master shards, in rank order, the padding dropped, rounded to bfloat16."""
    shards = [r.zero1.half.shard for r in run.ranks]
    if any(s is None for s in shards):
        return None
    return torch.cat(shards)[:run.z1_ref["numel"]].to(torch.bfloat16).float()


def zero1_mixed_precision(run: Run, values_judged_in: str | None) -> Verdict:
    """The criterion's verdict (``criteria.zero1_mixed``), where part 1's fp32 run raised nothing.
    ``values_judged_in``: the criterion that already failed the fp32 run's weights (None: they matched), so
    that one mistake costs one criterion; the dtypes are judged all the same."""
    if any(r.zero1.half is None for r in run.ranks):  # the fp32 run raised on another rank only
        return failed(z1_error(run) or "not checked: part 1's fp32 run did not finish on every rank")
    if why := diagnose(HALF_CAUSES, run):
        return failed(why)
    full, steps = _gathered(run), run.ranks[0].zero1.half.steps
    kept = f"the master shard and Adam's moments fp32, the parameters still bfloat16 after {steps} steps"
    if values_judged_in:
        return passed(f"{kept} (their values are judged in fp32, in '{values_judged_in}')")
    for r in run.ranks:
        got = r.zero1.half.params
        if full is None or got is None or got.shape != full.shape or not torch.equal(got, full):
            diff = (got - full).abs() if full is not None and got is not None and got.shape == full.shape else None
            how = f" (max abs difference {float(diff.max()):.3g})" if diff is not None else ""
            return failed(f"after {steps} steps on a bfloat16 model rank {r.rank}'s parameters are not the "
                          f"{run.world} updated master shards rounded to bfloat16{how}: every rank's model must hold "
                          "the all-gathered shards after each step")
    return passed(f"{kept}, each the all-gathered shards rounded")
