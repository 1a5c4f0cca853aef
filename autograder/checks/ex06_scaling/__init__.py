"""Exercise 6 check: the DDP scaling benchmark, graded on its method, then run for real; the α-β model
fitted and used to predict.

Method (deterministic, as for mixed precision): the ranks call the learner's
``measure_throughput`` on a synthetic step whose duration the grader
controls. Each call sleeps and records when it ran; the first ``warmup``
calls are slow, rank ``LATE_RANK``'s slowest of all (it arrives at the timed
steps last), and rank ``r``'s timed steps are ``1 + r/2`` times slower than
rank 0's, so the ranks arrive and finish at different times, and the classic
mistakes move the figure far outside 10% of the truth:

* counting one rank's samples reports ``1/W`` of the truth;
* timing the warm-up adds the slow first steps to the window;
* stopping the clock without a barrier times rank 0 (the fastest) alone;
* starting it without a barrier adds the late rank's warm-up to the window (so does each
  rank timing itself and taking the MAX without barriers: at 4 workers rank 1 starts last, rank 3 ends last).

The truth is computed here from the recorded step times: all ranks' timed
samples over the window from the last rank's first timed step to the last
rank's last step; every rank must return the same figure (compared exactly:
a broadcast or a MAX all-reduce copies it bit for bit). The figure is judged
against the window the learner's own clock reads span in this very run: each
read is bracketed by the grader's clock, and a correct window starts with a
read made after every rank's warm-up ended and stops with one made after every
rank's last step. That follows from the order of events (the barriers), not
from their speed, so a loaded machine that wakes a rank late moves the bounds
with the figure: no tolerance on wall-clock time. Only where no rank's clock
was seen (torch.utils.benchmark, CUDA events) is it the old 10% of the truth,
widened above by the time to ``measure_throughput``'s last return.

Then the learner's benchmark runs on the real model at
each world size; its figures and efficiency are reported, never
judged by speed (a 2-core machine running 4 workers is oversubscribed). What the
real run does is graded, from counts no figure can hide: the DistributedDataParallel
wrappers built (one, in ``make_ddp_step``, none in the steps), DDP's gradient all-reduces
(one round per step, counted by a comm hook) and the learner's own collectives inside
the step (none), the step() calls (``warmup + iters``) and the steps between the clock reads. Where
``measure_throughput`` ended the launch of the synthetic run (a hang, an error on every rank), the real step is
driven by the grader's own loop at that world size, so that ``make_ddp_step`` keeps the marks it earns.

The α-β part (``alphabeta``): in the first launch rank 0 runs the learner's ``fit_alpha_beta`` on
all-reduce times made from a known latency and bandwidth (two sets, W = 2 to 8, ±3% noise), which
it must recover within 5%, and its ``predict_efficiency`` on four cases (W = 1, 4, 8, 16; the
all-reduce hidden by the backward or not), which must be the ring model's to float rounding. The
causes name the variant of the model that makes the learner's figures from the same inputs.

The rank side (``probes``) records each clock read and collective of the learner's file (with
the steps done then), however the file imported them: a cause is named on that evidence, and on the
figure's ratio to the truth only where the evidence is missing.

| mistake | message |
|---|---|
| CPU time measured instead of wall-clock time | "you timed with time.process_time(), which counts ... CPU time ..." |
| the ranks' elapsed times summed (all_reduce's default SUM) | "you all-reduced the elapsed time with SUM ..." |
| counted one rank's samples | "you counted one rank's samples: the 2 ranks trained 512 ..." |
| clock stopped without a barrier (rank 0's own time) | "that is rank 0's own time (0.24 s) while ... 0.36 s: ..." |
| warm-up steps timed | "your window (0.44 s) includes the 2 slow warm-up steps: ..." |
| warm-up steps' samples counted | "that is (2 + 8) / 8: you counted the samples of the 2 warm-up steps too" |
| clock started without a barrier (a rank still warming up) | "rank 0 started the clock when its own warm-up ..." |
| clock started before the barrier that lines the ranks up | "rank 0 read the clock ..., then called dist.barrier()" |
| the figure returned as a tensor, not a float | "measure_throughput returned a Tensor on rank 0, where its ..." |
| no figure returned | "measure_throughput returned None on rank 0, so there is no figure to judge: ..." |
| a different figure on every rank | "rank 1 returned 1,420.3 samples/s but rank 0 returned 1,776.0: ..." |
| the lr given to make_ddp_step not used | "the optimizer stepped with lr=0.01, where make_ddp_step was given ..." |
| the step does not use DDP | "... (they started from different weights, and no DistributedDataParallel was made)" |
| forward called on the inner module, bypassing DDP | "... but no forward went through the wrapper ..." |
| the DDP wrapper rebuilt in every step | "at 2 worker(s) step() built a new DistributedDataParallel in 7 of ..." |
| not one DDP wrapper built by make_ddp_step | "at 2 worker(s) make_ddp_step built 2 DistributedDataParallel ..." |
| gradients not all-reduced once per step | "at 2 worker(s) DDP all-reduced the gradients 0 times in 7 steps: ..." |
| a collective of your own in every step | "at 2 worker(s) step() itself called dist.barrier (7 calls in 7 steps) ..." |
| the real run timed other steps than the iters after the warm-up | "on the real model your clock started after 0 ..." |
| nothing returned | "fit_alpha_beta returned None: every path through it must end in return (alpha, beta)" |
| the bandwidth returned as beta | "you returned 2e+09 as β: that is a bandwidth, bytes a second ..." |
| elements fitted as bytes | "your β (...) is 4.01x the 5e-10, as a fit on the rows' numel gives ..." |
| the latency counted once per all-reduce | "your α (97.1 µs) is 2.43x ... 14α = 560.0 µs: 7x too little" |
| the bandwidth term without the ring's factor | "your β ... is 1.14x ..., as bytes * β gives ..." |
| the bandwidth term without (W-1)/W | "your β ... is 0.57x ..., as 2 * bytes * β gives ..." |
| least squares in seconds, not relative | "your α (63.6 µs) is 1.59x ..., as least squares in seconds gives ..." |
| the speed-up predicted, not the efficiency | "you predicted 2.02 at W=8, the speed-up W * t_step(1) / t_step(W) ..." |
| the all-reduce not overlapped with the backward | "... you predicted 0.219, the step with the whole all-reduce ..." |
| the all-reduce hidden under the whole step | "... you predicted 0.281, as max(step, all-reduce) gives ..." |
| the latency counted once in the prediction | "... with one latency (40.0 µs) ... 2(W-1) = 14 steps ..." |
| the prediction's bandwidth term without the ring's factor | "... moving bytes * β: ... 2(W-1)/W = 1.75 ..." |
| the prediction's bandwidth term without (W-1)/W | "... with 2 * bytes * β: the ring's factor is 2(W-1)/W = 1.75 ..." |
| the exposed all-reduce not clamped at 0 | "... as compute + (all-reduce - backward) gives where ..." |
| the prediction's bandwidth term half the ring's | "... with (W-1)/W * bytes * β, one reduce-scatter's worth: ..." |
| the step's optimizer not plain SGD | "the optimizer that stepped was SGD with momentum=0.9, where ..." |
| make_ddp_step returned no step function | "make_ddp_step returned None, not a function, so the benchmark ..." |
| the optimizer stepped with no gradient (before backward, or after zero_grad) | "opt.step() ran 7 times in 7 ..." |
| gradients never cleared in the step | "at 2 worker(s) rank 0's weights after 35 calls of step() are those ..." |
| the loss summed over the batch, not its mean | "... are those of SGD on each batch's summed cross-entropy ..." |
| optimizer.step() not called in the step | "in 7 calls of step() no optimizer stepped (DDP all-reduced the ..." |
| a Python float passed to a collective | (TypeError "Expected parameter `tensor` ...") "collectives work on tensors" |
| the process group initialised again in the benchmark | (ValueError "... initialize ... twice") "..." |
| a CPU tensor in an NCCL collective | (RuntimeError "No backend type associated with device type cpu") "..." |
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator, Sequence

import torch

from distlab.measure.timing import cpu_cores
from distlab.runtime.process import Budget

from ...grader.diagnosis import diagnose
from ...grader.parity import parity
from ...grader.launches import launch_timeout
from ...grader.parts import Parted, judge_parts, launch_parts
from ...grader.registry import Exercise
from ...grader.report import ExerciseReport, Verdict, criterion, failed, passed
from .alphabeta.reference import CASES, DATASETS, FIT_TOL, NOISE, PREDICT_RTOL, close, predict
from .alphabeta.observations import Fit, Prediction
from .alphabeta.causes import FIT_CAUSES, PREDICT_CAUSES, first_unknown, returned_nothing
from .causes import (KNOWN_ERRORS, clock_before_barrier, cpu_clock, figure_not_float, figure_per_rank, no_barrier,
                     no_figure, no_start_barrier, one_rank_samples, summed_clocks, warmup_samples, warmup_timed)
from .real_causes import (ATOL, REAL_CAUSES, RTOL, grads_accumulate, inner_forward, lr_not_used, no_ddp,
                          no_optimizer_step, no_step_function, not_plain_sgd, stepped_without_grad, summed_loss)
from .observations import REAL, SYNTH, Benchmark, RankObservation, Run
from .probes import TOL, rank_main
from .reference import real_reference

READ_SLACK = 0.002  # the window against the clock reads' brackets: float rounding only

__all__ = ["CRITERIA", "EXERCISE", "KNOWN_ERRORS", "WORLD_SIZES", "grade", "launch_timeouts"]

EXERCISE = Exercise(number=6, name="scaling", filename="ex06_scaling.py", max_score=10, time_limit=150)
WORLD_SIZES = (1, 2, 4)
# What measure_throughput returns is a measurement of time: no two runs share it, so the first divergence from
# the reference's trace does not compare it (``grader.divergence``).
MEASURED_RETURNS = ("measure_throughput",)


# The causes (causes) the method's criterion asks for, most specific first.
METHOD_CAUSES = [cpu_clock, summed_clocks, one_rank_samples, no_barrier, warmup_timed, clock_before_barrier,
                 no_start_barrier, warmup_samples]


def _window_ok(run: Run) -> bool:
    """Whether rank 0's figure comes from a window a correct method timed in this very run: between the
    clock reads the ranks made in time (:meth:`Run.read_windows`), or, where no rank's clock was seen,
    from the truth's window to the last return of ``measure_throughput``. Either bound follows from the
    order of events, so a loaded machine moves both with the figure."""
    got, reads = run.window(), run.read_windows()
    lo, hi = reads if reads is not None else run.step_windows()
    slack = READ_SLACK if reads is not None else TOL  # float rounding; or the old tolerance, without reads
    return reads != (0.0, 0.0) and lo * (1 - slack) <= got <= hi * (1 + slack)


# Worth 2 at each of the three world sizes a learner is graded at (6 of 14 for the method).
@criterion("[W={world}] throughput of the timed steps of every rank", points=2)
def throughput_within_tolerance(run: Run) -> Verdict:
    want = SYNTH["warmup"] + SYNTH["iters"]
    bad = [(r.rank, len(r.times)) for r in run.ranks if len(r.times) != want]
    if bad:
        return failed(f"step() was called {bad[0][1]} times on rank {bad[0][0]}; expected warmup + iters = {want}")
    if silent := no_figure(run) or (run.world == WORLD_SIZES[0] and figure_not_float(run)):  # said once
        return failed(silent)
    t, got, ratio = run.truth(), run.ranks[0].reported, run.ratio()
    measured = {f"W{run.world}_synthetic_reported_over_truth": round(ratio, 3)}
    if _window_ok(run) and not figure_per_rank(run):
        return passed(f"your window {run.window():.3f} s, the timed steps {t.window:.3f} s, the same figure on "
                      "every rank", **measured)
    why = "" if _window_ok(run) else diagnose(METHOD_CAUSES, run)
    if not why and not _window_ok(run):
        why = ("your window is shorter than the time the ranks spent on the timed steps" if ratio > 1 else
               "your window is longer than the timed steps: time only the iters steps, after the warm-up")
    cause = (f"you reported {got:,.0f} samples/s at {run.world} rank(s); the ranks trained {t.samples} samples "
             f"in {t.window:.3f} s, {t.truth:,.0f} samples/s (ratio {ratio:.2f})" + (f": {why}" if why else ""))
    apart = figure_per_rank(run)
    return failed(f"{apart}; {cause}" if apart else cause, **measured)


METHOD_CRITERIA = [throughput_within_tolerance]  # judged at every world size


def _untrained(run: Run) -> str:
    """'' if the real step trained the model identically on every rank, else what went wrong."""
    first = run.ranks[0]
    if first.step_error:
        return f"make_ddp_step raised {first.step_error}"
    if all(torch.equal(first.initial[k], first.final[k]) for k in first.final):
        return diagnose([no_step_function, stepped_without_grad, no_optimizer_step], run) or \
            "the parameters did not change: the step must run forward, backward and optimizer.step()"
    return diagnose([no_ddp, inner_forward], run) or ""


def _off_reference(run: Run) -> str:
    """'' if the real step's weights are one process's SGD on the mean of the ranks' gradients, else how not."""
    r0 = run.ranks[0]
    if not r0.real_steps:
        return ""
    match = parity(r0.final, real_reference(run), rtol=RTOL, atol=ATOL)
    if match.ok:
        return ""
    return diagnose([not_plain_sgd, lr_not_used, grads_accumulate, summed_loss], run) or (
        f"at {run.world} worker(s), after {r0.real_steps} calls of step() rank 0's weights differ from one "
        f"process's SGD (lr={run.real['lr']}) on the mean of the {run.world} ranks' gradients, from rank 0's start "
        f"(max abs difference {match.max_abs_diff:.3g} in '{match.worst}'): each call is one forward, backward "
        "and step on this rank's batch, on the mean cross-entropy")


