"""Exercise 7 check: a hand-written 2-stage GPipe step, graded on 2 ranks.

The grader builds the stages itself and wraps each in a
:class:`distlab.pipeline.TimedStage`, which logs every forward and backward
the learner's code makes it run (nothing the learner reports is trusted).
A fixed sleep at the start of each stage (:class:`distlab.pipeline.Delay`)
makes the timeline independent of the machine's speed. From the logs and
the gradients the ranks return, the grading process checks:

* parity with the unsplit model: the loss and every parameter's gradient
  (``assert_close``: micro-batch sums add in another order than one batch);
* the micro-batches each stage processed (count and size);
* overlap: stage 1 starts its first forward before stage 0 has finished
  all its forwards, the point of a pipeline.
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

import distlab
from distlab.data import digits
from distlab.models import make_mlp
from distlab.pipeline import Delay, TimedStage

from ..grading import grade_files
from ..harness import CapturedPrints, echo, load_learner
from ..parity import parity
from ..registry import Exercise
from ..report import ExerciseReport

EXERCISE = Exercise(number=7, name="pipeline", filename="ex07_pipeline.py", max_score=10, time_limit=90)
BATCH, MICRO, HIDDEN, BOUNDARY = 64, 4, 64, 4   # MLP depth 3: Linear,ReLU,Linear,ReLU | Linear,ReLU,Linear
DELAYS = (0.03, 0.015)                           # seconds of "compute" per forward, stage 0 and stage 1
RTOL, ATOL = 1e-5, 1e-6


def _model() -> nn.Sequential:
    return make_mlp(seed=3, hidden=HIDDEN, depth=3).net


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    x, y = digits().tensors
    return x[:BATCH], y[:BATCH]


def rank_main(paths: list[str]) -> list[dict]:
    """Runs on both ranks: one GPipe step with each learner file in turn, observed by TimedStage."""
    distlab.init_distributed()
    rank = dist.get_rank()
    if dist.get_world_size() != 2:
        raise RuntimeError("exercise 7 is a 2-stage pipeline: run it on 2 ranks")
    dev = distlab.device()
    x, y = (t.to(dev) for t in _batch())
    observed = []
    for path in paths:
        learner = load_learner(path)
        layers = _model()[:BOUNDARY] if rank == 0 else _model()[BOUNDARY:]
        stage = TimedStage(nn.Sequential(Delay(DELAYS[rank]), *layers).to(dev), rank, sync=dev.type == "cuda")
        dist.barrier()
        with CapturedPrints() as out:
            loss = learner.gpipe_step(stage, x.clone(), y.clone(), n_microbatches=MICRO, hidden=HIDDEN)
        echo(out.lines)
        dist.barrier()
        observed.append({
            "rank": rank, "events": stage.log(),
            "grads": [None if p.grad is None else p.grad.detach().cpu().clone() for p in layers.parameters()],
            "loss": torch.as_tensor(loss).detach().cpu().float() if loss is not None else None,
        })
    distlab.shutdown()
    return observed


def _reference() -> tuple[torch.Tensor, list[list[torch.Tensor]]]:
    model = _model()
    x, y = _batch()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    return loss.detach(), [[p.grad for p in model[:BOUNDARY].parameters()],
                           [p.grad for p in model[BOUNDARY:].parameters()]]


def _grad_feedback(stage: int, grads: list, ref: list[torch.Tensor], other_ok: bool) -> tuple[bool, str, str]:
    if any(g is None for g in grads):
        return False, (f"stage {stage}'s parameters have no gradient after the step: "
                       + ("call loss.backward() for every micro-batch's loss" if stage == 1 else
                          "call output.backward(grad) with the gradient received from stage 1")), ""
    names = [f"parameter {i} of stage {stage}" for i in range(len(ref))]
    p = parity(dict(zip(names, grads)), dict(zip(names, ref)), rtol=RTOL, atol=ATOL)
    worst = p.max_abs_diff
    if p.ok:
        return True, "", f"max abs difference {worst:.2g}"
    dot = sum((g * r).sum().item() for g, r in zip(grads, ref))
    ratio = dot / max(sum((r * r).sum().item() for r in ref), 1e-30)
    if abs(ratio - MICRO) < 0.05 * MICRO:
        why = (f"they are {ratio:.2f}x the unsplit model's ({MICRO} micro-batches): divide each "
               "micro-batch's loss by n_microbatches so the gradients add up to the batch mean's")
    elif stage == 0 and other_ok:
        why = ("stage 1's gradients match, so stage 0 did not continue the backward with what stage 1 "
               "sent: call out.backward(grad) with the gradient received for that micro-batch, in order")
    else:
        why = "compare your micro-batch loop with the unsplit forward and backward"
    return False, (f"stage {stage}'s gradients differ from the unsplit model's (max abs difference "
                   f"{worst:.3g} in {p.worst}, tolerance rtol={RTOL}, atol={ATOL}): {why}"), ""


def _verdict(report: ExerciseReport, obs: list[dict]) -> None:
    ref_loss, ref_grads = _reference()
    events = {r: [e for e in obs[r]["events"]] for r in (0, 1)}
    # 1. micro-batches per stage
    want_rows = BATCH // MICRO
    counts_ok, msg = True, ""
    for s in (0, 1):
        fwd = [e for e in events[s] if e["kind"] == "F"]
        bwd = [e for e in events[s] if e["kind"] == "B"]
        rows = sorted({e["rows"] for e in fwd})
        if len(fwd) != MICRO or rows != [want_rows]:
            counts_ok = False
            msg = (f"stage {s} ran {len(fwd)} forward(s) of {rows} rows; expected {MICRO} micro-batches of "
                   f"{want_rows}: split the batch with chunk(n_microbatches) and call the stage once per micro-batch")
            break
        if len(bwd) != MICRO:
            counts_ok = False
            msg = (f"stage {s} ran {len(bwd)} backward(s) for its {MICRO} forwards: backpropagate every "
                   "micro-batch once")
            break
    report.check("each stage processes every micro-batch once", 2, counts_ok, msg,
                 pass_note=f"{MICRO} forwards and {MICRO} backwards of {want_rows} rows per stage")
    # 2. loss parity
    loss = obs[1]["loss"]
    if loss is None or loss.numel() != 1:
        ok, why = False, "rank 1 (the last stage) returned no loss: return the batch's mean loss there"
    else:
        ok = parity(loss.reshape(()), ref_loss, rtol=RTOL, atol=ATOL).ok
        ratio = loss.item() / ref_loss.item()
        why = (f"rank 1 returned loss {loss.item():.6g}; the unsplit model's is {ref_loss.item():.6g} "
               f"(ratio {ratio:.3g})" + (": divide each micro-batch's loss by n_microbatches"
                                        if abs(ratio - MICRO) < 0.05 * MICRO else ""))
    report.check("loss matches the unsplit model", 2, ok, why,
                 pass_note=f"loss {ref_loss.item():.5g}")
    # 3. gradient parity, stage 1 first (stage 0's feedback depends on it)
    ok1, fb1, note1 = _grad_feedback(1, obs[1]["grads"], ref_grads[1], True)
    ok0, fb0, note0 = _grad_feedback(0, obs[0]["grads"], ref_grads[0], ok1)
    report.check("stage 0 gradients match the unsplit model", 2, ok0, fb0, pass_note=note0)
    report.check("stage 1 gradients match the unsplit model", 2, ok1, fb1, pass_note=note1)
    # 4. the stages overlap in time
    f0 = [e for e in events[0] if e["kind"] == "F"]
    f1 = [e for e in events[1] if e["kind"] == "F"]
    if not counts_ok or len(f0) < 2 or not f1:
        report.check("stages overlap in time", 2, False, "not checked: needs one forward per micro-batch first")
        return
    last0 = max(e["end"] for e in f0)
    first1 = min(e["start"] for e in f1)
    report.measurements["stage1_start_minus_stage0_forwards_end_ms"] = round((first1 - last0) * 1e3, 1)
    report.check("stages overlap in time", 2, first1 < last0,
                 f"stage 1 started its first forward {1e3 * (first1 - last0):.0f} ms after stage 0 finished "
                 f"all {len(f0)} forwards, so the stages never worked at the same time: send each "
                 "micro-batch's activations as soon as it is computed, not after the loop",
                 pass_note=f"stage 1 started {1e3 * (last0 - first1):.0f} ms before stage 0's last forward ended")


def grade_all(paths: list[Path]) -> list[ExerciseReport]:
    """Grade several files in one launch (the learner's code never touches the process group).

    The timeout (60 s) fits inside ``EXERCISE.time_limit`` (90 s): a hung send or recv is reported
    as a ``LaunchTimeout`` naming the ranks that never finished.
    """
    return grade_files(EXERCISE, rank_main, paths, world=2, timeout=EXERCISE.time_limit - 30, verdict=_verdict)


def grade(path: Path) -> ExerciseReport:
    """Grade the file at ``path``."""
    return grade_all([path])[0]
