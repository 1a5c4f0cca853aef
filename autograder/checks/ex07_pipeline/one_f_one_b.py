"""Exercise 7's part 2, ``one_f_one_b_step`` (1F1B; Narayanan et al., 2021, PipeDream-Flush): its causes and
criteria, judged in the grading process from the same records as GPipe's part (a :class:`~.observations.Run`
of the 1F1B step) against the same unsplit model. The schedule is read from the order of the events the
grader's ``TimedStage`` logged and the sends the ``P2PSpy`` saw, both on one rank's clock (an order, never a
duration); the activations held, from the saved-tensor counter around the stage's layers.
"""
from __future__ import annotations

from distlab.lab.pipeline.timeline import schedule_orders

from ...grader.diagnosis import diagnose, mistake
from ...grader.parity import parity
from ...grader.report import Verdict, criterion, failed, passed
from .causes import (activation_without_grad, backward_order, count_scales, gradients_not_sent, last_loss,
                     loss_not_a_tensor, loss_not_detached, loss_not_scaled, mean_of_scaled, peers_gone, raised_first)
from .neighbours import any_source, fixed_peer
from .observations import Run
from .probes import MICRO

P = 2   # the stages the check runs first; its criteria hold again at ``Run.deeper``'s 4 (where the causes are not
# said: they are written for 2 stages, and the first point where the deeper run departs is said instead)
RTOL, ATOL = 1e-5, 1e-6


def order(step: Run, stage: int) -> list[str]:
    """The stage's forwards and backwards as ``"F0"``, ``"B0"``..., in the order they started."""
    return [f"{e.kind}{e.mb}" for e in sorted(step.ranks[stage].events, key=lambda e: e.start)]


def schedule_order(stage: int, p: int = P, schedule: str = "1f1b") -> list[str]:
    """``schedule``'s order of forwards and backwards on stage ``stage`` of ``p``, written as :func:`order` writes
    it."""
    return [f"{k}{i}" for k, i in schedule_orders(p, MICRO, schedule)[stage]]


def bound(stage: int, p: int = P) -> int:
    """Micro-batches stage ``stage`` of ``p`` may hold at once under 1F1B: ``min(p - s, m)``."""
    return min(p - stage, MICRO)


def _raised(step: Run) -> str:
    """What the ranks raised, at their lines: the GPipe part's ``_raised`` without its translations of known errors,
    which advise GPipe's order (all forwards, then all backwards)."""
    own, gone = raised_first(step)
    return "".join(f" (rank {r.rank} raised {r.error}" + (f" at {r.where}" if r.where else "") + ")"
                   for r in own) + peers_gone(gone)


@mistake("1F1B: blocking sends in the steady state: a deadlock")
def blocking_deadlock(step: Run, part: str = "") -> str | None:
    waiting = [step.pending(r) for r in (0, 1)]
    if not all(w is not None and w.op == "send" and not w.is_async for w in waiting):
        return None
    return (f"both stages were waiting in a blocking dist.send at once ({waiting[0].where}; {waiting[1].where}): in "
            "1F1B's steady state stage 0 sends a forward's activations while stage 1 sends a backward's gradient, "
            "and a blocking send waits for a receive its peer is not yet at. Post sends with dist.isend and wait "
            "on their Works before returning")


@mistake("1F1B: a loss returned on a stage other than the last")
def loss_on_every_stage(step: Run, part: str = "") -> str | None:
    early = next((r for r in step.ranks[:-1] if r.loss is not None or r.loss_type not in ("", "NoneType")), None)
    if early is None:
        return None
    kind = early.loss_type
    got = (f"{early.loss.reshape(-1)[0].item():.6g}" if early.loss is not None else
           f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}")
    return (f"rank {early.rank} returned {got}; only the last stage computes the loss, and the others return "
            "None")


@mistake("1F1B: a send's Work never waited on")
def send_not_waited(step: Run, part: str = "") -> str | None:
    for r in step.ranks:
        pending = [c for c in r.p2p if c.op == "send" and c.is_async and c.waited is False]
        if pending:
            return (f"stage {r.rank}'s {len(pending)} isend(s) (the first at {pending[0].where}) were never waited "
                    "on before one_f_one_b_step returned: a send is complete only once its Work is waited on; "
                    "wait on every one before returning")
    return None


