"""Exercise 7 check: a hand-written 2-stage GPipe step, then a 1F1B step, graded on 2 ranks and on 4.

The grader builds the stages itself and wraps each in a
:class:`distlab.lab.pipeline.timeline.TimedStage`, which logs every forward and backward
the learner's code makes it run (nothing the learner reports is trusted).
A fixed sleep at the start of each stage (:class:`distlab.lab.pipeline.timeline.Delay`)
makes the timeline independent of the machine's speed. The rank side
(``probes``) also records every send and recv (refusing, at the learner's line, one whose tensor is not
float64: the model and ``x`` are float64, so a buffer made without ``dtype=x.dtype`` shows, where gloo
would abort the process), whether each input of
stage 1 required grad, and the gradient that reached each output of stage 0;
each file runs in a process group of its own, so a send or recv with no
partner is caught and reported, not a hang. From the logs and the gradients
the ranks return, the grading process checks:

* parity with the unsplit model: the loss and every parameter's gradient
  (``assert_close``: micro-batch sums add in another order than one batch);
* the micro-batches each stage processed (count and size);
* overlap: stage 1 starts its first forward before stage 0 has finished
  all its forwards, the point of a pipeline.

Part 2 (``one_f_one_b``): the learner's ``one_f_one_b_step`` on the same stages, in a process group of its
own, with a saved-tensor counter around each stage's layers: parity; each stage's order of forwards and
backwards against 1F1B's, and each send before the stage's next forward or backward; and the activations
each stage held at once against ``min(p - s, m)`` micro-batches (Narayanan et al., 2021). Each of these holds
again at 4 stages (a launch of 4 ranks), where stages 1 and 2 receive and send both ways: a step written for 2
stages alone fails there, and the first point where that run departs is said.

| mistake | message |
|---|---|
| activations received without requires_grad_() | "stage 1's 4 received activations did not require grad, ..." |
| gradients not sent back to stage 0 | "stage 1 sent 0 of 4 gradients back to rank 0, so stage 0 ..." |
| one receive or send too many: a micro-batch past the last | "stage 1 waiting for micro-batch 4's activations ..." |
| both stages send (or receive) at once: a deadlock | "both stages were waiting in dist.send at once (...)" |
| a send or recv with no partner on the other stage | "rank 1 raised ValueError: ..., so rank 0 waited in dist.send" |
| no micro-batches: the whole batch in one forward | "stage 0 ran one forward of all 64 rows: ... x.chunk(4)" |
| split(n) instead of chunk(n): pieces of n rows | "stage 0 ran 16 forwards of 4 rows: x.split(4) cuts pieces ..." |
| a micro-batch count other than n_microbatches | "the loss is 4.00x the unsplit model's because ... 16 micro-batches" |
| loss not divided by the number of micro-batches | "stage 0's gradients are 4.00x the unsplit model's with 4 ..." |
| returned the last micro-batch's loss | "rank 1 returned 0.58, micro-batch 3's loss divided by 4; ..." |
| averaged the already-divided micro-batch losses | "rank 1 returned 0.576, 1/4 of the batch mean 2.31: ... sum them" |
| stage 1 backpropagates in another order than stage 0 | "... in the order [3, 2, 1, 0] ... in the order [0, 1, 2, 3]" |
| stage 0 backpropagates something other than the received gradient | "... micro-batch 0 is all ones ..." |
| activations sent after the forward loop | "stage 0 sent its first activations only after all 4 of its forwards" |
| a send/recv deadlock between the stages | (gloo's "Timed out waiting 3000ms for send") "both stages waited ..." |
| 1F1B: blocking sends in the steady state: a deadlock | "both stages were waiting in a blocking dist.send ..." |
| 1F1B: GPipe's order instead | "stage 0 ran all 4 forwards before its first backward (F0 F1 F2 F3 ...) ..." |
| 1F1B: a loss returned on a stage other than the last | "rank 0 returned 2.31; only the last stage computes ..." |
| 1F1B: a send's Work never waited on | "stage 0's 4 isend(s) (the first at ...) were never waited on ..." |
| 1F1B: the wrong number of warm-up forwards | "stage 0 ran 1 forward(s) before its first backward (F0 B0 ...)" |
| 1F1B: activations kept past their backward | "stage 0 held 40,960 bytes ..., although its forwards ..." |
| 1F1B: a send held back past the stage's next forward or backward | "stage 0 sent micro-batch 0's ... only after ..." |
| 1F1B: neighbours' ranks written as numbers (src=0, dst=1) | "at 4 stages, ...: stage 1 of 4 sent to rank 1 ..." |
| 1F1B: a backward before its forward | "stage 1's backward raised KeyError: 0 at ..., when the stage had run 0 ..." |
| 1F1B: a receive that names no src | "at 4 stages, ...: stage 1 of 4 received with no src (...), and took ..." |
| one receive buffer for every micro-batch | "stage 1 received all 4 micro-batches' activations into one tensor ..." |
| the loss returned still requires grad | "rank 1 returned the right loss, but still requiring grad (its ..." |
| the loss returned as a Python number, not a tensor | "rank 1 returned the right loss, but as a Python float ..." |
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch
from torch import nn

from distlab import LaunchError

from ...grader.diagnosis import diagnose, translate
from ...grader.launches import launch_timeout
from ...grader.parts import launch_parts, report_ended
from ...grader.parity import parity
from ...grader.registry import Exercise
from ...grader.report import ExerciseReport, Verdict, criterion, failed, passed
from .causes import (KNOWN_ERRORS, activation_without_grad, backward_order, count_scales, deadlock, one_too_many,
                     gradients_not_sent, ignores_received, last_loss, loss_not_a_tensor, loss_not_detached,
                     loss_not_scaled, mean_of_scaled, no_microbatches, one_buffer, peers_gone, pieces_of_n_rows,
                     raised_first, sent_after_loop, unmatched)
from . import one_f_one_b
from .observations import RankObservation, Run
from .probes import BATCH, MICRO, P2P_TIMEOUT_S, PARTS, STAGES, batch, model, rank_main

__all__ = ["CRITERIA", "EXERCISE", "KNOWN_ERRORS", "grade"]

EXERCISE = Exercise(number=7, name="pipeline", filename="ex07_pipeline.py", max_score=10, time_limit=90)
RTOL, ATOL = 1e-5, 1e-6


def _reference(p: int = 2) -> tuple[torch.Tensor, list[list[torch.Tensor]], list[float]]:
    """The unsplit model's loss on the batch, each of ``p`` stages' parameters' gradients, each micro-batch's
    loss."""
    net = model()
    x, y = batch()
    loss = nn.functional.cross_entropy(net(x), y)
    loss.backward()
    with torch.no_grad():
        micro = [nn.functional.cross_entropy(net(xi), yi).item() for xi, yi in zip(x.chunk(MICRO), y.chunk(MICRO))]
    cuts = STAGES[p]
    return loss.detach(), [[q.grad for q in net[a:b].parameters()] for a, b in zip(cuts, cuts[1:])], micro


def _raised(step: Run) -> str:
    """What the ranks raised that no cause explains, with the learner's line and the known translation."""
    own, gone = raised_first(step)
    out = []
    for r in own:
        known = translate(r.error, KNOWN_ERRORS)
        out.append(f" (rank {r.rank} raised {r.error}" + (f" at {r.where}" if r.where else "")
                   + (f": {known}" if known else "") + ")")
    return "".join(out) + peers_gone(gone)


