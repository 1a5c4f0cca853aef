"""Exercise 6 check: the DDP scaling benchmark, graded on its method, then run for real.

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
a broadcast or a MAX all-reduce copies it bit for bit). Then the learner's benchmark runs on the real model at
each world size; its figures, efficiency, JSON and plot are reported, never
judged by speed (a 2-core machine running 4 workers is oversubscribed). What the
real run does is graded, from counts no figure can hide: the DistributedDataParallel
wrappers built (one, in ``make_ddp_step``, none in the steps), DDP's gradient all-reduces
(one round per step, counted by a comm hook) and the learner's own collectives inside
the step (none), the step() calls (``warmup + iters``) and the steps between the clock reads.

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
| a different figure on every rank | "rank 1 returned 1,420.3 samples/s but rank 0 returned 1,776.0: ..." |
| the step does not use DDP | "... (they started from different weights, and no DistributedDataParallel was made)" |
| forward called on the inner module, bypassing DDP | "... but no forward went through the wrapper ..." |
| the DDP wrapper rebuilt in every step | "at 2 worker(s) step() built a new DistributedDataParallel in 7 of ..." |
| not one DDP wrapper built by make_ddp_step | "at 2 worker(s) make_ddp_step built 2 DistributedDataParallel ..." |
| gradients not all-reduced once per step | "at 2 worker(s) DDP all-reduced the gradients 0 times in 7 steps: ..." |
| a collective of your own in every step | "at 2 worker(s) step() itself called dist.barrier (7 calls in 7 steps) ..." |
| the real run timed other steps than the iters after the warm-up | "on the real model your clock started after 0 ..." |
| efficiency as the speed-up (not divided by W) | "you returned 1.8 at 2 workers, the speed-up ...: divides it by 2" |
| a Python float passed to a collective | (TypeError "Expected parameter `tensor` ...") "collectives work on tensors" |
| the process group initialised again in the benchmark | (ValueError "... initialize ... twice") "..." |
| a CPU tensor in an NCCL collective | (RuntimeError "No backend type associated with device type cpu") "..." |
"""
from __future__ import annotations

import contextlib
import json
import tempfile
from pathlib import Path
from typing import Iterator, Sequence

import torch

from distlab.measure.timing import cpu_cores

from ...diagnosis import diagnose
from ...grading import launch_files, launch_timeout
from ...registry import Exercise
from ...report import ExerciseReport, Verdict, criterion, failed, passed
from .causes import (KNOWN_ERRORS, REAL_CAUSES, cpu_clock, figure_per_rank, inner_forward, no_barrier, no_ddp,
                     no_start_barrier, one_rank_samples, speedup, summed_clocks, warmup_samples, warmup_timed)
from .observed import REAL, Benchmark, Run
from .probes import SYNTH, TOL, rank_main

__all__ = ["CRITERIA", "EXERCISE", "KNOWN_ERRORS", "WORLD_SIZES", "grade", "launch_timeouts"]

EXERCISE = Exercise(number=6, name="scaling", filename="ex06_scaling.py", max_score=10, time_limit=150)
WORLD_SIZES = (1, 2, 4)


# The causes (causes) the method's criterion asks for, most specific first.
METHOD_CAUSES = [cpu_clock, summed_clocks, one_rank_samples, no_barrier, warmup_timed, no_start_barrier,
                 warmup_samples]


# Worth 2 at each of the three world sizes a learner is graded at (6 of 10 for the method).
@criterion("[W={world}] throughput within 10% of the truth", points=2)
def throughput_within_tolerance(run: Run) -> Verdict:
    want = SYNTH["warmup"] + SYNTH["iters"]
    bad = [(r["rank"], len(r["times"])) for r in run.ranks if len(r["times"]) != want]
    if bad:
        return failed(f"step() was called {bad[0][1]} times on rank {bad[0][0]}; expected warmup + iters = {want}")
    t, got, ratio = run.truth(), run.ranks[0]["reported"], run.ratio()
    measured = {f"W{run.world}_synthetic_reported_over_truth": round(ratio, 3)}
    if abs(ratio - 1) <= TOL and not figure_per_rank(run):
        return passed(f"ratio to the truth {ratio:.3f}, the same figure on every rank", **measured)
    why = diagnose(METHOD_CAUSES, run) if abs(ratio - 1) > TOL else ""
    if not why and abs(ratio - 1) > TOL:
        why = ("your window is shorter than the time the ranks spent on the timed steps" if ratio > 1 else
               "your window is longer than the timed steps: time only the iters steps, after the warm-up")
    cause = (f"you reported {got:,.0f} samples/s at {run.world} rank(s); the ranks trained {t['samples']} samples "
             f"in {t['window']:.3f} s, {t['truth']:,.0f} samples/s (ratio {ratio:.2f})" + (f": {why}" if why else ""))
    apart = figure_per_rank(run)
    return failed(f"{apart}; {cause}" if apart else cause, **measured)


