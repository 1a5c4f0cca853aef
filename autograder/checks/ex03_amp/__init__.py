"""Exercise 3 check: autocast training step, GradScaler order, the method of measuring, and fp16 accumulation.

One rank (mixed precision is not about several processes) runs the learner's functions under the
instruments of ``probes`` and returns observations; every verdict is computed here, against
references computed here:

* the autocast dtypes; the float32 step against a single-process reference (assert_close), and the
  bf16 and fp16 losses over ``STEPS`` steps against its float32 losses within ``LOSS_TOL``;
* the GradScaler's call order, the gradient norm the optimizer steps with (``max_norm`` if clipped
  after unscaling, ``max_norm / scale`` if clipped before), and a batch with an ``inf`` skipped;
* ``compare`` on simulated workloads whose true speedup and memory ratio the grader knows, so missing
  warm-up, missing synchronisation, a mean dragged by outliers, an inverted ratio, and counting each
  saved tensor (or each view's own size) instead of each storage fail deterministically on any
  machine (within ``RATIO_TOL``); then on the real model, whose speedup is reported, and required
  only on a GPU with bf16 tensor cores (compute capability 8.0 or newer, ``GPU_MIN_SPEEDUP``);
* ``accumulated_step`` (the part notebook 03 does not show, ``accumulation``, its criteria in
  ``accumulation.criteria``): float16 over ``K`` micro-batches with a GradScaler, against the same window
  written the right way in one process (weights within ``ACC_RTOL``/``ACC_ATOL``, losses within
  ``LOSS_TOL``), the scaler's calls per window and the clipped norm, and a window whose one micro-batch
  overflows skipped whole, the scale halved once;
* ``distlab.measure.timing.median_seconds`` and ``distlab.measure.memory.saved_tensor_bytes`` (and
  ``distributed_median_seconds``), which the notebooks use, are working copies of the graded
  ``median_seconds`` and ``saved_bytes`` (:mod:`autograder.rank.runtime_copies`). A copy handed in (imported,
  aliased, delegating, also through a name bound at import or ``distlab.measure.memory.peak_memory``, or
  called by ``compare`` instead of the learner's own) earns none of its function's criteria, and the
  real model is then not measured (its seconds would be the runtime's).

The parts (``train_step``'s runs, the measuring, the real model, ``accumulated_step``) are each kept as they
return (``grader.parts``): one that ends its launch (a loop that never returns, a rank killed) costs its own
criteria, and the real model's where ``train_step`` or the measuring ended (it runs both), and no others.

A failure names the first cause below that explains the observations (each has a mutant in
``tests/exercises/test_ex03_amp.py``); errors PyTorch raises are translated, and the other parts keep their marks:

| mistake | message |
|---|---|
| loss summed over the batch | "the first bf16 loss is 64x the float32 reference's, the batch size (64) ..." |
| scaled loss returned | "the fp16 loss train_step returned is 65536x the reference's, the scale ..." |
| optimizer.zero_grad() not called | "when the backward of step 2 began, .grad still held gradients of norm 0.05 ..." |
| optimizer.step() not called once per step | "train_step called optimizer.step() 2 times in step 1 ..." |
| gradients not clipped to max_norm | "the optimizer stepped with a gradient norm of 11.6 at step 1, where ..." |
| accumulation: gradients not cleared at the window's start | "accumulated_step did not clear the gradients ..." |
| gradients clipped by value, not by norm | "...: you clipped with torch.nn.utils.clip_grad_value_ ..." |
| CUDA's autocast on the CPU | "you entered torch.cuda.amp.autocast (ex03_amp.py:61), which autocasts ..." |
| scaler.update() not called | "one fp16 step's GradScaler calls ... were [...] and never scaler.update() ..." |
| optimizer.step() instead of scaler.step() | "... 'optimizer.step' but not scaler.step(optimizer), which ..." |
| loss not scaled | "... never scaler.scale(loss): call scaler.scale(loss).backward() ..." |
| first fp16 step skipped | "one fp16 step's GradScaler calls ... were [...]: scaler.step skipped ..." |
| clipped before unscale_ | "... a gradient norm of 7.6e-07 ...: you clipped the scaled gradients ..." |
| scaler.unscale_ called twice in one step | "unscale_(optimizer) ran twice before one scaler.step() ..." (raised) |
| model cast to float16 | "the parameters, so their gradients, are float16 ..." (raised) |
| gradients cleared before scaler.step | "scaler.step(optimizer) found no gradients ..." (raised) |
| saved_bytes leaves out saved tensors of some kinds | "saved_bytes counted 320,000 bytes ...: it left out the ..." |
| saved_bytes counts tensors, not storages | "saved_bytes counted 50,000 bytes ... each view's own bytes ..." |
| the fastest call reported, not the median | "median_seconds ... returned 0.002 s for the outliers workload's ..." |
| unscale_ per micro-batch | "scaler.unscale_(optimizer) ran after a micro-batch's backward and again ..." (raised) |
| update per micro-batch | "scaler.update() ran after a micro-batch's backward, before ..." (raised) |
| every forward of a window before its backwards | "window 1 ran ... in the order F F F F B B B B ..." |
| not one backward per micro-batch | "window 1 ran 1 backward(s) of 1 scaled loss(es) for 4 micro-batches ..." |
| steps not once per window | "window 1 called scaler.step 4 time(s) and optimizer.step 4 time(s) ..." |
| loss not divided by k | "... a gradient norm of 0.727 in window 1, 4x the whole batch's mean gradient's ..." |
| clipped before unscale_ (accumulation) | "... stepped with a gradient norm of 7.6e-07, max_norm ..." |
| CPU time measured instead of wall-clock time | "you timed with time.process_time(), which counts this ..." |
| timed for fewer than min_run_time seconds | "median_seconds (called at ex03_amp.py:144) measured 0.08 s of ..." |
| compare does not pass its timing settings on | "compare called median_seconds at ex03_amp.py:144 with warmup=3 ..." |
| the workload timed with fewer threads than its caller's | "the workloads ran with 1 torch thread(s) while ..." |
| a window's loss not its micro-batches' mean | "the loss returned for window 1 is 2.32074, but the mean of its 4 ..." |
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

from ...grader.diagnosis import diagnose
from ...grader.launches import launch_timeout
from ...grader.parity import parity
from ...grader.parts import Parted, judge_parts, launch_parts
from ...grader.registry import Exercise
from ...grader.report import ExerciseReport, Verdict, criterion, failed, passed
from .accumulation.criteria import accumulation_order, accumulation_overflow, accumulation_parity
from .causes import (KNOWN_ERRORS, broken, calls, clipped_scaled, cuda_autocast, grads_not_zeroed, loss_summed,
                     no_update, not_clipped, not_scaled, optimizer_stepped, real_missing, scaled_loss_returned,
                     step_skipped, steps_not_one, value_clipped)
from .accumulation.observations import Accumulation
from .observations import AmpObservation, Answers, Autocast, Measure, Parity, RealModel, Run, Scaler
from .measuring import (GPU_MIN_SPEEDUP, async_speedup, gpu_speedup, memory_ratio, outliers_speedup, steady_speedup,
                        warmup_speedup)
from .probes import PARTS, REAL_MODEL, rank_main
from .workloads import CASE_TITLES, LOSS_TOL, MAX_NORM, STEPS, reference_fp32

__all__ = ["CASE_TITLES", "EXERCISE", "GPU_MIN_SPEEDUP", "KNOWN_ERRORS", "criteria", "grade"]

EXERCISE = Exercise(number=3, name="amp", filename="ex03_amp.py", max_score=10, time_limit=90)
# What median_seconds and compare return are measurements of time: no two runs share them, so the first divergence
# from the reference's trace does not compare them (a blind audit's: timing noise was pinned on a correct line)
MEASURED_RETURNS = ("median_seconds", "compare")
RTOL, ATOL = 1e-4, 1e-5  # float32 step vs the single-process reference
PER_EXTRA_FILE_S = 15.0  # one more file in a launch: every part, and the real model, measured again


STEP_CAUSES = [grads_not_zeroed, steps_not_one, not_clipped]  # tested on the float32 run: no autocast, no scaler


@criterion("bf16 autocast: linear outputs bf16, master weights float32", points=1.5)
def autocast_dtypes(run: Run) -> Verdict:
    a = run.obs.autocast
    if why := broken(a.error, "train_step"):
        return failed(why)
    outs, params, grads = a.linear_out, a.param_dtypes, a.grad_dtypes
    if any(d != "torch.float32" for d in params + grads):
        return failed(f"at optimizer.step() parameters were {sorted(set(params))} and gradients "
                      f"{sorted(set(grads))}: keep the model in float32 (do not call model.to(torch.bfloat16)); "
                      "autocast casts per op")
    if any(d != "torch.bfloat16" for d in outs):
        return failed(cuda_autocast(run) or f"the nn.Linear outputs were {outs}: run the forward pass and the loss "
                      "inside torch.autocast(device_type=x.device.type, dtype=amp_dtype)")
    return passed()


@criterion("float32 step matches a single-process reference", points=0.5)
def float32_parity(run: Run) -> Verdict:
    p = run.kind("fp32")
    if why := broken(p.error, "train_step"):
        return failed(why)
    same = parity(p.state, reference_fp32()[1], rtol=RTOL, atol=ATOL)
    if same.ok:
        return passed(f"max abs difference {same.max_abs_diff:.2g}")
    return failed(value_clipped(run) or diagnose(STEP_CAUSES, p) or
                  f"after {STEPS} float32 steps the weights differ from zero_grad, cross-entropy, backward, "
                  f"clip_grad_norm_(max_norm={MAX_NORM}), step (max abs difference {same.max_abs_diff:.3g} "
                  f"in {same.worst})")


@criterion(f"bf16 and fp16 losses within {LOSS_TOL} of float32 over {STEPS} steps", points=1)
def losses_close(run: Run) -> Verdict:
    for kind in ("bf16", "fp16"):
        if why := broken(run.kind(kind).error, f"the {kind} train_step"):
            return failed(why)
    ref_losses = reference_fp32()[0]
    worst = []  # per kind: (largest relative gap, kind, the step where it is)
    for kind in ("bf16", "fp16"):
        gaps = [abs(loss - ref) / max(1.0, abs(ref)) for loss, ref in zip(run.kind(kind).losses, ref_losses)]
        worst.append((max(gaps), kind, gaps.index(max(gaps))))
    gap, kind, step = max(worst)
    measured = dict(bf16_max_loss_gap=worst[0][0], fp16_max_loss_gap=worst[1][0])
    if gap <= LOSS_TOL:
        return passed(f"largest gap {gap:.2g} ({kind})", **measured)
    fp32 = run.kind("fp32")
    cause = diagnose([loss_summed, scaled_loss_returned], kind, run.kind(kind).losses) or (
        not fp32.error and diagnose(STEP_CAUSES, fp32))
    return failed(cause or f"the {kind} loss at step {step + 1} is {gap:.3g} away from the float32 reference's "
                  f"(tolerance {LOSS_TOL}), though the float32 step has none of the usual mistakes", **measured)


@criterion("fp16 GradScaler order: scale, backward, unscale_, clip, step, update", points=1.5)
def scaler_order(run: Run) -> Verdict:
    s = run.obs.scaler
    if why := broken(s.error, "train_step with a scaler"):
        return failed(why)
    expected = ["scale", "backward", "unscale_", "step", "optimizer.step", "update"]
    if s.events == expected and abs(s.grad_norm - MAX_NORM) <= 1e-3 * MAX_NORM:
        return passed()
    losses = run.kind("fp16").losses
    return failed(diagnose([not_scaled, optimizer_stepped, no_update], s) or step_skipped(s, losses) or
                  clipped_scaled(s) or (
        f"{calls(s)}; expected {expected}: scaler.scale(loss).backward(), "
        "scaler.unscale_(optimizer), clip, scaler.step(optimizer), scaler.update()" if s.events != expected else
        f"the optimizer stepped with a gradient norm of {s.grad_norm:.3g}, but clipping the true gradients "
        f"gives max_norm={MAX_NORM}: clip with torch.nn.utils.clip_grad_norm_ after scaler.unscale_"))


@criterion("fp16 step with inf gradients is skipped", points=1)
def inf_step_skipped(run: Run) -> Verdict:
    s = run.obs.scaler
    if why := broken(s.error, "train_step with a scaler") or broken(s.inf_error, "the step after it"):
        return failed(why)
    if not s.inf_params_unchanged:
        return failed("a batch containing inf changed the weights: step through scaler.step(optimizer), which "
                      "skips non-finite steps")
    if s.scale_after_inf < s.scale_before_inf:
        return passed()
    return failed(f"the scale stayed {s.scale_after_inf:g} after an inf step: call scaler.update() every step")


CRITERIA = [autocast_dtypes, float32_parity, losses_close, scaler_order, inf_step_skipped, steady_speedup,
            warmup_speedup, async_speedup, outliers_speedup, memory_ratio, accumulation_parity,
            accumulation_order, accumulation_overflow]


def parts(run: Run) -> dict[str, tuple[str, list[Callable]]]:
    """The parts, in the report's order: the function each grades, and its criteria (the real speedup only on a
    GPU with bf16 tensor cores; on a CPU the real model is notes only)."""
    real = [gpu_speedup] if run.gpu_speedup_graded else []
    return {"train": ("train_step", CRITERIA[:5]), "measure": ("compare", CRITERIA[5:10]),
            "accumulation": ("accumulated_step", CRITERIA[10:]), "real": ("compare on the real model", real)}


def criteria(run: Run) -> list[Callable]:
    """The criteria this run is judged by, every part's in the report's order."""
    return [c for _, judged in parts(run).values() for c in judged]


def real_model_notes(run: Run, file: Parted | None = None) -> tuple[list[str], dict]:
    """What the learner's compare() measured on the real model: notes for the report, and its numbers."""
    if file is not None and (how := file.ended.get("real")):
        return [f"real-model measurement not available: compare on the real model did not finish: {how}"], {}
    if file is not None and (needed := file.unrun.get("real")):
        return [f"real-model measurement not available: {parts(run)[needed][0]} did not finish"], {}
    r = run.obs.real
    if r.skipped:
        return [f"real-model measurement skipped: {run.copied[r.skipped]}"], {}
    if why := real_missing(run) or broken(r.error, "compare"):
        return [f"real-model measurement not available: {why}"], {}
    got = r.returned  # compare's dict: the contract's keys, real_missing made sure
    # the speed from the times themselves: the learner's own ratio is judged on the simulated workloads
    notes = [f"On this machine ({r.device}, {r.model}), your compare() measured bf16 autocast at "
             f"{got['candidate_s'] * 1e3:.2f} ms per step, float32 at {got['baseline_s'] * 1e3:.2f} ms "
             f"({got['baseline_s'] / got['candidate_s']:.2f}x the speed), and {got['memory_ratio']:.2f}x its "
             f"saved-activation bytes. The grader's own memory measurement: {r.peak_ratio:.2f}x, by {r.peak_method}."]
    if not run.capability:
        notes.append("On a CPU the speedup is reported, not graded: bf16 matmuls are only fast where "
                     "the CPU has bf16 matrix instructions (AMX); a shared machine adds noise.")
    elif not run.gpu_speedup_graded:
        notes.append(f"This GPU has compute capability {'.'.join(map(str, run.capability))}, without bf16 "
                     f"tensor cores (8.0+): the speedup is reported, not graded (at least "
                     f"{GPU_MIN_SPEEDUP}x is required on 8.0 and newer).")
    return notes, {f"real_{k}": v for k, v in r.numbers().items()}