@criterion("the real step trains with DDP", points=2)
def trains_with_ddp(bench: Benchmark) -> Verdict:
    problems = [p for run in bench.runs if (p := _untrained(run) or _off_reference(run))]
    return failed(problems[0]) if problems else passed("parameters agree on every rank with one process's SGD on "
                                                       "the mean of the ranks' gradients")


@criterion("the real run: one DDP wrapper, one all-reduce per step, the steps after the warm-up timed", points=2)
def real_run_counted(bench: Benchmark) -> Verdict:
    # Not judged where the step did not train with DDP at all (its counts are that mistake's); a step that trains
    # wrongly through DDP (its gradients never cleared) still makes the wrapper, the all-reduces and the steps
    if any(_untrained(run) for run in bench.runs):
        return failed(f"not checked: needs '{trains_with_ddp.rule.name}' first")
    runs = [run for run in bench.runs if run.ranks[0].real_steps is not None]
    for run in runs:
        if why := diagnose(REAL_CAUSES, run):
            return failed(why)
    steps = {run.ranks[0].real_steps for run in runs}
    driven = [run.world for run in runs if run.ranks[0].driven]
    return passed(f"{'/'.join(map(str, sorted(steps)))} steps, one wrapper and one gradient all-reduce per step "
                  f"at {', '.join(str(run.world) for run in runs)} worker(s)" +
                  (f" (at {', '.join(map(str, driven))} worker(s) the grader's loop ran the steps, as your "
                   "measure_throughput did not finish there: its clock is judged by the throughput's criterion)"
                   if driven else ""))


