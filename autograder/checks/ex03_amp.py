"""Exercise 3 check: autocast training step, GradScaler order, and the method of measuring.

One rank (mixed precision is not about several processes) runs the learner's
functions under instruments and returns observations; every verdict is
computed here, against references computed here:

* forward hooks record the ``nn.Linear`` output dtypes inside autocast, and a
  recording optimizer the parameter and gradient dtypes at ``step()``;
* the float32 step is compared with a single-process reference
  (assert_close), the bf16 and fp16 losses over ``STEPS`` steps with the
  reference's float32 losses within ``LOSS_TOL``;
* a recording ``GradScaler`` logs the call order, the optimizer the gradient
  norm it steps with (``max_norm`` if clipped after unscaling, ``max_norm /
  scale`` if clipped before), and a batch with an ``inf`` must be skipped;
* ``compare`` runs on :class:`distlab.timing.SimulatedWorkload` s under a
  :class:`distlab.timing.VirtualClock`, whose true speedup and memory ratio
  the grader knows, so missing warm-up, missing synchronisation, a mean
  dragged by outliers and an inverted ratio fail deterministically on any
  machine (within ``RATIO_TOL``); then it runs on the real model and its
  figures are reported, and required only on a GPU with bf16 tensor cores
  (compute capability 8.0 or newer, ``GPU_MIN_SPEEDUP``); elsewhere reported with a note;
* the steady candidate saves one storage as three tensors (``exp``'s output
  and two views of it, ``probes.SHARED``), so counting per saved tensor
  instead of per storage gives a wrong memory ratio;
* ``distlab.timing.median_seconds`` and ``distlab.memory.saved_tensor_bytes``
  (and ``distributed_median_seconds``), which the notebooks use, are working
  copies of the graded ``median_seconds`` and ``saved_bytes``: the rank records
  whether the learner's function *is* one (``probes.ANSWERS.identify``) and
  which ran during the learner's ``compare`` calls (``probes.ANSWERS.watch``),
  see :mod:`autograder.answers`. A copy earns none of its function's criteria,
  and the real model is then not measured (its seconds would be the runtime's).

Mistakes whose messages this check names (the older ones: see the tests):

=====================================================  =====================================================
mistake                                                message (criteria at 0)
=====================================================  =====================================================
``from distlab.timing import median_seconds``, or      "median_seconds is distlab's copy
``median_seconds = distlab.timing.median_seconds``     (distlab.timing.median_seconds): write your own"
                                                       (the four speedup criteria, and the [cuda] one)
a ``median_seconds`` that delegates to the copy        "median_seconds is distlab's copy (it calls
(also through a name bound at import)                  distlab.timing.median_seconds): write your own"
``compare`` that calls the copy instead of the         "compare calls distlab's copy of median_seconds
learner's ``median_seconds``                           (distlab.timing.median_seconds) instead of yours:
                                                       write your own median_seconds and call it"
``saved_bytes`` imported, aliased, or delegating       "saved_bytes is distlab's copy
(also through ``distlab.memory.peak_memory``)          (distlab.memory.saved_tensor_bytes): write your own",
                                                       or "(it calls ...)" (the memory criterion)
``saved_bytes`` counts each saved tensor, not each     "saved_bytes counted 300,000 bytes for a workload
storage (``storages[len(storages)] = nbytes``)         whose backward saves 3 tensors sharing one
                                                       100,000-byte storage (...); the storage holds
                                                       100,000 bytes, so the memory ratio is 0.25, not
                                                       0.75: count each storage once, keyed by
                                                       t.untyped_storage().data_ptr(), not each tensor"
... or adds ``t.numel() * t.element_size()``           the same, "counted 200,000 bytes ... each tensor's
per tensor                                             own size (100,000 + 2 x 50,000) ... not 0.5"
=====================================================  =====================================================
"""
from __future__ import annotations


from distlab import device as rank_device

from ..grading import grade_files
from ..harness import CapturedPrints, echo, load_learner
from ..parity import parity
from ..registry import Exercise
from ..report import ExerciseReport
from . import _ex03_probes as probes

