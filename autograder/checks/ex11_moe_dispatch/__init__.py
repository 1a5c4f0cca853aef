"""Exercise 11 check: expert parallelism's uneven dispatch and combine, graded at world size 2.

Every rank builds the same top-1 MoE layer (``distlab.lab.expert_parallel``, one expert per rank,
capacity factor 1.25, so that some slots are dropped) and routes its own 24 tokens; the grader runs
the learner's ``sort_by_expert``, ``exchange_split_sizes``, ``dispatch`` and ``combine`` in the layer
as ``moe_forward`` does, one at a time (``probes``). Against the single-process MoE on every rank's
tokens with capacity per rank (GShard's groups; Lepikhin et al., 2020; Fedus et al., 2021) it checks:

* the split sizes, exactly: the kept slots in expert order, and each expert's count;
* the sizes exchanged: each rank's ``output_split_sizes`` is what the others send it, by one all-to-all;
* dispatch's rows, exactly (an all-to-all copies), against the grader's own all-to-all of the same rows; then
  combine's, given the right rows, against the grader's all-to-all back and inverse permutation. Where one
  is wrong, the grader's own goes on in its place, so that the other is graded alone;
* the gradients (``assert_close``: the router's is summed over the ranks, another order), each function's
  apart: the expert's and the router's come back through combine, the input's through dispatch (given combine's
  right, or the grader's where the learner's combine was wrong);
* the all-to-alls counted (``CollectiveRecorder``), each function's apart: one in its forward, one in the
  backward for it, and no other collective. A function the grader replaced loses its own backward criteria
  only: the other's backward runs through the grader's, and is graded.

The split, dispatch, combine and the backward are each kept as they return: one that ends its launch (gloo's abort
on an all-to-all whose splits disagree between the ranks, a hang) costs its own criteria, and the backward's where
dispatch or combine ended (it goes through both), and no others (``grader.parts``): a combine after a dispatch
that ended is given the grader's dispatched rows.

| mistake | message |
|---|---|
| the counts exchanged in place: one tensor the all-to-all's output and input | "... with one tensor as both ..." |
| keep applied to the sorted order, not to the slots | "rank 0's perm is argsort(expert) masked with keep: ..." |
| capacity drop not applied: dropped slots sent | "rank 0's perm holds 48 slots, 3 of them dropped at capacity ..." |
| tokens sorted by the wrong key | "rank 0's perm is not in expert order: its slot 21 goes to expert 1 after ..." |
| split sizes wrong on an edge case of the contract | "where the last expert gets no slot (expert=[0, ...], ...) ..." |
| split sizes not exchanged: output_split_sizes = input_split_sizes | "rank 0's exchange_split_sizes returned ..." |
| permutation not inverted: rows come back in expert order | "rank 0's combine returned the 45 rows in the order ..." |
| all-to-all not autograd-aware: no gradient through it | "rank 0's dispatch returned a tensor with no grad_fn ..." |
| a function that returns nothing | "rank 0's sort_by_expert returned None, where its contract returns ..." |
| split sizes exchanged by no collective | "rank 0's exchange_split_sizes made no collective and returned ..." |
| split sizes that do not add up to the rows sent | ("Split sizes doesn't match total dim 0 size") "..." |
| exchange_split_sizes handed in as the runtime's copy | "exchange_split_sizes is distlab's copy (it calls ...) ..." |
| perm indexes the list of kept slots, not the slots | "rank 0's perm holds positions 0..21 in the list of its 22 ..." |
| dispatch's split sizes swapped | "rank 0's dispatch returned 22 rows, the number it sends ..., not the 20 ..." |
| split sizes count the dropped slots | "rank 0's input_split_sizes is [7, 17], the slots per expert dropped ones ..." |
| combine puts rows in the wrong slots | "rank 0's combine put the expert's outputs in the wrong slots: slot 3 ..." |
| combine leaves the dropped slots' rows unwritten | "rank 0's combine returned NaN in the rows of the 2 dropped ..." |
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch

from ...grader.diagnosis import diagnose, translate
from ...grader.launches import launch_timeout
from ...grader.parity import parity
from ...grader.parts import judge_parts, launch_parts
from ...grader.registry import Exercise
from ...grader.report import ExerciseReport, Verdict, criterion, failed, passed
from .dtypes import keeps_dtype
from .causes import (KNOWN_ERRORS, aliased_exchange, counted_dropped, dropped_sent, dropped_unwritten,
                     edge_case_missed, keep_on_sorted, no_exchange_collective, not_autograd, not_exchanged,
                     not_inverted, perm_in_kept, returned_none, rows_differ, runtime_copy, splits_swapped,
                     wrong_order, wrong_slots)
from .observations import Run
from .probes import rank_main
from .reference import ATOL, RTOL

__all__ = ["CRITERIA", "EXERCISE", "KNOWN_ERRORS", "grade"]

EXERCISE = Exercise(number=11, name="moe_dispatch", filename="ex11_moe_dispatch.py", max_score=10, time_limit=90)


def _raised(run: Run, stage: str) -> str | None:
    bad = run.error(stage)
    if bad is None:
        return None
    rank, err = bad
    known = translate(err.error, KNOWN_ERRORS)
    return (f"rank {rank}'s {stage if stage == 'backward' else stage + '()'} raised {err.error}"
            + (f" at {err.where}" if err.where else "") + (f": {known}" if known else ""))


SORT_CAUSES = [perm_in_kept, keep_on_sorted, dropped_sent, counted_dropped, wrong_order]  # most specific first


@criterion("[W={world}] the kept slots sorted by expert, and the split sizes exact", points=2)
def split_sizes(run: Run) -> Verdict:
    if why := _raised(run, "sort"):
        return failed(why)
    for obs in run.ranks:
        if "sort" in obs.substituted:
            r, got = obs.rank, obs.returned
            want = run.slots(r).send
            return failed(returned_none(run, "sort") or diagnose(SORT_CAUSES, run) or (
                f"rank {r}'s input_split_sizes is {got.send}, its kept slots per expert {want}"
                if got.send != want else f"rank {r}'s perm is not the {sum(want)} kept slots' indices "
                "(int64, 1-D, each once) in expert order"))
    if why := edge_case_missed(run):
        return failed(why)
    counts = [run.slots(r).send for r in range(run.world)]
    dropped = sum(int((~run.slots(r).keep).sum()) for r in range(run.world))
    return passed(f"split sizes {counts}; {dropped} slots dropped at capacity; and on the contract's edge cases "
                  f"({', '.join(c.name for c in run.ranks[0].edges)})", dropped_slots=dropped)


@criterion("[W={world}] the split sizes exchanged, by one all-to-all of counts", points=2)
def sizes_exchanged(run: Run) -> Verdict:
    if copied := runtime_copy(run):   # before its error: the runtime's copy takes a tensor, the contract a list
        return failed(copied)
    if why := _raised(run, "exchange") or aliased_exchange(run):  # aliased: a race, whatever this run returned
        return failed(why)
    for obs in run.ranks:
        r = obs.rank
        if "exchange" in obs.substituted:
            want = [run.slots(j).send[r] for j in range(run.world)]
            return failed(returned_none(run, "exchange") or diagnose([not_exchanged, no_exchange_collective], run) or
                          f"rank {r}'s exchange_split_sizes returned {obs.returned.recv}; the ranks send it "
                          f"{want} rows (a list of Python ints)")
        calls = run.calls(r, "exchange")
        if [(c.kind, c.shape) for c in calls] != [("all_to_all", [run.world])]:
            return failed(f"rank {r}'s exchange_split_sizes made {len(calls)} collective(s) "
                          f"({', '.join(c.kind for c in calls) or 'none'}): the counts take one all_to_all_single "
                          f"of {run.world} integers")
    return passed(f"one all-to-all of the counts on every rank{_given(run, 'exchange')}")


def _given(run: Run, stage: str) -> str:
    """What the grader handed ``stage`` in place of a wrong result of the functions before it, said once."""
    before = {"exchange": ("sort",), "dispatch": ("sort", "exchange"),
              "combine": ("sort", "exchange", "dispatch"), "backward": ("sort", "exchange")}[stage]
    mine = sorted({s for o in run.ranks for s in o.substituted if s in before}, key=before.index)
    names = {"sort": "perm and input_split_sizes", "exchange": "output_split_sizes", "dispatch": "dispatched rows"}
    ended = {s for o in run.ranks for s in o.unfinished}
    why = ("yours did not finish" if ended >= set(mine) else "yours are wrong or did not finish" if ended & set(mine)
           else "yours are wrong")
    return f" (given the grader's {' and '.join(names[s] for s in mine)}: {why}, see above)" if mine else ""


@criterion("[W={world}] dispatch: each expert's rank receives the rows sent to it, in rank order", points=1)
def dispatch_rows(run: Run) -> Verdict:
    if why := _raised(run, "dispatch"):
        return failed(why)
    for obs in run.ranks:
        r, got, want = obs.rank, obs.returned.dispatched, obs.dispatch_want
        if got is None:
            return failed(returned_none(run, "dispatch") or diagnose([splits_swapped], run) or
                          f"rank {r}'s dispatch returned {obs.returned.dispatch_shape}, where its contract gives "
                          f"({len(want)}, {want.shape[1]}): the rows its expert receives")
        if not torch.equal(got, want):
            return failed(rows_differ(run, r))
    return passed(f"{[len(o.dispatch_want) for o in run.ranks]} rows received{_given(run, 'dispatch')}")


@criterion("[W={world}] combine: every slot gets its expert's output back, zeros for the dropped", points=1)
def combine_rows(run: Run) -> Verdict:
    if why := _raised(run, "combine"):
        return failed(why)
    for obs in run.ranks:
        r, got, want = obs.rank, obs.y_slots, obs.y_slots_want
        if got is None:
            return failed(returned_none(run, "combine") or
                          f"rank {r}'s combine returned {obs.returned.combine_shape}, where its contract gives "
                          f"({len(want)}, {want.shape[1]}): one row per slot")
        p = parity(got, want, rtol=1e-5, atol=1e-6)
        if not p.ok:
            return failed(diagnose([dropped_unwritten, not_inverted, wrong_slots], run) or
                          f"rank {r}'s combine returned rows that differ from the expert's outputs put back in "
                          f"their slots by up to {p.max_abs_diff:.3g}{_given(run, 'combine')}")
    worst = max(float((o.y - run.ref.y[run.rows(o.rank)]).abs().max()) for o in run.ranks)
    return passed(f"the layer's output is the single-process MoE's to {worst:.2g}{_given(run, 'combine')}",
                  **{f"W{run.world}_y_max_abs_diff": worst})


def _replaced(run: Run, stage: str) -> str | None:
    """Where the grader's ``stage`` ran in place of the learner's (its result was wrong): what to say."""
    if not any(stage in o.substituted for o in run.ranks):
        return None
    said = dispatch_rows if stage == "dispatch" else combine_rows
    return f"not checked: the grader's {stage} ran in place of yours (see '{said.rule.name.format(world=run.world)}')"


def _through(run: Run, stage: str) -> str:
    """The backward of ``stage`` is judged alone where the grader's other one went on: said once."""
    other = "combine" if stage == "dispatch" else "dispatch"
    return f" (through the grader's {other}: yours is wrong, see above)" if any(
        other in o.substituted for o in run.ranks) else ""