def _advice(step: Run, text: str) -> str:
    """``": " + text``, the step to take, only where no rank raised: a run an error cut short shows what the
    error stopped, not a step the learner left out (the error, at its line, is shown instead)."""
    return "" if any(r.error for r in step.ranks) else f": {text}"


# The causes (causes) the criteria ask for, most specific first.
# the protocol's explain any failure: first
PROTOCOL = [activation_without_grad, one_buffer, gradients_not_sent, one_too_many, deadlock, unmatched]
SCALE = [count_scales, loss_not_scaled]


@criterion("each stage processes every micro-batch once", points=2)
def every_microbatch_once(step: Run) -> Verdict:
    want_rows = BATCH // MICRO
    for s in (0, 1):
        fwd, bwd = step.events(s, "F"), step.events(s, "B")
        rows = sorted({e.rows for e in fwd})
        if len(fwd) != MICRO or rows != [want_rows]:
            return failed(diagnose([*PROTOCOL, no_microbatches, pieces_of_n_rows], step, "count") or
                          f"stage {s} ran {len(fwd)} forward(s) of {rows} rows; expected {MICRO} micro-batches of "
                          f"{want_rows}" + _advice(step, "split the batch with chunk(n_microbatches) and call the "
                                                   "stage once per micro-batch") + _raised(step))
        if len(bwd) != MICRO:
            return failed(diagnose(PROTOCOL, step, "count") or f"stage {s} ran {len(bwd)} backward(s) for its "
                          f"{MICRO} forwards" + _advice(step, "backpropagate every micro-batch once") + _raised(step))
    return passed(f"{MICRO} forwards and {MICRO} backwards of {want_rows} rows per stage")