def observation(file: Parted) -> AmpObservation:
    """The one rank's parts as one observation: a part not kept (it ended a launch, or needed one that did) is
    its record's defaults, which no criterion reads (:func:`judge_parts` says how it ended instead)."""
    kept = [w for p in PARTS if (w := (file.part(p) or [None])[0]) is not None]
    calls = [c for w in kept for c in w["answers"]["calls"]]
    wire = {"capability": next((w["capability"] for w in kept), None),
            "answers": Answers(identified=next((w["answers"]["identified"] for w in kept), {}),
                               calls=[c for k, c in enumerate(calls) if c not in calls[:k]]).to_wire()}
    for w in kept:
        wire.update({k: v for k, v in w.items() if k not in ("capability", "answers")})
    defaults = AmpObservation(capability=None, autocast=Autocast(), parity=Parity(), scaler=Scaler(),
                              measure=Measure(), accumulation=Accumulation(), real=RealModel(), answers=Answers())
    return AmpObservation.from_wire({**defaults.to_wire(), **wire})


def grade(paths: Sequence[Path], real_models: dict[str, dict] = REAL_MODEL) -> list[ExerciseReport]:
    """Grade the files at ``paths`` in one launch on one rank (one more for each part that ends one:
    ``grader.parts``); one report each.

    ``real_models`` (tests only): the real model's sizes per device type, e.g. a smaller CPU model,
    where its speedup is reported but not graded. For one file the launch's timeout fits inside
    ``EXERCISE.time_limit``, so a loop that never returns is a ``LaunchTimeout`` that ends its part, rather
    than the whole grading cut by the outer limit.
    """
    reports = [EXERCISE.new_report() for _ in paths]
    timeout = launch_timeout(EXERCISE, files=len(paths), per_extra_file_s=PER_EXTRA_FILE_S)
    parted, wall_s = launch_parts(rank_main, paths, world=1, timeout=timeout, parts=PARTS, args=(real_models,),
                                  known=KNOWN_ERRORS, needs={"real": ("train", "measure")})
    for report, file in zip(reports, parted):
        run = Run(observation(file))
        judge_parts(report, parts(run), file.ended, run, unrun=file.unrun)
        notes, measured = real_model_notes(run, file)
        report.notes += notes
        report.measurements.update(measured, **({"launch_s": round(wall_s, 2)} if wall_s is not None else {}))
    return [r.scale_to() for r in reports]