def _grads(run: Run, checks: list[tuple[str, torch.Tensor | None, torch.Tensor]]) -> tuple[str | None, float]:
    """The first of ``checks`` (what, got, want) whose gradient is missing or differs, said; and the largest
    difference."""
    worst = 0.0
    for what, got, want in checks:
        if got is None:
            return f"{what} is missing after the backward", worst
        p = parity(got, want, rtol=RTOL, atol=ATOL)
        if not p.ok:
            return f"{what} differs from the single-process MoE's by up to {p.max_abs_diff:.3g}", worst
        worst = max(worst, p.max_abs_diff)
    return None, worst


def _combine_checks(run: Run) -> list[tuple]:
    """The gradients combine's backward carries: each rank's expert's (and the router's, summed over the ranks)."""
    routers = [o.router_grad for o in run.ranks]
    checks = [(f"rank {o.rank}'s expert {n}.grad", g, run.ref.expert_grads[o.rank][n])
              for o in run.ranks for n, g in o.expert_grads.items()]
    return checks + [("the router's gradient summed over the ranks", None if None in routers else sum(routers),
                      run.ref.router_grad)]


@criterion("[W={world}] backward: the expert's and the router's gradients match, back through combine", points=1)
def combine_grads(run: Run) -> Verdict:
    if why := _replaced(run, "combine") or _raised(run, "backward") or not_autograd(run, "combine"):
        return failed(why)
    why, worst = _grads(run, _combine_checks(run))
    if why:
        return failed(why)
    return passed(f"max abs difference {worst:.2g}{_given(run, 'backward')}{_through(run, 'combine')}",
                  **{f"W{run.world}_expert_grad_max_abs_diff": worst})