def _missing(values: list[Fit] | list[Prediction], want: int, what: str) -> str:
    """'' if the learner's function answered all ``want`` cases, else why not (its error, at its line)."""
    if len(values) != want:
        return f"{what} was not run (the first launch did not get that far)"
    error = next((v.error for v in values if v.error), None)
    return f"{what} raised {error}" if error else (returned_nothing(what, values) or "")


@criterion("α and β fitted to all-reduce times at several world sizes", points=2)
def alpha_beta_fitted(bench: Benchmark) -> Verdict:
    fits = bench.model.fits
    if problem := _missing(fits, len(DATASETS), "fit_alpha_beta"):
        return failed(problem)
    errors = []
    for data, got in zip(DATASETS, fits):
        (a, b), worlds = got.value, sorted({r["world"] for r in data["rows"]})
        errors.append(max(abs(a / data["alpha"] - 1), abs(b / data["beta"] - 1)))
        if errors[-1] > FIT_TOL:
            why = diagnose(FIT_CAUSES, (a, b), data) or (
                "write each row as one equation, t = 2(W-1) * α + 2(W-1)/W * bytes * β, and solve all of them "
                "at once by least squares on the relative errors")
            return failed(f"on the {data['name']} times ({len(data['rows'])} all-reduces at W = "
                          f"{', '.join(map(str, worlds))}, made with α = {data['alpha'] * 1e6:g} µs and β = "
                          f"{data['beta']:.3g} s a byte, ±{NOISE:.0%} noise) you fitted α = {a * 1e6:.4g} µs, "
                          f"β = {b:.4g}, not within {FIT_TOL:.0%}: {why}", fit_max_rel_error=round(errors[-1], 4))
    return passed(f"α and β within {max(errors):.1%} of the truth on {len(DATASETS)} sets of times",
                  fit_max_rel_error=round(max(errors), 4))


