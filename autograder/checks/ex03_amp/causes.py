"""Exercise 3's likely mistakes, tested against what the ranks observed (see autograder/grader/diagnosis.py).

``ex03_amp`` lists them in its docstring and asks for them, most specific first, when a criterion fails;
each tests one part's observations (``probes`` runs the parts separately). :func:`broken` says
why a part raised (translating the errors of ``KNOWN_ERRORS``), :func:`missing` what its result lacked.
Each takes the part's record (``observations``).
"""
from __future__ import annotations

import math

from ...grader.diagnosis import KnownError, mistake, translate
from .observations import Compared, Measure, PrecisionRun, Run, Scaler
from .workloads import (BATCH, MAX_NORM, MEMORY_TRUTH, MIN_RUN_TIME, MIXED, OUTLIERS_FASTEST, SHARED, WARMUP,
                        reference_fp32)

KNOWN_ERRORS = [
    KnownError("scaler.update() not called",
               r"unscale_\(\) is being called after step\(\)|step\(\) has already been called since the last update",
               "the GradScaler was not updated after scaler.step(optimizer), so the next step found it still "
               "'stepped' (and the scale never adapts): call scaler.update() once per step, after scaler.step"),
    KnownError("scaler.unscale_ called twice in one step", r"unscale_\(\) has already been called on this optimizer",
               "unscale_(optimizer) ran twice before one scaler.step(): call it once, after backward and before "
               "clipping (scaler.step does not unscale again)"),
    KnownError("model cast to float16", r"Attempting to unscale FP16 gradients",
               "the parameters, so their gradients, are float16: keep the model in float32 (no model.half() or "
               "model.to(torch.float16)); autocast runs the ops in float16 and the scaler unscales float32 gradients"),
    KnownError("gradients cleared before scaler.step", r"No inf checks were recorded for this optimizer",
               "scaler.step(optimizer) found no gradients on the optimizer's parameters: zero the gradients at the "
               "start of the step (optimizer.zero_grad()), not between backward and scaler.step"),
]


def broken(error: str, what: str) -> str:
    """Why a part of the exercise did not run, from the ``error`` its record holds ("" if it ran)."""
    if not error:
        return ""
    if error.startswith("NotImplementedError"):
        return f"not implemented yet ({what})"
    if cause := translate(error, KNOWN_ERRORS):
        return f"{cause} ({what} raised {error})"
    return f"{what} raised {error}"


def missing(had: list[str], keys: tuple[str, ...]) -> str:
    """Feedback when compare() returned a dict without some of the contract's keys ("" if none missing), from
    the keys its observation ``had``."""
    gone = [k for k in keys if k not in had]
    if not gone:
        return ""
    return (f"compare() returned a dict without {', '.join(repr(k) for k in gone)} (it had {sorted(had)}): "
            "return baseline_s, candidate_s, speedup, baseline_bytes, candidate_bytes and memory_ratio")


def real_missing(run: Run) -> str:
    """Feedback when the real model's compare() left out keys of the contract ("" if none, or if it did not run)."""
    r = run.obs.real
    return "" if r.error or r.skipped else missing(r.keys(), ("speedup", "baseline_s", "candidate_s", "memory_ratio"))


def calls(s: Scaler) -> str:
    """What the recording scaler saw of one fp16 step, in words (it records the scaler's calls, the backward and
    the optimizer's step: not a clip)."""
    return f"one fp16 step's GradScaler calls, backward and optimizer steps were {s.events}"


@mistake("the workload timed with fewer threads than its caller's")
def fewer_threads(m: Measure) -> str | None:
    """benchmark.Timer without num_threads=: fn runs single-threaded, a step the caller runs on all its threads."""
    few = [t for t in m.fn_threads if t < m.caller_threads]
    if not few:
        return None
    return (f"the workloads ran with {min(few)} torch thread(s) while median_seconds timed them, where its caller "
            f"runs {m.caller_threads}: the seconds are those of another, slower step (benchmark.Timer's num_threads "
            "defaults to 1: pass num_threads=torch.get_num_threads())")