@criterion("[W={world}] backward: the input's gradient matches, back through dispatch", points=1)
def dispatch_grads(run: Run) -> Verdict:
    if why := _replaced(run, "dispatch") or _raised(run, "backward"):
        return failed(why)
    if not _replaced(run, "combine") and (not_autograd(run, "combine") or _grads(run, _combine_checks(run))[0]):
        return failed("not judged: the gradient that reaches dispatch's rows comes back through your combine, whose "
                      f"gradients differ (see '{combine_grads.rule.name.format(world=run.world)}')")
    if why := not_autograd(run, "dispatch"):
        return failed(why)
    why, worst = _grads(run, [(f"rank {o.rank}'s x.grad", o.x_grad, run.ref.x_grad[run.rows(o.rank)])
                              for o in run.ranks])
    if why:
        return failed(why)
    return passed(f"max abs difference {worst:.2g}{_given(run, 'backward')}{_through(run, 'dispatch')}",
                  **{f"W{run.world}_x_grad_max_abs_diff": worst})


def _all_to_alls(run: Run, stage: str) -> Verdict:
    """``stage``'s one all-to-all in the forward, and one of the backward's two (the other stage's is the other):
    a stage whose output has no grad_fn made none there."""
    if why := _replaced(run, stage):  # its backward did not run: the grader's rows went on
        return failed(why)
    for obs in run.ranks:
        r, calls = obs.rank, run.calls(obs.rank, stage)
        if [c.kind for c in calls] != ["all_to_all"]:
            return failed(f"rank {r}'s {stage} made {', '.join(c.kind for c in calls) or 'no collective'}; it takes "
                          "one all-to-all")
    if why := not_autograd(run, stage):
        return failed(why)
    # the backward's all-to-alls: one for each stage whose output autograd can see through (the other's missing one
    # is the other's criterion's)
    want = sum(not not_autograd(run, s) for s in ("dispatch", "combine"))
    for obs in run.ranks:
        calls = run.calls(obs.rank, "backward")
        if [c.kind for c in calls] != ["all_to_all"] * want:
            return failed(f"rank {obs.rank}'s backward made {', '.join(c.kind for c in calls) or 'no collective'}; "
                          f"it takes {want} all-to-all{'s' if want > 1 else ''}, autograd's of "
                          f"{'each stage' if want > 1 else stage}'s, and nothing else")
    rows = [sum(run.slots(r).send) for r in range(run.world)]
    return passed(f"one all-to-all per rank each way, of {rows} rows (no padding){_given(run, 'backward')}"
                  f"{_through(run, stage)}")