@criterion("efficiency predicted at unmeasured W, the all-reduce overlapping the backward", points=2)
def efficiency_predicted(bench: Benchmark) -> Verdict:
    predictions = bench.model.predictions
    if problem := _missing(predictions, len(CASES), "predict_efficiency"):
        return failed(problem)
    got = [v.value for v in predictions]
    wrong = [i for i, (g, c) in enumerate(zip(got, CASES)) if not close(g, predict(c), PREDICT_RTOL)]
    if not wrong:
        return passed(f"{len(CASES)} cases, W = {', '.join(str(c['world']) for c in CASES)}")
    if why := diagnose(PREDICT_CAUSES, got):
        return failed(why)
    c = CASES[wrong[0]]
    where = first_unknown(predictions[wrong[0]].numbers, c) or (
        "the step is compute + max(0, all-reduce - backward), the efficiency t_step(1) / t_step(W)")
    return failed(f"at W={c['world']} (compute_s={c['compute_s']:g}, backward_s={c['backward_s']:g}, "
                  f"grad_bytes={c['grad_bytes']:g}, alpha={c['alpha']:g}, beta={c['beta']:g}) you predicted "
                  f"{got[wrong[0]]:.4g}, the model {predict(c):.4g}: {where}")


CRITERIA = [trains_with_ddp, real_run_counted, alpha_beta_fitted, efficiency_predicted]  # once, after every launch


