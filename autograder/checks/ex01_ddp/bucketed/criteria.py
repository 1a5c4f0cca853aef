"""Exercise 1's part 2, ``BucketedDDP``: its criteria, judged in the grading process from every rank's
:class:`~.observations.Bucketed`, each cap's run against one process (``reference``). The mistakes they name
(``causes``) are in the table of ``ex01_ddp``'s docstring.
"""
from __future__ import annotations

from ....grader.diagnosis import diagnose
from ....grader.parity import parity
from ....grader.report import Verdict, criterion, failed, passed
from ..observations import Run
from .causes import (BUCKET_CAUSES, OVERLAP_CAUSES, _classify, _names, all_reduces, divided_twice, not_broadcast,
                     not_reset, not_waited, not_written_back, reduced_too_early, summed, unused_names,
                     unused_never_launched, unused_unnamed)
from .observations import STEPS, CapRun, expected_buckets, make_model
from .reference import bucket_sizes, reference

RTOL, ATOL = 1e-4, 1e-5


def _caps(run: Run) -> list[list[CapRun]]:
    """Each cap's runs, every rank's, in rank order (the caps a rank reached)."""
    per_rank = [r.bucketed.runs if r.bucketed else [] for r in run.ranks]
    return [list(runs) for runs in zip(*per_rank)]


def _error(run: Run) -> str | None:
    """The first error of part 2 (its runs before the unused-parameter one), on the lowest rank that raised."""
    for r in run.ranks:
        for cap_run in (r.bucketed.runs if r.bucketed else []):
            if cap_run.not_implemented:
                return "not implemented yet" + (f" ({cap_run.where})" if cap_run.where else "")
            if cap_run.error:
                return f"BucketedDDP raised on rank {r.rank} (bucket_cap_mb={cap_run.cap_bytes / 2**20:.6g}): " \
                       f"{cap_run.error}"
    return None


@criterion("[W={world}] BucketedDDP trains as one process on the whole batch", points=2, trace=False)
def bucketed_matches(run: Run) -> Verdict:
    if error := _error(run):
        return failed(error)
    for runs in _caps(run):
        cap = runs[0].cap_bytes
        if message := not_broadcast(runs, run.world) or not_waited(runs, run.world):
            return failed(message)
        ref = reference(runs[0].start, run.world, STEPS)
        grads = ref["grads"]
        for r, cap_run in enumerate(runs):
            kinds = _classify(cap_run, grads, run.world)
            if set(kinds) != {"mean"}:
                wrong = {k: v for k, v in kinds.items() if k != "mean"}
                return failed(diagnose([reduced_too_early, summed, divided_twice, not_written_back], cap_run, grads,
                                       run.world) or
                              f"at the first step (bucket_cap_mb={cap / 2**20:.6g}) rank {r}'s .grad differed from "
                              f"the mean gradient of one process on the whole batch: {_describe(wrong)}")
            final = parity(cap_run.final, ref["final"], rtol=RTOL, atol=ATOL)
            if not final:
                return failed(f"after {STEPS} steps (bucket_cap_mb={cap / 2**20:.6g}) rank {r}'s weights differed "
                              f"from one process's by {final.max_abs_diff:.3g} in '{final.worst}'")
    return passed()


def _describe(kinds: dict[str, list[str]]) -> str:
    words = {"own": "held this rank's own gradient", "sum": "held the sum over the ranks", "none": "was None",
             "fraction": "held the mean divided by the world size again",
             "other": "held neither this rank's gradient nor the mean"}
    return "; ".join(f"{_names(names)} {words[kind]}" for kind, names in kinds.items())