EXERCISE = Exercise(number=3, name="amp", filename="ex03_amp.py", max_score=10, time_limit=90)
LOSS_TOL = 0.01          # |loss - fp32 reference loss| <= LOSS_TOL * max(1, |reference|), every step
RATIO_TOL = 0.10         # a reported ratio within 10% of the truth
GPU_MIN_SPEEDUP = 1.5    # bf16 over fp32 on the real model, required on a GPU with bf16 tensor cores only
BF16_TENSOR_CORES = (8, 0)  # Ampere and newer: bf16 matmuls on tensor cores
RTOL, ATOL = 1e-4, 1e-5  # float32 step vs the single-process reference


def rank_main(paths: list[str]) -> list[dict]:
    """Runs on the one rank: observe each learner file (tests grade several per launch)."""
    device = rank_device()
    out = []
    for path in paths:
        learner = load_learner(path)
        with CapturedPrints() as printed:
            obs = probes.observe(learner, device)
        echo(printed.lines)
        out.append(obs)
    return out


def _err(part: dict) -> str:
    return part.get("error", "")


def _explain(error: str, what: str) -> str:
    if error.startswith("NotImplementedError"):
        return f"not implemented yet ({what})"
    return f"{what} raised {error}"


def _ratio_fb(name: str, got: float, truth: float, why: str) -> tuple[bool, str]:
    ok = abs(got / truth - 1) <= RATIO_TOL
    if ok:
        return True, f"{got:.3g} (truth {truth:.3g})"
    if abs(got * truth - 1) <= RATIO_TOL:
        return False, (f"{name}: you reported {got:.3g} where the truth is {truth:.3g}, its inverse: "
                       "speedup = baseline_s / candidate_s and memory_ratio = candidate_bytes / baseline_bytes")
    return False, f"{name}: you reported {got:.3g} where the truth is {truth:.3g} (more than {RATIO_TOL:.0%} off): {why}"


def _missing(part: dict, keys: tuple[str, ...]) -> str:
    """Feedback when compare() returned a dict without some of the contract's keys ("" if none missing)."""
    gone = [k for k in keys if k not in part]
    if not gone:
        return ""
    return (f"compare() returned a dict without {', '.join(repr(k) for k in gone)} (it had {sorted(part)}): "
            "return baseline_s, candidate_s, speedup, baseline_bytes, candidate_bytes and memory_ratio")


def _shared_storage_fb(steady: dict) -> str:
    """Feedback when the steady candidate's bytes are those of counting each saved tensor ("" if not)."""
    storage, views = probes.SHARED["storage"], probes.SHARED["views"]
    tensors = views + 1
    per_tensor, by_size = tensors * storage, 2 * storage  # the views partition the storage
    got = steady.get("candidate_bytes")
    if got is None or not any(abs(got - wrong) <= 0.01 * wrong for wrong in (per_tensor, by_size)):
        return ""
    once_per_tensor = abs(got - per_tensor) <= 0.01 * per_tensor
    how = (f"the storage's bytes once per tensor ({tensors} x {storage:,})" if once_per_tensor
           else f"each tensor's own size ({storage:,} + {views} x {storage // views:,})")
    return (f"saved_bytes counted {got:,.0f} bytes for a workload whose backward saves {tensors} tensors sharing "
            f"one {storage:,}-byte storage (exp's output and {views} views of it), that is {how}; the storage "
            f"holds {storage:,} bytes, so the memory ratio is {probes.MEMORY_TRUTH:g}, not "
            f"{steady['memory_ratio']:.3g}: count each storage once, keyed by t.untyped_storage().data_ptr(), "
            "not each tensor")