@mistake("compare does not pass its timing settings on")
def timing_not_passed(m: Measure, case: str = "") -> str | None:
    """A call of median_seconds from compare with other settings than compare was given (both known numbers)."""
    given = {"warmup": WARMUP, "min_run_time": MIN_RUN_TIME}
    for call in m.timing_calls:
        ran = {"warmup": call.warmup, "min_run_time": call.min_run_time}
        if None in ran.values() or ran == given:
            continue
        other = [k for k in given if ran[k] != given[k]]
        where = f" at {call.line}" if call.line else ""
        return (f"compare called median_seconds{where} with {' and '.join(f'{k}={ran[k]:g}' for k in other)}, not the "
                f"{' and '.join(f'{k}={given[k]:g}' for k in other)} compare was given: pass compare's warmup and "
                "min_run_time on to median_seconds")
    for call in sorted(m.timing_calls, key=lambda c: c.case != case):  # the criterion's own workload first
        if call.sync_given is False and call.synced == 0:
            where = f" at {call.line}" if call.line else ""
            return (f"compare called median_seconds{where} with another sync than the one compare was given, and the "
                    f"{call.case} workload's sync() never ran while it timed: pass compare's sync on to median_seconds "
                    "(compare is handed the sync of the device it measures: torch.cuda.synchronize on a GPU, here the "
                    "simulated workload's)")
    return None


@mistake("timed for fewer than min_run_time seconds")
def timed_too_little(m: Measure) -> str | None:
    """A call of median_seconds whose clock readings span fewer than its ``min_run_time`` seconds (on a workload's
    virtual clock, where every call's cost is known)."""
    for call in m.timing_calls:
        if call.timed_s is None or call.min_run_time is None or call.timed_s >= call.min_run_time * (1 - 1e-9):
            continue
        where = f" (called at {call.line})" if call.line else ""
        return (f"median_seconds{where} measured {call.timed_s:.3g} s of the {call.case} workload (from its first "
                f"reading of the clock to its last), where min_run_time was {call.min_run_time:g} s: keep timing "
                "until at least min_run_time seconds were measured, then take the median (a fixed number of calls "
                "is a few milliseconds of a fast step, and one noisy call weighs in a median of few)")
    return None


@mistake("CPU time measured instead of wall-clock time")
def cpu_clock(m: Measure) -> str | None:
    """The workloads' clocks: a CPU clock does not count the waits in sync() (``VirtualClock.cpu``)."""
    cpu = [name for name in m.clocks if name in ("process_time", "thread_time")]
    if not cpu:
        return None
    return (f"you timed with time.{cpu[0]}(), which counts this process's CPU time: the time it waits in sync() "
            "for the device's queued work is not in it, and that is most of a GPU step's. Time with "
            "time.perf_counter() (or torch.utils.benchmark.Timer)")


@mistake("the fastest call reported, not the median")
def fastest_reported(m: Measure) -> str | None:
    """median_seconds returned the outliers baseline's fastest call (``min(times)``): right on the workloads whose
    outliers are all slow, not on this one."""
    for call in m.timing_calls:
        if call.case == "outliers" and call.returned and abs(call.returned / OUTLIERS_FASTEST - 1) < 0.05:
            where = f" (called at {call.line})" if call.line else ""
            return (f"median_seconds{where} returned {call.returned:.3g} s for the outliers workload's baseline, its "
                    f"fastest call's time, where its median call takes 0.02 s (one call in four is a 0.002 s cache "
                    "hit): it reported the minimum. Report the median of the per-call times (Timer's .median)")
    return None


