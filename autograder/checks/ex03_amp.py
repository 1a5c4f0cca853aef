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
  (compute capability 8.0 or newer, ``GPU_MIN_SPEEDUP``); elsewhere reported with a note.
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
    # 6. the measuring method, on simulated workloads
    m = obs["measure"]
    for case, (truth, why) in probes.CASES_TRUTH.items():
        name = f"measuring: {probes.CASE_TITLES[case]}"
        if _err(m):
            report.check(name, 1, False, _explain(_err(m), "compare / median_seconds"))
            continue
        gone = _missing(m[case], ("speedup",))
        ok, fb = (False, gone) if gone else _ratio_fb("speedup", m[case]["speedup"], truth, why)
        report.check(name, 1, ok, fb, pass_note=fb)
    if not _err(m):
        gone = _missing(m["steady"], ("memory_ratio",))
        ok, fb = (False, gone) if gone else _ratio_fb(
            "memory_ratio", m["steady"]["memory_ratio"], probes.MEMORY_TRUTH,
            "count each storage packed by torch.autograd.graph.saved_tensors_hooks once")
        report.check("measuring: saved-activation bytes and memory ratio", 0.5, ok, fb, pass_note=fb)
    else:
        report.check("measuring: saved-activation bytes and memory ratio", 0.5, False,
                     _explain(_err(m), "saved_bytes / compare"))
    # 7. the real model: reported; required only on a GPU with bf16 tensor cores
    r = obs["real"]
    gone = "" if _err(r) else _missing(r, ("speedup", "baseline_s", "candidate_s", "memory_ratio"))
    capability = tuple(obs.get("capability") or ())
    required = on_gpu and capability >= BF16_TENSOR_CORES
    if _err(r) or gone:
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
        report.check(f"[cuda] real bf16 speedup at least {GPU_MIN_SPEEDUP}x", 1, got >= GPU_MIN_SPEEDUP,
                     gone or f"your compare() measured {got:.2f}x on the GPU; bf16 tensor cores should give "
                     f"{GPU_MIN_SPEEDUP}x or more on this wide model: is the step under autocast, and is time measured "
                     "with sync() after each call?")
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