def _verdicts(report: ExerciseReport, obs: dict) -> None:
    on_gpu = obs.get("capability") is not None  # the rank ran on a CUDA device
    # 1. autocast: low-precision linear outputs, fp32 master weights and gradients
    a = obs["autocast"]
    if _err(a):
        report.check("bf16 autocast: linear outputs bf16, master weights float32", 1.5, False,
                     _explain(_err(a), "train_step"))
    else:
        outs, params, grads = a["linear_out"], a["param_dtypes"], a["grad_dtypes"]
        fb = ""
        if any(d != "torch.float32" for d in params + grads):
            fb = (f"at optimizer.step() parameters were {sorted(set(params))} and gradients {sorted(set(grads))}: "
                  "keep the model in float32 (do not call model.to(torch.bfloat16)); autocast casts per op")
        elif any(d != "torch.bfloat16" for d in outs):
            fb = (f"the nn.Linear outputs were {outs}: run the forward pass and the loss inside "
                  "torch.autocast(device_type=x.device.type, dtype=amp_dtype)")
        report.check("bf16 autocast: linear outputs bf16, master weights float32", 1.5, not fb, fb)
    # 2. float32 parity, 3. losses within tolerance
    p = obs["parity"]
    ref_losses, ref_state = probes.reference_fp32()
    if _err(p):
        report.check("float32 step matches a single-process reference", 0.5, False, _explain(_err(p), "train_step"))
        report.check(f"bf16 and fp16 losses within {LOSS_TOL} of float32 over {probes.STEPS} steps", 1, False,
                     _explain(_err(p), "train_step"))
    else:
        same = parity(p["fp32_state"], ref_state, rtol=RTOL, atol=ATOL)
        report.check("float32 step matches a single-process reference", 0.5, same.ok,
                     f"after {probes.STEPS} float32 steps the weights differ from zero_grad, cross-entropy, "
                     f"backward, clip_grad_norm_(max_norm={probes.MAX_NORM}), step (max abs difference "
                     f"{same.max_abs_diff:.3g} in {same.worst})",
                     pass_note=f"max abs difference {same.max_abs_diff:.2g}")
        worst = []
        for kind in ("bf16", "fp16"):
            gaps = [abs(l - r) / max(1.0, abs(r)) for l, r in zip(p[f"{kind}_losses"], ref_losses)]
            worst.append((max(gaps), kind, gaps.index(max(gaps))))
        gap, kind, step = max(worst)
        report.measurements.update(bf16_max_loss_gap=worst[0][0], fp16_max_loss_gap=worst[1][0])
        report.check(f"bf16 and fp16 losses within {LOSS_TOL} of float32 over {probes.STEPS} steps", 1,
                     gap <= LOSS_TOL,
                     f"the {kind} loss at step {step} is {gap:.3g} away from the float32 reference's "
                     f"(tolerance {LOSS_TOL}): are forward and loss under autocast, and the scaler used for fp16?",
                     pass_note=f"largest gap {gap:.2g} ({kind})")
    # 4. GradScaler order, 5. inf step skipped
    s = obs["scaler"]
    if _err(s):
        for name, pts in (("fp16 GradScaler order", 1.5), ("fp16 step with inf gradients is skipped", 1)):
            report.check(name, pts, False, _explain(_err(s), "train_step with a scaler"))
    else:
        expected = ["scale", "backward", "unscale_", "step", "optimizer.step", "update"]
        order_fb = ""
        if s["events"] != expected:
            order_fb = (f"one fp16 step called {s['events']}; expected {expected}: scaler.scale(loss).backward(), "
                        "scaler.unscale_(optimizer), clip, scaler.step(optimizer), scaler.update()")
        elif abs(s["grad_norm"] - probes.MAX_NORM) > 1e-3 * probes.MAX_NORM:
            order_fb = (f"the optimizer stepped with a gradient norm of {s['grad_norm']:.3g}, but clipping the true "
                        f"gradients gives max_norm={probes.MAX_NORM}" + (
                            ": you clipped the scaled gradients; call scaler.unscale_(optimizer) before "
                            "clip_grad_norm_" if s["grad_norm"] < probes.MAX_NORM / 100 else
                            ": clip with torch.nn.utils.clip_grad_norm_ after scaler.unscale_"))
        report.check("fp16 GradScaler order: scale, backward, unscale_, clip, step, update", 1.5, not order_fb,
                     order_fb)
        skip_ok = s["inf_params_unchanged"] and s["scale_after_inf"] < s["scale_before_inf"]
        report.check("fp16 step with inf gradients is skipped", 1, skip_ok,
                     "a batch containing inf changed the weights: step through scaler.step(optimizer), which "
                     "skips non-finite steps" if not s["inf_params_unchanged"] else
                     f"the scale stayed {s['scale_after_inf']:g} after an inf step: call scaler.update() every step")
    # 6. the measuring method, on simulated workloads; a graded function that is the runtime's copy earns nothing
    answers = obs.get("answers", {})
    copied = {fn: probes.ANSWERS.feedback(fn, answers.get("is", {}), answers.get("calls", []))
              for fn in probes.ANSWERS.graded}
    m = obs["measure"]
    for case, (truth, why) in probes.CASES_TRUTH.items():
        name = f"measuring: {probes.CASE_TITLES[case]}"
        if copied["median_seconds"]:
            report.check(name, 1, False, copied["median_seconds"])
            continue
        if _err(m):
            report.check(name, 1, False, _explain(_err(m), "compare / median_seconds"))
            continue
        gone = _missing(m[case], ("speedup",))
        ok, fb = (False, gone) if gone else _ratio_fb("speedup", m[case]["speedup"], truth, why)
        report.check(name, 1, ok, fb, pass_note=fb)
    if copied["saved_bytes"]:
        report.check("measuring: saved-activation bytes and memory ratio", 0.5, False, copied["saved_bytes"])
    elif not _err(m):
        gone = _missing(m["steady"], ("memory_ratio",))
        ok, fb = (False, gone) if gone else _ratio_fb(
            "memory_ratio", m["steady"]["memory_ratio"], probes.MEMORY_TRUTH,
            "count each storage packed by torch.autograd.graph.saved_tensors_hooks once")
        if not ok and not gone:
            fb = _shared_storage_fb(m["steady"]) or fb
        report.check("measuring: saved-activation bytes and memory ratio", 0.5, ok, fb, pass_note=fb)
    else:
        report.check("measuring: saved-activation bytes and memory ratio", 0.5, False,
                     _explain(_err(m), "saved_bytes / compare"))
    # 7. the real model: reported; required only on a GPU with bf16 tensor cores
    r = obs["real"]
    gone = "" if _err(r) or r.get("skipped") else _missing(r, ("speedup", "baseline_s", "candidate_s", "memory_ratio"))
    capability = tuple(obs.get("capability") or ())
    required = on_gpu and capability >= BF16_TENSOR_CORES
    if r.get("skipped"):
        report.notes.append(f"real-model measurement skipped: {copied[r['skipped']]}")
        got = 0.0
    elif _err(r) or gone:
        report.notes.append(f"real-model measurement not available: {gone or _explain(_err(r), 'compare')}")
        got = 0.0
    else:
        got = r["speedup"]
        report.measurements.update({f"real_{k}": v for k, v in r.items() if isinstance(v, (int, float))})
        report.notes.append(
            f"On this machine ({r['device']}, {r['model']}), your compare() measured bf16 autocast "
            f"{r['speedup']:.2f}x the speed of float32 ({r['baseline_s'] * 1e3:.2f} ms vs "
            f"{r['candidate_s'] * 1e3:.2f} ms per step) and {r['memory_ratio']:.2f}x its saved-activation "
            f"bytes. The grader's own memory measurement: {r['peak_ratio']:.2f}x, by {r['peak_method']}.")
        if not on_gpu:
            report.notes.append("On a CPU the speedup is reported, not graded: bf16 matmuls are only fast where "
                                "the CPU has bf16 matrix instructions (AMX); a shared machine adds noise.")
        elif not required:
            report.notes.append(f"This GPU has compute capability {'.'.join(map(str, capability))}, without bf16 "
                                f"tensor cores (8.0+): the speedup is reported, not graded (at least "
                                f"{GPU_MIN_SPEEDUP}x is required on 8.0 and newer).")
    if required:
        report.check(f"[cuda] real bf16 speedup at least {GPU_MIN_SPEEDUP}x", 1,
                     got >= GPU_MIN_SPEEDUP and not copied["median_seconds"],
                     copied["median_seconds"] or gone or f"your compare() measured {got:.2f}x on the GPU; bf16 "
                     f"tensor cores should give {GPU_MIN_SPEEDUP}x or more on this wide model: is the step under "
                     "autocast, and is time measured with sync() after each call?")
        for c in report.criteria:  # keep the maximum at 10 with the GPU criterion added
            c.points, c.earned = c.points * 10 / 11, c.earned * 10 / 11


def grade_many(paths: list) -> list[ExerciseReport]:
    """Grade several files in one launch (the test suite's mutants).

    For one file the launch's timeout (``time_limit - 20`` s) fits inside the exercise's
    ``time_limit``, so a hang is reported as a ``LaunchTimeout`` rather than cut by the outer limit.
    """
    timeout = EXERCISE.time_limit - 20 + 15 * (len(paths) - 1)
    return grade_files(EXERCISE, rank_main, paths, world=1, timeout=timeout,
                       verdict=lambda report, per_rank: _verdicts(report, per_rank[0]))


def grade(path) -> ExerciseReport:
    """Grade the file at ``path`` (one launch, one rank)."""
    return grade_many([path])[0]