@mistake("saved_bytes counts tensors, not storages")
def counted_tensors(steady: Compared) -> str | None:
    """The steady candidate keeps one storage alive through views of a quarter of it each (SharedViews)."""
    storage, views, view = SHARED["storage"], SHARED["views"], SHARED["view"]
    got = steady.candidate_bytes
    ways = {views * storage: f"the storage's {storage:,} bytes once per saved tensor ({views} x {storage:,})",
            views * view: f"each view's own bytes ({views} x {view:,})",
            view: f"one view's {view:,} bytes for the storage"}
    how = next((text for wrong, text in ways.items() if got is not None and abs(got - wrong) <= 0.01 * wrong), None)
    if how is None:
        return None
    return (f"saved_bytes counted {got:,.0f} bytes for a workload whose backward saves {views} views, a quarter "
            f"each, of one {storage:,}-byte storage, that is {how}; the whole storage stays allocated while any "
            f"view of it is saved, so the memory ratio is {MEMORY_TRUTH:g}, not {steady.memory_ratio:.3g}: "
            "count each storage once, keyed by t.untyped_storage().data_ptr(), as t.untyped_storage().nbytes()")


@mistake("saved_bytes leaves out saved tensors of some kinds")
def filtered_kinds(steady: Compared) -> str | None:
    """The steady baseline saves a float32 input that needs no gradient, exp's output and int64 indices (MIXED)."""
    got, parts = steady.baseline_bytes, MIXED
    ways = {parts["no_grad"] + parts["output"]: f"the embedding's int64 indices ({parts['indices']:,} bytes)",
            parts["output"]: f"the float32 input that needs no gradient ({parts['no_grad']:,} bytes) and the "
                             f"embedding's int64 indices ({parts['indices']:,})"}
    left = next((what for wrong, what in ways.items() if got is not None and abs(got - wrong) <= 0.01 * wrong), None)
    if left is None:
        return None
    return (f"saved_bytes counted {got:,.0f} bytes for a workload whose backward saves {sum(parts.values()):,}: it "
            f"left out {left}. Autograd keeps every tensor the pack hook is handed until the backward, whatever "
            "its dtype or requires_grad: count each of them (once per storage)")


@mistake("loss summed over the batch")
def loss_summed(kind: str, losses: list[float]) -> str | None:
    ratio = losses[0] / reference_fp32()[0][0]
    if abs(ratio / BATCH - 1) > 0.02:
        return None
    return (f"the first {kind} loss is {ratio:.3g}x the float32 reference's, the batch size ({BATCH}): the "
            "cross-entropy was summed over the batch; use the mean (cross_entropy's default reduction='mean')")


@mistake("scaled loss returned")
def scaled_loss_returned(kind: str, losses: list[float]) -> str | None:
    ratio = losses[0] / reference_fp32()[0][0]
    if kind != "fp16" or ratio < 2 ** 7 or abs(ratio / 2 ** round(math.log2(ratio)) - 1) > 0.02:
        return None
    return (f"the fp16 loss train_step returned is {ratio:.0f}x the reference's, the GradScaler's scale: return "
            "the loss itself (loss.detach()), and back-propagate scaler.scale(loss)")


@mistake("optimizer.zero_grad() not called")
def grads_not_zeroed(p: PrecisionRun) -> str | None:
    step = next((i for i, n in enumerate(p.leftover) if n > 0), None)
    if step is None:
        return None
    return (f"when the backward of step {step + 1} began, .grad still held gradients of norm "
            f"{p.leftover[step]:.3g} from the step before, and backward added to them: no optimizer.zero_grad() "
            "ran between the step before and this backward (not at all, or too late); it belongs at the start of "
            "train_step, before the forward")


@mistake("optimizer.step() not called once per step")
def steps_not_one(p: PrecisionRun) -> str | None:
    bad = next(((i, n) for i, n in enumerate(p.steps) if n != 1), None)
    if bad is None:
        return None
    return (f"train_step called optimizer.step() {bad[1]} times in step {bad[0] + 1} (per step: {p.steps}): "
            "step once per train_step, after clipping")