@criterion("loss matches the unsplit model", points=2)
def loss_matches(step: Run) -> Verdict:
    loss, ref = step.ranks[1].loss, step.ref_loss
    if loss is None or loss.numel() != 1:
        return failed(diagnose(PROTOCOL, step, "loss") or "rank 1 (the last stage) returned no loss"
                      + _advice(step, "return the batch's mean loss there") + _raised(step))
    if parity(loss.reshape(()), ref, rtol=RTOL, atol=ATOL).ok:
        why = loss_not_a_tensor(step) or loss_not_detached(step)
        return failed(why) if why else passed(f"loss {ref.item():.5g}")
    return failed(diagnose([*SCALE, last_loss, mean_of_scaled], step, "loss") or
                  f"rank 1 returned loss {loss.item():.6g}; the unsplit model's is {ref.item():.6g} "
                  f"(ratio {loss.item() / ref.item():.3g})")


def _used_what_it_received(step: Run) -> bool:
    """Whether the gradient that reached each of stage 0's outputs is the tensor it received from stage 1."""
    got = [c.value for c in step.ranks[0].p2p if c.op == "recv" and c.value is not None]
    used = [step.ranks[0].out_grads.get(i) for i in range(len(got))]
    return bool(got) and all(u is not None and u.shape == g.shape and torch.equal(u, g) for u, g in zip(used, got))


def _grads_verdict(step: Run, stage: int) -> Verdict:
    """Stage ``stage``'s gradients against the unsplit model's, and the cause when they differ."""
    grads, ref, part = step.ranks[stage].grads, step.ref_grads[stage], f"grads{stage}"
    if any(g is None for g in grads):
        return failed(diagnose(PROTOCOL, step, part) or f"stage {stage}'s parameters have no gradient after the "
                      "step" + _advice(step, "call loss.backward() for every micro-batch's loss" if stage == 1 else
                                       "call output.backward(grad) with the gradient received from stage 1")
                      + _raised(step))
    names = [f"parameter {i} of stage {stage}" for i in range(len(ref))]
    p = parity(dict(zip(names, grads)), dict(zip(names, ref)), rtol=RTOL, atol=ATOL)
    if p.ok:
        return passed(f"max abs difference {p.max_abs_diff:.2g}")
    why = diagnose([*PROTOCOL, *SCALE, backward_order, ignores_received], step, part)
    if not why and stage == 0 and _grads_verdict(step, 1).ok and _used_what_it_received(step):
        why = ("stage 1's gradients match and stage 0 backpropagated exactly what it received, so what stage 1 "
               "sent back is not the gradient of each received activation: after loss.backward(), send act.grad "
               "(of the tensor dist.recv filled) to rank 0")
    elif not why and stage == 0 and _grads_verdict(step, 1).ok:
        why = ("stage 1's gradients match, so stage 0 did not continue the backward with what stage 1 sent: call "
               "out.backward(grad) with the gradient received for that micro-batch, in order")
    return failed(f"stage {stage}'s gradients differ from the unsplit model's (max abs difference "
                  f"{p.max_abs_diff:.3g} in {p.worst}, tolerance rtol={RTOL}, atol={ATOL}): "
                  f"{why or 'compare your micro-batch loop with the unsplit forward and backward' + _raised(step)}")


@criterion("stage 0 gradients match the unsplit model", points=2)
def stage0_grads_match(step: Run) -> Verdict:
    return _grads_verdict(step, 0)


@criterion("stage 1 gradients match the unsplit model", points=2)
def stage1_grads_match(step: Run) -> Verdict:
    return _grads_verdict(step, 1)


@criterion("stages overlap in time", points=2)
def stages_overlap(step: Run) -> Verdict:
    f0, f1 = step.events(0, "F"), step.events(1, "F")
    if len(f0) != MICRO or len(f1) != MICRO:  # judged on the forwards alone: a backward mistake costs its own marks
        return failed(f"not checked: needs {MICRO} forwards on each stage first (ran {len(f0)} and {len(f1)})")
    last0, first1 = max(e.end for e in f0), min(e.start for e in f1)
    measured = {"stage1_start_minus_stage0_forwards_end_ms": round((first1 - last0) * 1e3, 1)}
    if first1 < last0:
        return passed(f"stage 1 started {1e3 * (last0 - first1):.0f} ms before stage 0's last forward ended",
                      **measured)
    return failed(sent_after_loop(step, "overlap") or
                  f"stage 1 started its first forward {1e3 * (first1 - last0):.0f} ms after stage 0 finished all "
                  f"{len(f0)} forwards, so the stages never worked at the same time: send each micro-batch's "
                  "activations as soon as it is computed, not after the loop", **measured)