METHOD_CRITERIA = [throughput_within_tolerance]  # judged at every world size


def _untrained(run: Run) -> str:
    """'' if the real step trained the model identically on every rank, else what went wrong."""
    first = run.ranks[0]
    if first.get("step_error"):
        return f"make_ddp_step raised {first['step_error']}"
    if all(torch.equal(first["initial"][k], first["final"][k]) for k in first["final"]):
        return "the parameters did not change: the step must run forward, backward and optimizer.step()"
    return diagnose([no_ddp, inner_forward], run) or ""


@criterion("the real step trains with DDP", points=2)
def trains_with_ddp(bench: Benchmark) -> Verdict:
    problems = [p for p in map(_untrained, bench.runs) if p]
    return failed(problems[0]) if problems else passed("parameters changed and agree on every rank")


@criterion("the real run: one DDP wrapper, one all-reduce per step, the steps after the warm-up timed", points=2,
           requires=[trains_with_ddp])
def real_run_counted(bench: Benchmark) -> Verdict:
    runs = [run for run in bench.runs if "real_steps" in run.ranks[0]]
    for run in runs:
        if why := diagnose(REAL_CAUSES, run):
            return failed(why)
    steps = {run.ranks[0]["real_steps"] for run in runs}
    return passed(f"{'/'.join(map(str, sorted(steps)))} steps, one wrapper and one gradient all-reduce per step "
                  f"at {', '.join(str(run.world) for run in runs)} worker(s)")


@criterion("scaling efficiency against linear", points=1)
def efficiency_against_linear(bench: Benchmark) -> Verdict:
    obs = bench.last
    thr = obs.get("throughput", {})
    ref = {w: thr[w] / (w * thr[1]) for w in thr} if 1 in thr else {}
    eff = obs.get("efficiency")
    if eff is not None and set(eff) == set(ref) and all(abs(eff[w] - ref[w]) <= 1e-6 * ref[w] for w in ref):
        return passed()
    if obs.get("efficiency_error"):
        return failed(f"scaling_efficiency raised {obs['efficiency_error']}")
    return failed(speedup(thr, eff) or f"for throughputs {thr} expected {ref}, got {eff}: efficiency is "
                  "throughput[W] / (W * throughput[1])")


def _read_back(files: dict, throughput: dict) -> str:
    """'' if the JSON holds the measured figures and the plot is a PNG, else what is wrong."""
    try:
        doc = json.loads(Path(files["json"]).read_text())
        got = {int(k): float(v) for k, v in doc["throughput"].items()}
        eff = {int(k): float(v) for k, v in doc["efficiency"].items()}
        if got != throughput or set(eff) != set(throughput):
            return f"the JSON's throughput {got} is not the measured {throughput}"
        if Path(files["plot"]).read_bytes()[:8] != b"\x89PNG\r\n\x1a\n":
            return f"{files['plot']} is not a PNG image: save the figure with fig.savefig(path)"
    except (OSError, KeyError, ValueError, TypeError, AttributeError) as exc:
        return f"could not read the results back ({type(exc).__name__}: {exc})"
    return ""


@criterion("JSON result and plot written", points=1)
def results_written(bench: Benchmark) -> Verdict:
    obs = bench.last
    files = obs.get("files")
    if obs.get("files_error"):
        return failed(f"write_results raised {obs['files_error']}")
    if not files:
        return failed("write_results returned no paths")
    if problem := _read_back(files, obs.get("throughput", {})):
        return failed(problem)
    return passed(f"plot: {files['plot']}" + ("" if bench.kept else " (in a temporary folder the grader removed "
                  "after reading it back; run_scaling() in your file writes scaling-results/)"))


