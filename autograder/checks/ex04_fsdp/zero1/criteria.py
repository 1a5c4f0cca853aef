"""The criteria of exercise 4's first part, ZeRO-1 by hand (Rajbhandari et al., 2020, stage 1): the shard
ranges, the weights against one process's Adam, the optimizer's state per rank, the collectives per step, and
the same functions on a bfloat16 model (``mixed``).
"""
from __future__ import annotations

from ....grader.diagnosis import diagnose
from ....grader.parity import parity
from ....grader.report import Verdict, criterion, failed, passed
from distlab.measure.comm import label

from ..observations import Run
from ..workloads import ATOL, LR, MICRO_BATCH, RTOL, STEPS
from .mixed import zero1_mixed_precision
from .causes import (padding_dropped, z1_all_reduce, z1_buffers_flat, z1_error, z1_grad_summed, z1_no_all_gather,
                     z1_no_reduce_scatter, z1_not_written, z1_optimizer_full, z1_shard_a_view, z1_wrong_offset)

__all__ = ["ZERO1_CRITERIA"]


# Part 1, ZeRO-1 by hand: why the weights differ from the reference, most specific first.
ZERO1_CAUSES = [z1_error, z1_optimizer_full, z1_buffers_flat, z1_wrong_offset, z1_grad_summed, z1_no_reduce_scatter,
                z1_no_all_gather, z1_not_written]


@criterion("[W={world}] ZeRO-1: shard_range cuts W equal, padded, contiguous slices", points=1)
def zero1_shard_range(run: Run) -> Verdict:
    z0 = run.z1[0]
    if z0.ranges_error:
        return failed(f"shard_range raised {z0.ranges_error}")
    for numel, got in z0.ranges.items():
        c = -(-numel // run.world)
        if got != [[r * c, (r + 1) * c] for r in range(run.world)]:
            return failed(padding_dropped(run) or f"shard_range({numel}, {run.world}, r) for r = 0..{run.world - 1} "
                          f"gave {got}: expected {run.world} contiguous slices of c = ceil({numel} / {run.world}) "
                          f"= {c} in rank order, [r * c, (r + 1) * c)")
    return passed()


def _z1_raised(run: Run) -> str | None:
    """Part 1 raised: said in full once, by zero1_matches_reference; the other criteria point there."""
    if not z1_error(run):
        return None
    how = "did not finish" if any(r.zero1.aborted for r in run.ranks) else "raised"  # a hang or an abort: no raise
    return f"not checked: part 1 {how} (see '{zero1_matches_reference.rule.name.format(world=run.world)}')"


def _parities(run: Run) -> list:
    """Every rank's final flat parameters against one process's Adam, parameter by parameter."""
    ref, names, sizes = run.z1_ref["final"], run.z1_ref["names"], run.z1_ref["sizes"]
    numel = run.z1_ref["numel"]
    return [parity(dict(zip(names, run.z1_final(r)[:numel].split(sizes))), dict(zip(names, ref[:numel].split(sizes))),
                   rtol=RTOL, atol=ATOL) for r in range(run.world)]


@criterion("[W={world}] ZeRO-1: every rank's weights match single-process Adam", points=2)
def zero1_matches_reference(run: Run) -> Verdict:
    if why := z1_error(run):
        return failed(why)
    pars = _parities(run)
    worst = max(range(run.world), key=lambda r: pars[r].max_abs_diff)
    measured = {f"W{run.world}_zero1_max_abs_diff_vs_reference": pars[worst].max_abs_diff}
    if all(pars):
        return passed(f"max abs difference {pars[worst].max_abs_diff:.2g}", **measured)
    return failed(diagnose(ZERO1_CAUSES, run) or
                  f"after {STEPS} steps rank {worst}'s weights differ from one process's Adam (lr={LR}) on the global "
                  f"batches of {run.world}x{MICRO_BATCH} (max abs difference {pars[worst].max_abs_diff:.3g} in "
                  f"'{pars[worst].worst}', rtol={RTOL}, atol={ATOL})", **measured)


@criterion("[W={world}] ZeRO-1: each rank's Adam state is 1/{world} of the parameters", points=1)
def zero1_state_sharded(run: Run) -> Verdict:
    if why := _z1_raised(run):
        return failed(why)
    numel, c = run.z1_ref["numel"], run.z1_ref["c"]
    measured = {f"W{run.world}_zero1_rank{r.rank}_exp_avg_numel": r.zero1.state.get("exp_avg", 0)
                for r in run.ranks}
    for r in run.ranks:
        state, rank = r.zero1.state, r.rank
        own = min(c, max(0, numel - rank * c))  # its real elements; the padded shard holds c
        bad = {k: v for k, v in state.items() if v not in (c, own)}
        if not state or bad or set(state) != {"exp_avg", "exp_avg_sq"}:
            return failed(z1_optimizer_full(run) or z1_buffers_flat(run) or
                          f"on rank {rank} the optimizer's state holds {state or 'nothing'} elements; ZeRO-1 keeps "
                          f"exp_avg and exp_avg_sq of the rank's shard only, {c} elements each (1/{run.world} of "
                          f"{numel}, padded)", **measured)
    if why := z1_shard_a_view(run):
        return failed(why, **measured)
    return passed(f"{c} elements per moment per rank, of {numel}", **measured)


@criterion("[W={world}] ZeRO-1: one reduce-scatter and one all-gather per step, no all-reduce", points=1)
def zero1_collectives(run: Run) -> Verdict:
    if why := _z1_raised(run):
        return failed(why)
    for r in range(run.world):
        for step, counts in enumerate(run.z1_counts(r), 1):
            if counts != {"reduce_scatter": 1, "all_gather": 1}:
                said = ", ".join(f"{n} {label(k)}" for k, n in counts.items()) or "no collective"
                return failed(z1_all_reduce(run) or z1_no_reduce_scatter(run) or z1_no_all_gather(run) or
                              f"step {step} on rank {r} issued {said}: ZeRO-1 needs one reduce-scatter of the padded "
                              "flat gradient and one all-gather of the updated shards per step")
    return passed(f"each of {len(run.z1[0].steps)} steps issued one reduce-scatter and one all-gather on every "
                  "rank, no all-reduce")


@criterion("[W={world}] ZeRO-1: a bf16 model steps from an fp32 master shard and keeps its dtype", points=1)
def zero1_mixed(run: Run) -> Verdict:
    if why := _z1_raised(run):
        return failed(why)
    # where the fp32 weights are wrong, that criterion says why; this one judges the dtypes alone
    parity_criterion = zero1_matches_reference.rule.name.format(world=run.world)
    return zero1_mixed_precision(run, values_judged_in=None if all(_parities(run)) else parity_criterion)


ZERO1_CRITERIA = [zero1_shard_range, zero1_matches_reference, zero1_state_sharded, zero1_collectives, zero1_mixed]