CRITERIA = [every_microbatch_once, loss_matches, stage0_grads_match, stage1_grads_match, stages_overlap]
ONE_F_ONE_B_CRITERIA = one_f_one_b.CRITERIA


def _judge(report: ExerciseReport, criteria: list, step: Run | str, fn: str) -> None:
    """``criteria`` on one part's ``step``; a part that ended its launch (``step``: how, in the learner's terms)
    or whose function is not written yet is said once per criterion."""
    if isinstance(step, str):
        report_ended(report, criteria, fn, step)
        return
    unwritten = next((r for r in step.ranks if r.not_implemented), None)
    if unwritten is None:
        report.judge(criteria, step)
        return
    for c in criteria:
        report.check(c.rule.name, c.rule.points, False, f"not implemented yet: {fn} raised NotImplementedError"
                     + (f" at {unwritten.where}" if unwritten.where else ""), key=c.__name__)


def grade(paths: Sequence[Path], p2p_timeout_s: float = P2P_TIMEOUT_S, deeper: int | None = 4) -> list[ExerciseReport]:
    """Grade the files at ``paths`` in one 2-rank launch (one more for each part that ends one); one report each.
    Then each file whose 1F1B step ran at 2 stages runs it again at ``deeper`` stages (4; ``None``: not, as most
    tests), in one launch: its criteria hold at both, so a step written for 2 stages alone (``src=0``, ``dst=1``)
    fails at 4, where the middle stages receive and send both ways.

    Each file runs in its own process group: a send or recv with no partner is reported in its
    feedback, and two ranks both waiting time out after ``p2p_timeout_s`` (tests pass less). A message that
    aborts gloo (larger than its receive buffer) costs its own part only (``grader.parts``).
    """
    reports = [EXERCISE.new_report() for _ in paths]
    timeout = launch_timeout(EXERCISE, files=len(paths), launches=2 if deeper else 1)
    parted, wall_s = launch_parts(rank_main, paths, world=2, timeout=timeout, parts=list(PARTS),
                                  args=(p2p_timeout_s, list(PARTS)), known=KNOWN_ERRORS)
    ref = _reference()
    steps = [{part: file.ended[part] if file.part(part) is None else
              Run([RankObservation.from_wire(r) for r in file.part(part)], *ref) for part in PARTS} for file in parted]
    if deeper:
        _launch_deeper(paths, steps, deeper, timeout, p2p_timeout_s)
    for report, file_steps in zip(reports, steps):
        for part, criteria in (("gpipe", CRITERIA), ("one_f_one_b", ONE_F_ONE_B_CRITERIA)):
            _judge(report, criteria, file_steps[part], PARTS[part])
        if wall_s is not None:
            report.measurements["launch_s"] = round(wall_s, 2)
    return [r.scale_to() for r in reports]


def _launch_deeper(paths: Sequence[Path], steps: list[dict], p: int, timeout, p2p_timeout_s: float) -> None:
    """The 1F1B step of each file whose 2-stage one ran whole (no rank stopped by NotImplementedError) again on
    ``p`` ranks, each kept as its 2-stage run's ``deeper``."""
    ran = [i for i, s in enumerate(steps) if isinstance(s["one_f_one_b"], Run)
           and not any(r.not_implemented for r in s["one_f_one_b"].ranks)]
    if not ran:
        return
    try:
        parted, _ = launch_parts(rank_main, [paths[i] for i in ran], world=p, timeout=timeout,
                                 parts=["one_f_one_b"], args=(p2p_timeout_s, ["one_f_one_b"]), known=KNOWN_ERRORS)
    except LaunchError as err:  # before the step began (it did at 2 stages): said as the 4-stage run's end
        from ...grader.main import explain
        for i in ran:
            steps[i]["one_f_one_b"].deeper = explain(err, Path(paths[i]), KNOWN_ERRORS)
        return
    ref = _reference(p)
    for i, file in zip(ran, parted):
        ranks = file.part("one_f_one_b")
        steps[i]["one_f_one_b"].deeper = file.ended["one_f_one_b"] if ranks is None else \
            Run([RankObservation.from_wire(r) for r in ranks], *ref)