@mistake("1F1B: GPipe's order instead")
def gpipe_order(step: Run, part: str = "") -> str | None:
    gpipe = schedule_order(0, P, "gpipe")
    if order(step, 0) != gpipe:
        return None
    return (f"stage 0 ran all {MICRO} forwards before its first backward ({' '.join(gpipe)}), GPipe's order, and so "
            f"held {MICRO} micro-batches' activations; 1F1B runs min(p - 1 - s, m) = {P - 1} warm-up forward(s) on "
            f"stage 0, then one forward and one backward in turn: {' '.join(schedule_order(0))}")


@mistake("1F1B: a backward before its forward")
def backward_first(step: Run, part: str = "") -> str | None:
    """A stage's backward raised with no forward waiting for it: the steady state's backward(i) first."""
    for r in step.ranks:
        runs = {k: sum(e.kind == k for e in r.events) for k in "FB"}
        if not r.error or " in backward" not in (r.where or "") or runs["F"] > runs["B"]:
            continue
        return (f"stage {r.rank}'s backward raised {r.error} at {r.where}, when the stage had run {runs['F']} "
                f"forward(s) and {runs['B']} backward(s): no forward was waiting for that backward. 1F1B runs each "
                f"micro-batch's forward before its backward; on stage {r.rank} of {len(step.ranks)}: "
                f"{' '.join(schedule_order(r.rank, len(step.ranks)))}")
    return None


@mistake("1F1B: the wrong number of warm-up forwards")
def wrong_warmup(step: Run, part: str = "") -> str | None:
    """Stage s's first backward comes after its warm-up forwards and the steady state's first forward: after
    min(p - s, m) forwards (the last stage has no warm-up: F0 B0 ...)."""
    p = len(step.ranks)
    for stage in range(p):
        got, want = order(step, stage), schedule_order(stage, p)
        first_b = next((i for i, a in enumerate(got) if a.startswith("B")), None)
        if got == want or first_b is None or len(got) != len(want):
            continue
        warm = min(p - 1 - stage, MICRO)
        if first_b != min(warm + 1, MICRO):
            return (f"stage {stage} ran {first_b} forward(s) before its first backward ({' '.join(got)}); 1F1B runs "
                    f"min(p - 1 - s, m) = {warm} warm-up forward(s) on stage {stage} of {p}, then one forward and "
                    f"one backward in turn, so {min(warm + 1, MICRO)} forwards come before the first backward: "
                    f"{' '.join(want)}")
    return None


@mistake("1F1B: activations kept past their backward")
def kept_past_backward(step: Run, part: str = "") -> str | None:
    p = len(step.ranks)
    for r in step.ranks:
        one = r.saved_per_microbatch
        if one and r.saved_peak > bound(r.rank, p) * one and order(step, r.rank) == schedule_order(r.rank, p):
            return (f"stage {r.rank} held {r.saved_peak:,} bytes of activations at once, {r.saved_peak / one:.3g} "
                    f"micro-batches' ({one:,} bytes each), although its forwards and backwards ran in 1F1B's "
                    f"order, which keeps at most min(p - s, m) = {bound(r.rank, p)}: a micro-batch's saved activations "
                    "outlived its backward (backward(retain_graph=True) keeps them)")
    return None


@mistake("1F1B: a send held back past the stage's next forward or backward")
def send_held_back(step: Run, part: str = "") -> str | None:
    p = len(step.ranks)
    # each stage sends a forward's activations to the next, and a backward's input gradient to the one before
    for stage, kind, peer in [(r.rank, k, r.rank + d) for r in step.ranks for k, d in (("F", 1), ("B", -1))]:
        if not 0 <= peer < p:
            continue
        events = sorted(step.ranks[stage].events, key=lambda e: e.start)
        sends = [c for c in step.ranks[stage].p2p if c.op == "send" and c.peer == peer]
        done = [e for e in events if e.kind == kind]
        for i, (event, send) in enumerate(zip(done, sends)):
            after = [e for e in events if e.start > event.start and e is not event]
            if after and send.t0 > after[0].start:
                thing = "activations" if kind == "F" else "input gradient"
                return (f"stage {stage} sent micro-batch {i}'s {thing} ({send.where}) only after its next "
                        f"{'forward' if after[0].kind == 'F' else 'backward'} ({after[0].kind}{after[0].mb}) had "
                        "started: the neighbour waits for it meanwhile; send each as soon as it is computed")
    return None


