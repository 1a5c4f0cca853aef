"""Part 2's likely mistakes (``BucketedDDP``), tested against what the ranks observed.

Each takes one cap's :class:`~.observations.CapRun` of every rank (``runs``, in rank order) with the world size,
and returns the learner-facing message, built from the run's events, or ``None``.
"""
from __future__ import annotations

import torch

from ....grader.diagnosis import mistake
from ....grader.parity import parity
from .observations import CapRun, Event, expected_buckets, make_model
from .reference import bucket_sizes

RTOL, ATOL = 1e-5, 1e-6


def all_reduces(events: list[Event]) -> list[Event]:
    return [e for e in events if e.kind == "all_reduce"]


def _names(names: list[str]) -> str:
    return ", ".join(f"'{n}'" for n in names)


@mistake("parameters not broadcast from rank 0")
def not_broadcast(runs: list[CapRun], world: int) -> str | None:
    frozen = {n for n, p in make_model(0).named_parameters() if not p.requires_grad}
    for r, run in enumerate(runs[1:], 1):
        start = parity(run.start, runs[0].start, rtol=0, atol=0)
        if not start:
            apart = {n for n in run.start if not torch.equal(run.start[n], runs[0].start[n])}
            if apart <= frozen:
                return (f"after BucketedDDP(...) rank {r}'s {_names(sorted(apart))} differed from rank 0's (by "
                        f"{start.max_abs_diff:.3g}), a parameter that needs no gradient, and the others were rank 0's: "
                        "only the trainable parameters were broadcast. A frozen parameter is part of the model too: "
                        "broadcast every parameter of module.parameters() from rank 0, whatever its requires_grad")
            return (f"after BucketedDDP(...) rank {r}'s weights differed from rank 0's (by {start.max_abs_diff:.3g} in "
                    f"'{start.worst}'): each rank built its model from its own seed, and nothing broadcast rank 0's; "
                    "dist.broadcast every parameter from rank 0 in __init__")
    return None


@mistake("all-reduce not waited for")
def not_waited(runs: list[CapRun], world: int) -> str | None:
    pending = [e for e in all_reduces(runs[0].steps[0] if runs[0].steps else []) if e.is_async and not e.waited]
    if not pending:
        return None
    return (f"finish_gradient_synchronization returned while {len(pending)} asynchronous all-reduce(s) had never "
            f"been waited on (the first started at {pending[0].where}): the optimizer may step with gradients not "
            "yet reduced; call wait() on each bucket's Work before returning")


def _classify(run: CapRun, ref: dict, world: int) -> dict[str, list[str]]:
    """Each parameter's gradient at the step, against the reference: "mean", "own" (this rank's own gradient),
    "sum" (world x the mean), "fraction" (the mean / world), "none" (no .grad), "other"."""
    out: dict[str, list[str]] = {}
    for name, want in ref.items():
        got, own = run.stepped.get(name), run.local.get(name)
        if want is None:
            continue
        if got is None:
            kind = "none"
        elif torch.allclose(got, want, rtol=RTOL, atol=ATOL):
            kind = "mean"
        elif own is not None and torch.equal(got, own):
            kind = "own"
        elif torch.allclose(got, world * want, rtol=RTOL, atol=ATOL):
            kind = "sum"
        elif torch.allclose(got, want / world, rtol=RTOL, atol=ATOL):
            kind = "fraction"
        else:
            kind = "other"
        out.setdefault(kind, []).append(name)
    return out


@mistake("gradients summed, not averaged")
def summed(run: CapRun, ref: dict, world: int) -> str | None:
    kinds = _classify(run, ref, world)
    if set(kinds) != {"sum"}:
        return None
    return (f"every .grad held {world}x the mean gradient when the optimizer stepped: the all-reduce sums over the "
            f"{world} ranks; divide by the world size")


@mistake("gradients divided by the world size twice")
def divided_twice(run: CapRun, ref: dict, world: int) -> str | None:
    if set(_classify(run, ref, world)) != {"fraction"}:
        return None
    return (f"every .grad held 1/{world} of the mean gradient when the optimizer stepped, the mean divided by the "
            f"world size ({world}) once more: divide the all-reduced sum by the world size once")