@criterion("[W={world}] dispatch: one all-to-all in the forward, one in the backward, nothing else", points=1)
def dispatch_all_to_alls(run: Run) -> Verdict:
    return _all_to_alls(run, "dispatch")


@criterion("[W={world}] combine: one all-to-all in the forward, one in the backward, nothing else", points=1)
def combine_all_to_alls(run: Run) -> Verdict:
    return _all_to_alls(run, "combine")


CRITERIA = [split_sizes, sizes_exchanged, dispatch_rows, combine_rows, combine_grads, dispatch_grads,
            dispatch_all_to_alls, combine_all_to_alls, keeps_dtype]


# The parts, in the order they run, with what each grades; the backward and the float64 calls need both functions'
# forwards. A combine run after a dispatch that ended its launch is given the grader's rows.
PARTS = {"sort": ("sort_by_expert", CRITERIA[:1]), "exchange": ("exchange_split_sizes", CRITERIA[1:2]),
         "dispatch": ("dispatch", CRITERIA[2:3]), "combine": ("combine", CRITERIA[3:4]),
         "backward": ("the backward through dispatch and combine", CRITERIA[4:8]),
         "dtype": ("dispatch and combine on float64 rows", CRITERIA[8:])}
NEEDS = {"backward": ("dispatch", "combine"), "dtype": ("dispatch", "combine")}


def grade(paths: Sequence[Path], world: int = 2) -> list[ExerciseReport]:
    """Grade the files at ``paths`` in one ``world``-rank launch (one more per part that ends one); one report each."""
    reports = [EXERCISE.new_report() for _ in paths]
    parted, wall_s = launch_parts(rank_main, paths, world=world, timeout=launch_timeout(EXERCISE, files=len(paths)),
                                  parts=list(PARTS), known=KNOWN_ERRORS, needs=NEEDS)
    for report, file in zip(reports, parted):
        run = Run.from_parts(file, world)
        if (stub := next((o.not_implemented for o in run.ranks if o.not_implemented), None)):
            report.did_not_run(f"not implemented yet ({stub})")
            continue
        # the sort and the exchange each on its own part's record (a later launch went on from the grader's values)
        own = {p: Run.from_wire(k) for p in ("sort", "exchange") if (k := file.part(p)) and all(k)}
        judge_parts(report, PARTS, file.ended, own, default=run, unrun=file.unrun, world=world)
        if wall_s is not None:
            report.measurements[f"W{world}_launch_s"] = round(wall_s, 2)
    return [r.scale_to() for r in reports]