CRITERIA = [trains_with_ddp, real_run_counted, efficiency_against_linear, results_written]  # once, after every launch


def _notes(report: ExerciseReport, bench: Benchmark) -> None:
    """The real figures, as notes: reported, never graded (speed depends on the machine)."""
    thr, eff, backend, cores = bench.figures, bench.last.get("efficiency"), bench.last["backend"], cpu_cores()
    report.measurements["real_samples_per_s"] = {str(k): round(v, 1) for k, v in thr.items()}
    report.notes.append("Your benchmark on the real model (reported, not graded: speed depends on the machine):")
    for w in sorted(thr):
        e = f", efficiency {eff[w]:.0%}" if eff and w in eff else ""
        over = " (oversubscribed)" if backend == "gloo" and w > cores else ""
        report.notes.append(f"  {w} worker(s): {thr[w]:,.0f} samples/s{e}{over}")
    if backend == "gloo" and max(thr, default=0) > cores:
        report.notes.append(f"  This machine has {cores} CPU cores: with more workers than cores they take turns "
                            "on the cores, so the efficiency there measures contention, not DDP.")


def launch_timeouts(world_sizes: Sequence[int], files: int = 1) -> dict[int, float]:
    """Seconds allowed per launch: one file's launches share the exercise's budget by weight 2 + W
    (start-up grows with the ranks), so that a hang is a ``LaunchTimeout`` naming the ranks, inside
    ``time_limit``; each more file adds ``launch_timeout``'s per-file seconds to every launch."""
    weight = {w: 2 + w for w in world_sizes}
    total = sum(weight.values())
    return {w: launch_timeout(EXERCISE, files=files, share=weight[w] / total) for w in world_sizes}


def _launches(paths: Sequence[Path], world_sizes: Sequence[int], base: Path,
              real: dict) -> Iterator[tuple[int, list[list[dict]], float]]:
    """One launch per world size, in order: each hands the real figures measured so far to the next,
    and the last one asks the learner's code for the efficiency and the files. Yields
    ``(world, every file's ranks, seconds)``."""
    out_dirs = [str(base / f"submission{i}") for i in range(len(paths))]
    so_far: list[dict] = [{} for _ in paths]
    timeouts = launch_timeouts(world_sizes, files=len(paths))
    for world in world_sizes:
        runs, wall_s = launch_files(rank_main, paths, world=world, timeout=timeouts[world],
                                    args=(so_far, out_dirs, world == world_sizes[-1], real))
        for figures, ranks in zip(so_far, runs):
            if "real" in ranks[0]:
                figures[world] = ranks[0]["real"]
        yield world, runs, wall_s


def grade(paths: Sequence[Path], world_sizes: tuple[int, ...] = WORLD_SIZES, out_dir: Path | None = None,
          real: dict | None = None) -> list[ExerciseReport]:
    """Grade the files at ``paths``, one launch per world size for all of them; one report each.

    Tests pass fewer ``world_sizes``, and ``real`` to override the real benchmark's settings (fewer
    steps). The learner's ``write_results`` writes into ``out_dir``/submission<i>; without
    ``out_dir``, into a temporary folder removed once the files have been read back (the feedback
    says so).
    """
    reports = [EXERCISE.new_report() for _ in paths]
    benches = [Benchmark([], kept=out_dir is not None) for _ in paths]
    with contextlib.ExitStack() as stack:
        base = Path(out_dir) if out_dir else Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="distlab-ex06-")))
        cfg = {**REAL, **(real or {})}
        for world, runs, wall_s in _launches(paths, world_sizes, base, cfg):
            for report, bench, ranks in zip(reports, benches, runs):
                bench.runs.append(Run(ranks, cfg))
                report.judge(METHOD_CRITERIA, bench.runs[-1], world=world)
                report.measurements[f"W{world}_launch_s"] = round(wall_s, 2)
        for report, bench in zip(reports, benches):
            report.judge(CRITERIA, bench)  # inside the ``with``: the files are read back before they go
            _notes(report, bench)
    return [r.scale_to() for r in reports]
