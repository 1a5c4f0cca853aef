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

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
import torch.distributed as dist
from torch import nn

import distlab
from distlab.data import digits
from distlab.models import make_mlp
from distlab.pipeline import Delay, TimedStage

from ..grading import launch_files, launch_timeout
from ..harness import CapturedPrints, echo, load_learner
from ..parity import parity
from ..registry import Exercise
from ..report import ExerciseReport, Verdict, criterion, failed, passed

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
    distlab.init_distributed()  # the grader owns the process group: the learner's code only sends and receives
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
    """The unsplit model's loss on the batch, and each stage's parameters' gradients."""
    model = _model()
    x, y = _batch()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    return loss.detach(), [[p.grad for p in model[:BOUNDARY].parameters()],
                           [p.grad for p in model[BOUNDARY:].parameters()]]


@dataclass
class Step:
    """One file's GPipe step: both ranks' observations (rank = stage), and the unsplit model's figures."""

    ranks: list[dict]
    ref_loss: torch.Tensor
    ref_grads: list[list[torch.Tensor]]

    def events(self, stage: int, kind: str) -> list[dict]:
        """The stage's logged forwards (``"F"``) or backwards (``"B"``)."""
        return [e for e in self.ranks[stage]["events"] if e["kind"] == kind]


@criterion("each stage processes every micro-batch once", points=2)
def every_microbatch_once(step: Step) -> Verdict:
    want_rows = BATCH // MICRO
    for s in (0, 1):
        fwd, bwd = step.events(s, "F"), step.events(s, "B")
        rows = sorted({e["rows"] for e in fwd})
        if len(fwd) != MICRO or rows != [want_rows]:
            return failed(f"stage {s} ran {len(fwd)} forward(s) of {rows} rows; expected {MICRO} micro-batches of "
                          f"{want_rows}: split the batch with chunk(n_microbatches) and call the stage once per "
                          "micro-batch")
        if len(bwd) != MICRO:
            return failed(f"stage {s} ran {len(bwd)} backward(s) for its {MICRO} forwards: backpropagate every "
                          "micro-batch once")
    return passed(f"{MICRO} forwards and {MICRO} backwards of {want_rows} rows per stage")


@criterion("loss matches the unsplit model", points=2)
def loss_matches(step: Step) -> Verdict:
    loss, ref = step.ranks[1]["loss"], step.ref_loss
    if loss is None or loss.numel() != 1:
        return failed("rank 1 (the last stage) returned no loss: return the batch's mean loss there")
    if parity(loss.reshape(()), ref, rtol=RTOL, atol=ATOL).ok:
        return passed(f"loss {ref.item():.5g}")
    ratio = loss.item() / ref.item()
    return failed(f"rank 1 returned loss {loss.item():.6g}; the unsplit model's is {ref.item():.6g} "
                  f"(ratio {ratio:.3g})" + (": divide each micro-batch's loss by n_microbatches"
                                           if abs(ratio - MICRO) < 0.05 * MICRO else ""))


def _missing_grad(stage: int) -> str:
    return (f"stage {stage}'s parameters have no gradient after the step: "
            + ("call loss.backward() for every micro-batch's loss" if stage == 1 else
               "call output.backward(grad) with the gradient received from stage 1"))


def _grads_verdict(step: Step, stage: int) -> Verdict:
    """Stage ``stage``'s gradients against the unsplit model's, and the likely cause when they differ."""
    grads, ref = step.ranks[stage]["grads"], step.ref_grads[stage]
    if any(g is None for g in grads):
        return failed(_missing_grad(stage))
    names = [f"parameter {i} of stage {stage}" for i in range(len(ref))]
    p = parity(dict(zip(names, grads)), dict(zip(names, ref)), rtol=RTOL, atol=ATOL)
    if p.ok:
        return passed(f"max abs difference {p.max_abs_diff:.2g}")
    dot = sum((g * r).sum().item() for g, r in zip(grads, ref))
    ratio = dot / max(sum((r * r).sum().item() for r in ref), 1e-30)  # the gradients' scale against the reference
    if abs(ratio - MICRO) < 0.05 * MICRO:
        why = (f"they are {ratio:.2f}x the unsplit model's ({MICRO} micro-batches): divide each "
               "micro-batch's loss by n_microbatches so the gradients add up to the batch mean's")
    elif stage == 0 and _grads_verdict(step, 1).ok:
        why = ("stage 1's gradients match, so stage 0 did not continue the backward with what stage 1 "
               "sent: call out.backward(grad) with the gradient received for that micro-batch, in order")
    else:
        why = "compare your micro-batch loop with the unsplit forward and backward"
    return failed(f"stage {stage}'s gradients differ from the unsplit model's (max abs difference "
                  f"{p.max_abs_diff:.3g} in {p.worst}, tolerance rtol={RTOL}, atol={ATOL}): {why}")


@criterion("stage 0 gradients match the unsplit model", points=2)
def stage0_grads_match(step: Step) -> Verdict:
    return _grads_verdict(step, 0)


@criterion("stage 1 gradients match the unsplit model", points=2)
def stage1_grads_match(step: Step) -> Verdict:
    return _grads_verdict(step, 1)


@criterion("stages overlap in time", points=2, requires=[every_microbatch_once])
def stages_overlap(step: Step) -> Verdict:
    f0 = step.events(0, "F")
    last0 = max(e["end"] for e in f0)
    first1 = min(e["start"] for e in step.events(1, "F"))
    measured = {"stage1_start_minus_stage0_forwards_end_ms": round((first1 - last0) * 1e3, 1)}
    if first1 < last0:
        return passed(f"stage 1 started {1e3 * (last0 - first1):.0f} ms before stage 0's last forward ended",
                      **measured)
    return failed(f"stage 1 started its first forward {1e3 * (first1 - last0):.0f} ms after stage 0 finished "
                  f"all {len(f0)} forwards, so the stages never worked at the same time: send each "
                  "micro-batch's activations as soon as it is computed, not after the loop", **measured)


CRITERIA = [every_microbatch_once, loss_matches, stage0_grads_match, stage1_grads_match, stages_overlap]


def grade(paths: Sequence[Path]) -> list[ExerciseReport]:
    """Grade the files at ``paths`` in one 2-rank launch; one report each.

    The launch's timeout fits inside ``EXERCISE.time_limit``: a hung send or recv is reported as a
    ``LaunchTimeout`` naming the ranks that never finished.
    """
    reports = [EXERCISE.new_report() for _ in paths]
    runs, wall_s = launch_files(rank_main, paths, world=2, timeout=launch_timeout(EXERCISE, files=len(paths)))
    ref_loss, ref_grads = _reference()
    for report, ranks in zip(reports, runs):
        report.judge(CRITERIA, Step(ranks, ref_loss, ref_grads))
        report.measurements["launch_s"] = round(wall_s, 2)
    return [r.scale_to() for r in reports]