@mistake("a bucket all-reduced before its gradients were accumulated")
def reduced_too_early(run: CapRun, ref: dict, world: int) -> str | None:
    numel = {n: p.numel() for n, p in make_model(0).named_parameters()}
    accumulated = reduced = 0
    for event in run.steps[0] if run.steps else []:
        if event.kind == "grad":
            accumulated += numel.get(event.name, 0)
        elif event.kind == "all_reduce":
            reduced += event.numel
            if reduced > accumulated:
                return (f"the all-reduce at {event.where} started when the gradients accumulated in this backward "
                        f"held {accumulated} elements, fewer than the {reduced} all-reduced by then: it reduced .grad "
                        "values not yet written (a Tensor.register_hook hook runs before .grad is accumulated); "
                        "start a bucket's all-reduce from register_post_accumulate_grad_hook once all of its "
                        "gradients are in")
    return None


@mistake("reduced gradients not written back")
def not_written_back(run: CapRun, ref: dict, world: int) -> str | None:
    kinds = _classify(run, ref, world)
    if "own" not in kinds or not all_reduces(run.steps[0]):
        return None
    n = len(all_reduces(run.steps[0]))
    return (f"{n} all-reduce(s) ran, but the .grad of {_names(kinds['own'])} still held this rank's own gradient "
            "when the optimizer stepped: write the reduced (and averaged) values back into each .grad (an "
            "all-reduce of torch.cat(...) reduces a copy)")


@mistake("one all-reduce per parameter")
def per_parameter(sizes: list[int], cap: int, unused: bool = False) -> str | None:
    expected = bucket_sizes(cap, unused=unused)
    every = bucket_sizes(1, unused=unused)
    if sizes != every or expected == every:
        return None
    return (f"{len(sizes)} all-reduces per step, one per parameter; a cap of {cap} bytes makes {len(expected)} "
            "buckets: group the gradients into buckets and all-reduce each bucket once")


@mistake("buckets filled in registration order")
def forward_order(sizes: list[int], cap: int, unused: bool = False) -> str | None:
    if sorted(sizes) != sorted(bucket_sizes(cap, unused=unused, forward=True)) or \
            sorted(sizes) == sorted(bucket_sizes(cap, unused=unused)):
        return None
    return (f"the all-reduces moved {sizes} elements: buckets filled in the order of module.parameters(); DDP fills "
            "them in reverse, the order in which the backward produces the gradients, so that the first bucket is "
            "ready while most of the backward is still to run")


@mistake("bucket_cap_mb read as 10**6 bytes")
def decimal_megabytes(sizes: list[int], cap: int, unused: bool = False) -> str | None:
    if sizes != bucket_sizes(cap * 10**6 / 2**20, unused=unused) or sizes == bucket_sizes(cap, unused=unused):
        return None
    return (f"the all-reduces moved {sizes} elements, the buckets of a {cap * 10**6 / 2**20:.0f}-byte cap: "
            f"bucket_cap_mb={cap / 2**20:.6g} is in MiB, {cap} bytes (bucket_cap_mb * 2**20), as DDP's")


@mistake("bucket closed past the cap")
def closed_past_cap(sizes: list[int], cap: int, unused: bool = False) -> str | None:
    if sizes != bucket_sizes(cap, unused=unused, past=True) or sizes == bucket_sizes(cap, unused=unused):
        return None
    return (f"the all-reduces moved {sizes} elements: a bucket was closed only once its bytes exceeded the cap of "
            f"{cap}; it closes as soon as they reach it (>=), the contract's (and DDP's) rule")


BUCKET_CAUSES = [per_parameter, forward_order, decimal_megabytes, closed_past_cap]


@mistake("buckets not readied for the next backward")
def not_reset(run: CapRun) -> str | None:
    steps = [[e.numel for e in all_reduces(events)] for events in run.steps]
    expected = bucket_sizes(run.cap_bytes)
    later = next((i for i, sizes in enumerate(steps[1:], 1) if sizes != expected), None)
    if not steps or steps[0] != expected or later is None:
        return None
    return (f"step 0's all-reduces were the buckets the cap implies ({expected} elements), step {later}'s moved "
            f"{steps[later]}: finish_gradient_synchronization must ready the buckets for the next backward (what "
            "counts each bucket's gradients, and what it launched)")