def _at(p: int) -> str:
    return f"at {p} stages, where stages {' and '.join(map(str, range(1, p - 1)))} each receive and send both ways"


def _deeper(step: Run, check, first: bool) -> str | None:
    """The deeper run's (``step.deeper``: 4 stages) failure of ``check`` (what it returns: the first point where the
    run departs, no cause), said as such; how the run ended its launch, in full where ``first`` (the first
    criterion), else pointing to it. ``None``: it holds there too, or no deeper run was made."""
    deep = step.deeper
    if deep is None:
        return None
    if isinstance(deep, str):  # said in full by the first criterion where it got that far (it held at 2 stages)
        return (f"{_at(4)}: one_f_one_b_step did not finish: {deep}" if first or _matches(step) else
                f"{_at(4)}: not checked: one_f_one_b_step did not finish (see '{ofob_matches.rule.name}')")
    why = fixed_peer(deep) or check(deep)
    return f"{_at(len(deep.ranks))}: {why}" if why else None


def _matches(step: Run) -> str | None:
    """The loss (on the last stage only) and every stage's gradients against the unsplit model's, with no cause."""
    last = step.ranks[-1]
    if last.loss is None or last.loss.numel() != 1 or not parity(last.loss.reshape(()), step.ref_loss, rtol=RTOL,
                                                                    atol=ATOL):
        got = "no loss" if last.loss is None or last.loss.numel() != 1 else f"loss {last.loss.item():.6g}"
        return (f"rank {last.rank} (the last stage) returned {got}; the unsplit model's is "
                f"{step.ref_loss.item():.6g}" + _raised(step))
    if why := loss_not_a_tensor(step) or loss_not_detached(step) or loss_on_every_stage(step):
        return why
    for r in step.ranks:
        if any(g is None for g in r.grads):
            return f"stage {r.rank}'s parameters have no gradient after the step" + _raised(step)
        names = [f"parameter {i} of stage {r.rank}" for i in range(len(r.grads))]
        same = parity(dict(zip(names, r.grads)), dict(zip(names, step.ref_grads[r.rank])), rtol=RTOL, atol=ATOL)
        if not same:
            return (f"stage {r.rank}'s gradients differ from the unsplit model's (max abs difference "
                    f"{same.max_abs_diff:.3g} in {same.worst})" + _raised(step))
    return None


def _sourced(step: Run) -> str | None:
    """A receive that named no src, said with whether the loss and gradients matched all the same; else
    :func:`_matches`."""
    matched = _matches(step)
    if why := any_source(step):
        return why + (" (in this run the loss and gradients matched all the same)" if matched is None else
                      f". In this run {matched}")
    return matched


def _out_of_order(step: Run) -> str | None:
    """The first stage whose forwards and backwards are not in 1F1B's order, with no cause."""
    p = len(step.ranks)
    for stage in range(p):
        got, want = order(step, stage), schedule_order(stage, p)
        if got != want:
            return (f"stage {stage} ran {' '.join(got) or 'nothing'}; 1F1B's order for stage {stage} of {p} with "
                    f"{MICRO} micro-batches is {' '.join(want)}" + _raised(step))
    return None


def _ordered(step: Run) -> str | None:
    """Each stage's forwards and backwards in 1F1B's order, each send at once and waited on, with no cause."""
    return _out_of_order(step) or send_held_back(step) or send_not_waited(step)


def _unfinished(step: Run) -> str | None:
    """Where some stage did not run every micro-batch forward and backward, or raised: nothing held is judged."""
    done = [(len([e for e in r.events if e.kind == k]) == MICRO) for r in step.ranks for k in "FB"]
    if all(done) and not any(r.error for r in step.ranks):
        return None
    stages = "both stages" if len(step.ranks) == 2 else "every stage"
    return f"not checked: the step did not run every micro-batch forward and backward on {stages}" + _raised(step)


