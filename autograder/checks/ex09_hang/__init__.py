"""Exercise 9 check: a hanging job diagnosed and fixed, graded by the fix at W=2 (and ``train_uneven`` at W=4).

Every rank trains the same small MLP on its own batches, given as an iterable that records the
step the learner's loop is at; at some steps a rank keeps no sample (rank 1 at step 1, both at step
4). The :class:`~.ledger.Ledger` records every collective each rank makes (the one recorder,
``CollectiveRecorder``) and, before it runs, compares it with the peers' op of the same number
(step, kind, shapes), so a job that would hang is stopped on every rank at once with each rank's
line, and the next file is graded in the same launch. A fixed job must finish with the same
collectives on every rank, match one process trained on each step's global batch (the mean over
every rank's kept samples: parity, Li et al. 2020's data-parallel equivalence), and keep the job's
meaning: a rank with nothing to keep takes part with a zero gradient, and the others' samples are
still learnt from.

Part 2 (``uneven``): the learner's ``train_uneven`` in three cases of each rank's number of batches (2 and 4:
the longest rank is not rank 0; 0 and 2: a rank with no batch at all; 2 and 2), each batch given as a stream
that records how far the learner read it, under the same ledger comparing what ``TORCH_DISTRIBUTED_DEBUG=DETAIL``
compares (kind and shapes: a rank out of data shadows steps it has no batch of), so that a rank leaving its
loop early is stopped as a hang with its peer's line named. Graded: no case hangs; and in each case one
process replaying the global stream of batches (each step the mean over the samples of the ranks that still have
a batch), compared at every batch's forward (a forward pre-hook knows the batches by their values) and at the end
on every rank. Both ``DistributedDataParallel`` under ``Join`` (``DDP.join()``; PyTorch's "uneven inputs") and an
all-reduced count of the step's samples written by hand are correct.

At W=4, a second launch (side by side with the first on the CPU, after it on a GPU machine) runs ``train_uneven``
alone with ranks holding 3, 1, 0 and 3 batches, graded the same way in one criterion: at W=2 a sum with one partner
rank (send/recv, or a 2-rank subgroup) is a sum over every rank; at W=4 the ranks end in groups that agree within.

| mistake | message |
|---|---|
| collectives skipped on a rank with nothing to keep | "the job hangs: rank 0's collective 6 is all_reduce ..." |
| gradient all-reduces skipped on a rank with nothing to keep | "... made 1 of that step's all-reduces ..." |
| a barrier where the peers all-reduce | "... rank 1's is barrier (step 1) ... A barrier does not ..." |
| gradients never all-reduced | "no rank made an all-reduce in 6 steps ...: each rank stepped on its own gradient ..." |
| the step skipped on every rank | "at step 1 no rank all-reduced its gradients ... although rank 0 kept 5 ..." |
| an empty rank sends a non-zero gradient | "rank 1 kept no sample at step 1 but all-reduced tensors whose ..." |
| the gradients never all-reduced, the count is | "no rank all-reduced a gradient in 6 steps: rank 0's 6 ..." |
| a step with no kept sample on any rank divided by a count of 0 | "at step 3 no rank kept a sample ... NaN ..." |
| zero gradients all-reduced by a rank that kept samples | "rank 0 kept 6 samples at step 0, yet every gradient ..." |
| the count never all-reduced: each rank divides by its own | "at step 0 every all-reduce was of a gradient ..." |
| the weights never updated | "after 6 steps every rank's weights are still the initial ones ..." |
| a rank with no kept sample skips the step's update | "the ranks ended with different weights (rank 0's ..." |
| uneven: a rank that runs out of batches leaves the loop | "the job hangs with ranks with 2 and 4 batches: ..." |
| uneven: the update divided by every rank's share, not the ranks with data | "at steps 2 and 3 only 1 of the 2 ..." |
| uneven: every update scaled by one factor | "rank 1's update was 0.25x (1/4) one process's SGD step ..." |
| uneven: the loop ends when the first rank runs out | "rank 1 ran 3 of its 4 batches through the model ..." |
| uneven: a rank out of data sends a non-zero gradient | "rank 0 had run out of data (after its 2 ...), yet ..." |
| uneven: a rank out of data stops updating its weights | "rank 0's weights after train_uneven are one ..." |
| uneven: gradients never all-reduced | "no rank all-reduced a gradient with ranks with 2 and 4 batches ..." |
| uneven: the round after the last batch divided by a count of 0 | "every rank's weights were finite ... NaN ..." |
| uneven: the stream read ahead, not one batch per step | "with ..., rank 1 had taken 3 batches past the one ..." |
| uneven: gradients summed over part of the ranks, not all | "... ended with 2 different models: ranks 0 and 1 ..." |
| uneven: join() called on a model that is not wrapped in DDP | "join() is a method of DistributedDataParallel" |
| a collective's dtype differs between ranks | "rank 0's collective 3 is all_reduce of int64[1] ... float32[1]" |
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ...grader.diagnosis import diagnose
from ...grader.launches import each_world_size, launch_files, launch_timeout, side_by_side
from ...grader.parity import parity
from ...grader.registry import Exercise
from ...grader.report import ExerciseReport, Verdict, criterion, failed, passed
from .causes import (KNOWN_ERRORS, barrier_for_all_reduce, count_not_reduced, divided_by_zero_count, grads_not_reduced,
                     grads_skipped_on_empty, no_all_reduce, no_update, parted, ranks_disagree, skipped_everywhere,
                     skipped_on_empty, stale_gradient, zero_gradients)
from .observations import RankObservation, Run
from .probes import ATOL, RTOL, STEPS, rank_main, rank_main_wide
from .uneven import causes as uneven_causes  # its @mistake functions are the check's
from .uneven import criteria as uneven_criteria

__all__ = ["CRITERIA", "EXERCISE", "KNOWN_ERRORS", "UNEVEN_CRITERIA", "WIDE", "WIDE_CRITERIA", "WORLD", "grade"]

EXERCISE = Exercise(number=9, name="hang", filename="ex09_hang.py", max_score=10, time_limit=90)
WORLD = 2
WIDE = 4   # train_uneven alone, in a second launch


@criterion("[W={world}] the job finishes: every rank makes the same collectives, in order", points=3)
def finishes(run: Run) -> Verdict:
    if errors := [(r.rank, r.error, r.where) for r in run.ranks if r.error]:
        rank, error, where = errors[0]
        return failed(f"train raised on rank {rank}" + (f" at {where}" if where else "") + f": {error}")
    if run.mismatch is None:
        return passed()
    return failed(diagnose([uneven_causes.dtypes_differ, barrier_for_all_reduce, skipped_on_empty,
                            grads_skipped_on_empty], run)
                  or f"the job hangs: {parted(run)}")


@criterion("[W={world}] the same all-reduces on every rank, each step", points=2, requires=[finishes])
def same_collectives(run: Run) -> Verdict:
    counts = [r.counts for r in run.ranks]
    if not counts[0].get("all-reduce"):
        return failed(diagnose([no_all_reduce], run) or f"rank 0 made no all-reduce ({counts[0]})")
    if any(c != counts[0] for c in counts):
        return failed(f"the ranks made different collectives: {counts}")
    per_step = [[len(run.at_step(r, s)) for s in range(STEPS)] for r in range(run.world)]
    if any(p != per_step[0] for p in per_step):
        return failed(f"the ranks' all-reduces per step differ: {per_step}")
    return passed(f"{counts[0]} on every rank", all_reduces_per_rank=counts[0]["all-reduce"])


@criterion("[W={world}] matches one process on the global batches", points=3, requires=[finishes])
def matches_reference(run: Run) -> Verdict:
    diffs = [parity(r.final, run.reference, rtol=RTOL, atol=ATOL) for r in run.ranks]
    worst = max(diffs, key=lambda d: d.max_abs_diff)
    measured = {"max_abs_diff_vs_reference": worst.max_abs_diff}
    if all(d.ok for d in diffs):
        return passed(f"max abs difference {worst.max_abs_diff:.2g}", **measured)
    return failed(diagnose([no_all_reduce, grads_not_reduced, divided_by_zero_count, zero_gradients,
                            skipped_everywhere, stale_gradient, count_not_reduced, no_update, ranks_disagree], run)
                  or f"the weights differ from one process's SGD on the mean loss over every rank's kept samples "
                  f"(max abs difference {worst.max_abs_diff:.3g} in '{worst.worst}', tolerance rtol={RTOL}, "
                  f"atol={ATOL}): one process steps by lr x (the sum of every rank's kept samples' gradients) / "
                  "(the number of kept samples on all ranks)", **measured)


@criterion("[W={world}] a rank with nothing to keep takes part with a zero gradient", points=2,
           requires=[finishes])
def empty_rank_takes_part(run: Run) -> Verdict:
    for rank, step in run.empty_steps():
        theirs = [len(run.at_step(o, step)) for o in range(run.world) if o != rank]
        mine = len(run.at_step(rank, step))
        if mine == 0 or mine != max(theirs):
            return failed(diagnose([no_all_reduce, skipped_everywhere], run)
                          or f"rank {rank} kept no sample at step {step} and made {mine} all-reduces there, the "
                          f"others {theirs}: it takes part in every all-reduce of the step")
        if any(c.input_abs > 0 for c in run.at_step(rank, step)):
            return failed(diagnose([skipped_everywhere, stale_gradient], run)
                          or f"rank {rank} sent non-zero values at step {step}")
    return passed()


UNEVEN_CRITERIA = uneven_criteria.CRITERIA
CRITERIA = [finishes, same_collectives, matches_reference, empty_rank_takes_part, *UNEVEN_CRITERIA]
WIDE_CRITERIA = uneven_criteria.WIDE_CRITERIA


def grade(paths: Sequence[Path]) -> list[ExerciseReport]:
    """Grade the files at ``paths``: one launch on 2 ranks (both parts), one on 4 (``train_uneven`` alone); one
    report each. On the CPU the two launches run at once (most of a launch is its ranks waiting on each other and on
    process starts, which they overlap on the cores); on a GPU machine one after the other."""
    reports = [EXERCISE.new_report() for _ in paths]
    mains, judged = {WORLD: rank_main, WIDE: rank_main_wide}, {WORLD: CRITERIA, WIDE: WIDE_CRITERIA}
    share = 1 if side_by_side() else 1 / len(mains)

    def launch(world: int) -> tuple[list, float]:
        return launch_files(mains[world], paths, world=world,
                            timeout=launch_timeout(EXERCISE, files=len(paths), share=share))

    for world, (runs, wall_s) in each_world_size(launch, list(mains)):
        for report, ranks in zip(reports, runs):
            report.judge(judged[world], Run([RankObservation.from_wire(r) for r in ranks]), world=world)
            report.measurements["launch_s" if world == WORLD else f"W{world}_launch_s"] = round(wall_s, 2)
    return [r.scale_to() for r in reports]