def _unclipped(p: PrecisionRun) -> str | None:
    """The first step whose gradient norm is not max_norm, in words (``None``: every step's is)."""
    off = next(((i, n) for i, n in enumerate(p.step_norms) if abs(n / MAX_NORM - 1) > 1e-3), None)
    if off is None or off[1] == 0:  # no gradient at all: not a clipping mistake (no backward ran, say)
        return None
    return (f"the optimizer stepped with a gradient norm of {off[1]:.3g} at step {off[0] + 1}, where clipping to "
            f"max_norm={MAX_NORM} gives {MAX_NORM} on this model (every step clips)")


@mistake("gradients not clipped to max_norm")
def not_clipped(p: PrecisionRun) -> str | None:
    if not (said := _unclipped(p)):
        return None
    return f"{said}: call torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm) after backward, before the step"


@mistake("gradients clipped by value, not by norm")
def value_clipped(run) -> str | None:
    where = run.obs.lookalikes.calls.get("clip_grad_value_")
    if where is None or not (said := _unclipped(run.kind("fp32"))):
        return None
    return (f"{said}: you clipped with torch.nn.utils.clip_grad_value_ ({where}), which clamps each gradient element "
            "to ±max_norm, not their norm: call torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)")


@mistake("CUDA's autocast on the CPU")
def cuda_autocast(run) -> str | None:
    where = run.obs.lookalikes.calls.get("torch.cuda.amp.autocast")
    if where is None or run.obs.capability is not None:  # on a GPU it autocasts (under a deprecated name)
        return None
    return (f"you entered torch.cuda.amp.autocast ({where}), which autocasts CUDA ops only: on the CPU it casts "
            "nothing, so the nn.Linear outputs stayed float32 (its name is deprecated too); use "
            "torch.autocast(device_type=x.device.type, dtype=amp_dtype)")


@mistake("scaler.update() not called")
def no_update(s: Scaler) -> str | None:
    if "update" in s.events:
        return None
    return (f"{calls(s)} and never scaler.update(): the scale never adapts (it must drop "
            "after a step with inf gradients) and the next step's unscale_ raises: call scaler.update() after "
            "scaler.step(optimizer), every step")


@mistake("optimizer.step() instead of scaler.step()")
def optimizer_stepped(s: Scaler) -> str | None:
    if "step" in s.events or "optimizer.step" not in s.events:
        return None
    return (f"{calls(s)}: 'optimizer.step' but not scaler.step(optimizer), which skips "
            "steps with inf/NaN gradients (and unscales them if unscale_ was not called): call "
            "scaler.step(optimizer) instead of optimizer.step()")


@mistake("loss not scaled")
def not_scaled(s: Scaler) -> str | None:
    if "scale" in s.events:
        return None
    return (f"{calls(s)}, never scaler.scale(loss): small float16 gradients underflow "
            "to zero unless the loss is scaled; call scaler.scale(loss).backward()")


@mistake("first fp16 step skipped")
def step_skipped(s: Scaler, fp16_losses: list[float]) -> str | None:
    if "step" not in s.events or "optimizer.step" in s.events:
        return None
    why = loss_summed("fp16", fp16_losses) if fp16_losses else None
    if s.scaled_dtype == "float16":
        why = ("the loss given to scaler.scale() was float16, so the cross-entropy ran in float16 (under autocast "
               "it runs in float32), and its gradient times the scale overflows float16: compute the loss inside "
               "the autocast block") + (f"; {why}" if why else "")
    return (f"{calls(s)}: scaler.step skipped "
            "optimizer.step because the scaled gradients overflowed float16, which this model's do not at the "
            "default scale" + (f"; {why}" if why else ""))


@mistake("clipped before unscale_")
def clipped_scaled(s: Scaler) -> str | None:
    if not s.grad_norm < MAX_NORM / 100:  # nan: no optimizer.step
        return None
    return (f"the optimizer stepped with a gradient norm of {s.grad_norm:.3g}, but clipping the true gradients "
            f"gives max_norm={MAX_NORM}: you clipped the scaled gradients; call scaler.unscale_(optimizer) "
            "before clip_grad_norm_")