def _over_bound(step: Run) -> str | None:
    """The first stage that held more than ``min(p - s, m)`` micro-batches' activations at once."""
    p = len(step.ranks)
    for r in step.ranks:
        one = r.saved_per_microbatch
        if one and r.saved_peak > bound(r.rank, p) * one:
            return (f"stage {r.rank} held {r.saved_peak:,} bytes of activations at once, {r.saved_peak / one:.3g} "
                    f"micro-batches' ({one:,} bytes each); 1F1B keeps at most min(p - s, m) = {bound(r.rank, p)} "
                    f"there: run micro-batch i's backward before the forward of micro-batch i + {bound(r.rank, p)}")
    return None


def _held(step: Run) -> str | None:
    """Each stage's activations held at once within ``min(p - s, m)`` micro-batches'."""
    return _unfinished(step) or _over_bound(step)


@criterion("[1F1B] loss and gradients match the unsplit model", points=2, trace=False)
def ofob_matches(step: Run) -> Verdict:
    loss = step.ranks[1].loss
    if loss is None or loss.numel() != 1 or not parity(loss.reshape(()), step.ref_loss, rtol=RTOL, atol=ATOL):
        got = "no loss" if loss is None or loss.numel() != 1 else f"loss {loss.item():.6g}"
        return failed(diagnose([blocking_deadlock, backward_first, activation_without_grad, gradients_not_sent,
                                last_loss, mean_of_scaled, count_scales, loss_not_scaled], step, "loss") or
                      f"rank 1 (the last stage) returned {got}; the unsplit model's is {step.ref_loss.item():.6g}"
                      + _raised(step))
    if message := loss_not_a_tensor(step) or loss_not_detached(step) or loss_on_every_stage(step):
        return failed(message)
    for stage in (0, 1):
        grads = step.ranks[stage].grads
        if any(g is None for g in grads):
            return failed(diagnose([blocking_deadlock, activation_without_grad, gradients_not_sent], step, "1f1b") or
                          f"stage {stage}'s parameters have no gradient after the step" + _raised(step))
        names = [f"parameter {i} of stage {stage}" for i in range(len(grads))]
        p = parity(dict(zip(names, grads)), dict(zip(names, step.ref_grads[stage])), rtol=RTOL, atol=ATOL)
        if not p:
            why = diagnose([count_scales, loss_not_scaled, backward_order], step, f"grads{stage}")
            return failed(f"stage {stage}'s gradients differ from the unsplit model's (max abs difference "
                          f"{p.max_abs_diff:.3g} in {p.worst})" + (f": {why}" if why else _raised(step)))
    if deeper := _deeper(step, _sourced, first=True):
        return failed(deeper)
    return passed(f"loss {step.ref_loss.item():.5g}" + (f", at {P} and {len(step.deeper.ranks)} stages"
                                                        if isinstance(step.deeper, Run) else ""))


@criterion("[1F1B] each stage runs 1F1B's order and sends each result at once", points=2, trace=False)
def ofob_order(step: Run) -> Verdict:
    if why := _out_of_order(step):
        return failed(diagnose([blocking_deadlock, backward_first, gpipe_order, wrong_warmup], step, "1f1b") or why)
    if message := send_held_back(step) or send_not_waited(step) or _deeper(step, _ordered, first=False):
        return failed(message)
    return passed(" | ".join(" ".join(order(step, s)) for s in (0, 1)) + (
        f"; and at {len(step.deeper.ranks)} stages" if isinstance(step.deeper, Run) else ""))


@criterion("[1F1B] stage s keeps at most min(p - s, m) micro-batches' activations", points=1, trace=False)
def ofob_memory(step: Run) -> Verdict:
    measured = {f"one_f_one_b_stage{r.rank}_saved_peak_bytes": r.saved_peak for r in step.ranks}
    if why := _unfinished(step):
        return failed(why)
    if message := kept_past_backward(step) or _over_bound(step) or _deeper(step, _held, first=False):
        return failed(message, **measured)
    return passed(", ".join(f"stage {r.rank}: {r.saved_peak / max(r.saved_per_microbatch, 1):.3g} micro-batches"
                            for r in step.ranks) + (f"; and within min(p - s, m) at {len(step.deeper.ranks)} stages"
                                                    if isinstance(step.deeper, Run) else ""), **measured)


CRITERIA = [ofob_matches, ofob_order, ofob_memory]