@criterion("[W={world}] one all-reduce per bucket, the buckets the cap implies", points=2, trace=False)
def bucketed_buckets(run: Run) -> Verdict:
    if error := _error(run):
        return failed(f"not checked: {error.split(':')[0]} (see the first criterion of BucketedDDP)")
    for runs in _caps(run):
        cap = runs[0].cap_bytes
        for i, events in enumerate(runs[0].steps):
            if others := [e for e in events if e.kind == "collective"]:
                return failed(f"a {others[0].other} ran in step {i}'s backward or finish (at {others[0].where}): "
                              "the only collectives are one all-reduce per bucket")
            sizes = [e.numel for e in all_reduces(events)]
            if i > 0 and (message := not_reset(runs[0])):
                return failed(message)
            if sizes != bucket_sizes(cap):
                names = expected_buckets(make_model(0), cap)
                return failed(diagnose(BUCKET_CAUSES, sizes, cap) or
                              f"with bucket_cap_mb={cap / 2**20:.6g} ({cap} bytes) step {i}'s all-reduces moved "
                              f"{sizes} elements; the contract's buckets, in the order the backward completes them, "
                              f"hold {bucket_sizes(cap)}: " + "; ".join(f"({', '.join(b)})" for b in names))
    return passed()


@criterion("[W={world}] each bucket's all-reduce starts in the backward, asynchronously", points=1, trace=False)
def bucketed_overlap(run: Run) -> Verdict:
    if error := _error(run):
        return failed(f"not checked: {error.split(':')[0]} (see the first criterion of BucketedDDP)")
    first_layer = [n for n, _ in make_model(0)[0].named_parameters(prefix="0")]
    one = 0  # caps where the code made a single all-reduce a step: nothing to overlap, whatever the cap implies
    for runs in _caps(run):
        if len(bucket_sizes(runs[0].cap_bytes)) > 1 and runs[0].steps:
            if _one_bucket_in_backward(runs[0].steps[0]):  # its bucket plan is wrong: the buckets' criterion says so
                one += 1
                continue
            if message := diagnose(OVERLAP_CAUSES, runs[0].steps[0], first_layer):
                return failed(message)
    return passed("not judged at a cap where one all-reduce took every gradient (see the buckets' criterion)"
                  if one else "")


def _one_bucket_in_backward(events: list) -> bool:
    """A step whose one all-reduce, of every gradient, was launched asynchronously during the backward (before
    finish_gradient_synchronization): launched as soon as its bucket's last gradient was ready, as it should be."""
    reduces = all_reduces(events)
    finish = next((i for i, e in enumerate(events) if e.kind == "finish"), len(events))
    return len(reduces) == 1 and reduces[0].is_async and events.index(reduces[0]) < finish


@criterion("[W={world}] a parameter unused in the forward is handled or named", points=1, trace=False)
def bucketed_unused(run: Run) -> Verdict:
    if error := _error(run):
        return failed(f"not checked: {error.split(':')[0]} (see the first criterion of BucketedDDP)")
    runs = [r.bucketed.unused for r in run.ranks]
    if any(u.error for u in runs):
        if message := unused_unnamed(runs):
            return failed(message)
        return passed(f"named: {runs[0].error}")
    # Gradients read while their all-reduce may still be running are a race's outcome: judged on them, the same
    # code would score differently from one grading to the next
    if race := next((m for rs in [*_caps(run), runs] if rs[0].steps and (m := not_waited(rs, run.world))), None):
        return failed(f"not judged: {race}")
    first = run.ranks[0].bucketed.runs[0]   # how this code treats gradients when every one is used
    main = set(_classify(first, reference(first.start, run.world, STEPS)["grads"], run.world))
    if len(main) != 1:
        return failed(f"not checked: needs '{bucketed_matches.rule.name.format(world=run.world)}' first")
    ref = reference(runs[0].start, run.world, 1, unused=True)["grads"]
    if message := unused_never_launched(runs, ref, run.world, main.pop()):
        return failed(message)
    if not bucketed_matches(run).ok:
        return passed("its gradients were treated as every used parameter's")
    for r, u in enumerate(runs):
        wrong = {k: v for k, v in _classify(u, ref, run.world).items() if k != "mean"}
        if wrong:
            return failed(f"with a parameter the forward does not use ({_names(unused_names())}), rank {r}'s "
                          f"gradients at the step: {_describe(wrong)}")
    return passed()


CRITERIA = [bucketed_matches, bucketed_buckets, bucketed_overlap, bucketed_unused]
