"""Exercise 9's part 2, ``train_uneven``: its criteria, judged in the grading process from every rank's
:class:`~.observations.ScenarioRun` of each scenario (:data:`~.observations.SCENARIOS`), against one process that
replays the global stream of batches (``Scenario.reference``), at every step (the weights when each batch went
through the forward) and at the end; at W=4 (:data:`WIDE_CRITERIA`) the ``WIDE`` scenario alone. The mistakes
they name (``causes``) are in the table of ``ex09_hang``'s docstring.
"""
from __future__ import annotations

from ....grader.diagnosis import diagnose, translate
from ....grader.parity import parity
from ....grader.report import Verdict, criterion, failed, passed
from .causes import (ATOL, RTOL, UNEVEN_ERRORS, divided_by_all, dtypes_differ, left_early, nan_after_last, read_ahead,
                     no_gradient_sync, partial_sum, parted, scaled_everywhere, stale_on_exhausted, stopped_at_shortest,
                     stops_updating)
from .observations import SCENARIOS, WIDE, Scenario, label

# The causes each judgement asks for, most specific first.
STEP_CAUSES = [partial_sum, no_gradient_sync, divided_by_all, scaled_everywhere, stale_on_exhausted]
FINAL_CAUSES = [nan_after_last, stops_updating, *STEP_CAUSES]
FINISHES = "[W={world}] uneven batches: no rank leaves the others waiting, whichever runs out first"


def scenarios(run) -> dict[str, Scenario]:
    """Each scenario's run, every rank's record of it (``run``: the file's :class:`~..observations.Run`)."""
    names = [s.scenario for s in run.ranks[0].uneven]
    return {name: Scenario(name, [r.uneven[i] for r in run.ranks]) for i, name in enumerate(names)}


def _unwritten(run) -> str | None:
    """"not implemented yet ..." when ``train_uneven`` still raises NotImplementedError (or is missing)."""
    stub = next((r for r in run.ranks for s in r.uneven if s.not_implemented), None)
    if stub is None:
        return None
    first = next(s for s in stub.uneven if s.not_implemented)
    return "not implemented yet: train_uneven " + (f"raised NotImplementedError at {first.where}" if first.where
                                                   else f"is missing ({first.error})")


@criterion(FINISHES, points=3, trace=False)
def uneven_finishes(run) -> Verdict:
    if unwritten := _unwritten(run):
        return failed(unwritten)
    for s in scenarios(run).values():
        if errors := [r for r in s.ranks if r.error]:
            r = errors[0]
            known = translate(r.error, UNEVEN_ERRORS)
            return failed(f"train_uneven raised on rank {r.rank} with {s.label}" + (f" at {r.where}" if r.where else "")
                          + f": {known + ' (' + r.error + ')' if known else r.error}")
        if s.mismatch is not None:
            return failed(diagnose([dtypes_differ, left_early], s) or f"the job hangs with {s.label}: {parted(s)}")
    return passed(f"{len(run.ranks[0].uneven)} cases, every rank's collectives matched until the last step")


def _matches(run, name: str) -> Verdict:
    """Scenario ``name``'s weights at every batch's forward and at the end against one process's."""
    if unwritten := _unwritten(run):
        return failed(unwritten)
    s, key = scenarios(run)[name], f"uneven_{name}_max_abs_diff"
    if not s.finished:
        return failed(f"not checked: needs '{FINISHES.format(world=s.world)}' with {s.label} first")
    for r in s.ranks:
        if missing := [i for i in range(r.batches) if i not in r.forwarded]:
            return failed(diagnose([stopped_at_shortest], s) or
                          f"rank {r.rank} never ran its batch {missing[0]} through the model ({len(r.forwarded)} of "
                          f"its {r.batches} batches went through its forward): every batch is learnt from, once")
    worst = 0.0
    for step in range(s.steps):
        for r in s.ranks:
            if step not in r.forwarded:
                continue
            p = parity(r.forwarded[step], s.reference[step], rtol=RTOL, atol=ATOL)
            worst = max(worst, p.max_abs_diff)
            if not p.ok:
                before = len(s.active(step - 1))
                return failed(diagnose(STEP_CAUSES, s) or
                              f"when rank {r.rank}'s batch {step} went through the forward, its weights differed from "
                              f"one process's after {step} steps (max abs difference {p.max_abs_diff:.3g} in "
                              f"'{p.worst}', tolerance rtol={RTOL}, atol={ATOL}): step {step - 1}, when {before} "
                              f"of the {s.world} ranks had a batch, was not one process's SGD step on the mean loss "
                              "over its samples", **{key: p.max_abs_diff})
    for r in s.ranks:
        p = parity(r.final, s.reference[-1], rtol=RTOL, atol=ATOL)
        worst = max(worst, p.max_abs_diff)
        if not p.ok:
            return failed(diagnose(FINAL_CAUSES, s) or
                          f"rank {r.rank}'s weights after train_uneven differ from one process's after all {s.steps} "
                          f"steps (max abs difference {p.max_abs_diff:.3g} in '{p.worst}', tolerance rtol={RTOL}, "
                          f"atol={ATOL}): every rank returns the weights of the last step", **{key: p.max_abs_diff})
    return passed(f"{s.steps} steps, every batch's forward and the end: max abs difference {worst:.2g}",
                  **{key: worst})


@criterion(f"[W={{world}}] uneven batches ({label(SCENARIOS['uneven'])}, the longest not rank 0): one process's SGD "
           "on the global stream, at every step", points=3, trace=False)
def uneven_matches(run) -> Verdict:
    return _matches(run, "uneven")


@criterion(f"[W={{world}}] a rank with no batch at all ({label(SCENARIOS['no_batch'])}): every rank ends as one "
           "process", points=2, trace=False)
def uneven_no_batch(run) -> Verdict:
    return _matches(run, "no_batch")


@criterion(f"[W={{world}}] equal lengths ({label(SCENARIOS['equal'])}): one process's SGD, one step per batch",
           points=2, trace=False)
def uneven_equal(run) -> Verdict:
    matched = _matches(run, "equal")
    ahead = next((why for s in scenarios(run).values() if (why := read_ahead(s))), None)  # "one step per batch"
    return failed(ahead) if matched.ok and ahead else matched


@criterion(f"[W={{world}}] {label(WIDE['wide'])}: no rank leaves the others waiting, and every rank ends as one "
           "process's SGD on the global stream", points=3, trace=False)
def uneven_wide(run) -> Verdict:
    finished = uneven_finishes(run)
    return _matches(run, "wide") if finished.ok else finished


CRITERIA = [uneven_finishes, uneven_matches, uneven_no_batch, uneven_equal]
WIDE_CRITERIA = [uneven_wide]  # judged on the W=4 launch's run