def _notes(report: ExerciseReport, bench: Benchmark) -> None:
    """The real figures, as notes: reported, never graded (speed depends on the machine)."""
    thr, backend, cores = bench.figures, bench.runs[-1].ranks[0].backend, cpu_cores()
    if not thr:  # no real run returned a figure: its criteria say why
        return
    report.measurements["real_samples_per_s"] = {str(k): round(v, 1) for k, v in thr.items()}
    report.notes.append("Your benchmark on the real model (reported, not graded: speed depends on the machine):")
    for w in sorted(thr):
        e = f", efficiency {thr[w] / (w * thr[1]):.0%}" if 1 in thr else ""
        over = " (oversubscribed)" if backend == "gloo" and w > cores else ""
        report.notes.append(f"  {w} worker(s): {thr[w]:,.0f} samples/s{e}{over}")
    if backend == "gloo" and max(thr, default=0) > cores:
        report.notes.append(f"  This machine has {cores} CPU cores: with more workers than cores they take turns "
                            "on the cores, so the efficiency there measures contention, not DDP.")


def launch_timeouts(world_sizes: Sequence[int], files: int = 1) -> dict[int, Budget]:
    """The budget of each launch: one file's launches share the exercise's budget by weight 2 + W
    (start-up grows with the ranks), so that a hang is a ``LaunchTimeout`` naming the ranks, inside
    ``time_limit``; each more file adds ``launch_timeout``'s per-file seconds to every launch."""
    weight = {w: 2 + w for w in world_sizes}
    total = sum(weight.values())
    return {w: launch_timeout(EXERCISE, files=files, share=weight[w] / total) for w in world_sizes}