@mistake("a synchronous all-reduce")
def synchronous(events: list[Event], first_layer: list[str]) -> str | None:
    sync = [e for e in all_reduces(events) if not e.is_async]
    if not sync:
        return None
    return (f"the all-reduce at {sync[0].where} was synchronous (async_op not set): the backward waited for each "
            "one to finish; start it with async_op=True and wait on its Work in finish_gradient_synchronization")


@mistake("an all-reduce waited on inside the backward")
def waited_in_backward(events: list[Event], first_layer: list[str]) -> str | None:
    held = [e for e in all_reduces(events) if e.waited_in_backward]
    if not held:
        return None
    return (f"the all-reduce started at {held[0].where} was waited on before loss.backward() returned: the backward "
            "stopped until it finished, so nothing overlapped it; wait on the Works in finish_gradient_synchronization")


@mistake("all-reduces only after the backward")
def after_backward(events: list[Event], first_layer: list[str]) -> str | None:
    reduces = all_reduces(events)
    finish = next((i for i, e in enumerate(events) if e.kind == "finish"), len(events))
    late = [e for e in reduces if events.index(e) > finish]
    if not late:
        return None
    count = f"all {len(reduces)}" if len(late) == len(reduces) else f"{len(late)} of the {len(reduces)}"
    return (f"{count} all-reduces started after the backward, in finish_gradient_synchronization (the first at "
            f"{late[0].where}), although every bucket's gradients were ready inside it: start each bucket's "
            "from the hook of its last gradient, so that it overlaps the rest of the backward")


@mistake("buckets launched at the end of the backward")
def at_backward_end(events: list[Event], first_layer: list[str]) -> str | None:
    reduces = all_reduces(events)
    layer = [i for i, e in enumerate(events) if e.kind == "grad" and e.name in first_layer]
    if not reduces or not layer or events.index(reduces[0]) < min(layer):
        return None
    return (f"the first all-reduce started only after the first layer's gradients ({_names(first_layer)}) were "
            f"accumulated, at the end of the backward (at {reduces[0].where}): start a bucket as soon as its own "
            "last gradient is ready")


OVERLAP_CAUSES = [synchronous, waited_in_backward, after_backward, at_backward_end]


def unused_names() -> list[str]:
    return [n for n, _ in make_model(0, unused=True).named_parameters() if n.startswith("unused")]


def _what() -> str:
    return f"a parameter the forward does not use ({_names(unused_names())}: no gradient, and its hook never runs)"


@mistake("an unused parameter raised an error that does not name it")
def unused_unnamed(runs: list[CapRun]) -> str | None:
    raised = [(r, u.error) for r, u in enumerate(runs) if u.error and not any(n in u.error for n in unused_names())]
    if not raised:
        return None
    r, error = raised[0]
    return (f"with {_what()}, BucketedDDP raised on rank {r}: {error}; either launch the buckets left in "
            "finish_gradient_synchronization, counting a missing gradient as zeros, or raise an error whose message "
            "names the parameter")


@mistake("the bucket of an unused parameter never launched")
def unused_never_launched(runs: list[CapRun], ref: dict, world: int, kind: str) -> str | None:
    """``kind``: how the learner's step treats every gradient when all are used (its main run's :func:`_classify`):
    a used parameter that kept this rank's own gradient here, and only here, was never all-reduced."""
    run = runs[0]
    missed = _classify(run, ref, world).get("own", []) if kind != "own" else []
    if not missed:
        return None
    sizes = [e.numel for e in all_reduces(run.steps[0])] if run.steps else []
    buckets = expected_buckets(make_model(0, unused=True), run.cap_bytes)
    holding = [b for b in buckets if set(missed) <= set(b)]
    which = f" (their bucket, ({', '.join(holding[0])}), was never all-reduced)" if holding else ""
    return (f"with {_what()}, {_names(missed)} kept this rank's own gradient when the optimizer stepped "
            f"({len(sizes)} all-reduce(s) ran){which}: launch the buckets left in finish_gradient_synchronization, "
            "counting a missing gradient as zeros")