def _launches(paths: Sequence[Path], world_sizes: Sequence[int], real: dict) -> Iterator[tuple[int, list[Parted],
                                                                                                float | None]]:
    """One launch per world size, in order (one more for each part that ends one: ``grader.parts``); the first
    also runs the α-β part (rank 0). Yields ``(world, every file's parts, seconds)``."""
    timeouts = launch_timeouts(world_sizes, files=len(paths))
    for world in world_sizes:
        parts = ["model", "method", "real"] if world == world_sizes[0] else ["method", "real"]
        parted, wall_s = launch_parts(rank_main, paths, world=world, timeout=timeouts[world], parts=parts,
                                      args=(real, parts), known=KNOWN_ERRORS)
        yield world, parted, wall_s


def _run(file: Parted, world: int, cfg: dict) -> Run:
    """The file's launch at ``world`` ranks as the criteria read it: each rank's method and real parts in one
    observation (a part that ended its launch stands empty: its criteria are not judged)."""
    method = file.part("method") or [RankObservation(rank=r, backend="", reported=None, returned=0.0,
                                                     times=torch.empty(0, 2, dtype=torch.float64)).to_wire()
                                     for r in range(world)]
    real = file.part("real") or [{} for _ in range(world)]
    model = file.ranks[0].get("model") if "model" not in file.ended else None
    return Run([RankObservation.from_wire({**m, **f, "model": model if r == 0 else None})
                for r, (m, f) in enumerate(zip(method, real))], cfg)


# the criteria judged once, after every launch, by the part they read: the part's name where it ended
ONCE = {"real": ("the real benchmark (make_ddp_step, then measure_throughput)", [trains_with_ddp, real_run_counted]),
        "model": ("the α-β part (fit_alpha_beta, predict_efficiency)", [alpha_beta_fitted, efficiency_predicted])}


def grade(paths: Sequence[Path], world_sizes: tuple[int, ...] = WORLD_SIZES,
          real: dict | None = None) -> list[ExerciseReport]:
    """Grade the files at ``paths``, one launch per world size for all of them; one report each.

    Tests pass fewer ``world_sizes``, and ``real`` to override the real benchmark's settings (fewer
    steps).
    """
    reports = [EXERCISE.new_report() for _ in paths]
    benches = [Benchmark([]) for _ in paths]
    ended: list[dict[str, str]] = [{} for _ in paths]  # part -> how it ended a launch, at its first world size
    cfg = {**REAL, **(real or {})}
    for world, parted, wall_s in _launches(paths, world_sizes, cfg):
        for report, bench, file, gone in zip(reports, benches, parted, ended):
            bench.runs.append(_run(file, world, cfg))
            for part, how in file.ended.items():
                gone.setdefault(part, f"at {world} worker(s), {how}")
            judge_parts(report, {"method": ("measure_throughput", METHOD_CRITERIA)}, file.ended, bench.runs[-1],
                        world=world)
            if wall_s is not None:
                report.measurements[f"W{world}_launch_s"] = round(wall_s, 2)
    for report, bench, gone in zip(reports, benches, ended):
        judge_parts(report, ONCE, gone, bench)
        _notes(report, bench)
    return [r.scale_to() for r in reports]
