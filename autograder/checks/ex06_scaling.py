"""Exercise 6 check: the DDP scaling benchmark, graded on its method, then run for real.

Method (deterministic, as for mixed precision): the ranks call the learner's
``measure_throughput`` on a synthetic step whose duration the grader
controls. Each call sleeps and records when it ran; the first ``warmup``
calls are slow, and rank ``r`` is ``1 + r/2`` times slower than rank 0, so
the three classic mistakes move the figure far outside 10% of the truth:

* counting one rank's samples reports ``1/W`` of the truth;
* timing the warm-up adds the slow first steps to the window;
* stopping the clock without a barrier times rank 0 (the fastest) alone.

The truth is computed here from the recorded step times: all ranks' timed
samples over the window from the last rank's first timed step to the last
rank's last step; every rank must return the same figure (compared exactly:
a broadcast or a MAX all-reduce copies it bit for bit). Then the learner's benchmark runs on the real model at
each world size; its figures, efficiency, JSON and plot are reported, never
judged by speed (a 2-core machine running 4 workers is oversubscribed).
"""
from __future__ import annotations

import contextlib
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import torch

from distlab.timing import cpu_cores

from ..grading import launch_files, launch_timeout
from ..parity import parity
from ..registry import Exercise
from ..report import ExerciseReport, Verdict, criterion, failed, passed
from ._ex06_probes import SYNTH, rank_main  # the synthetic step's settings, shared with the rank-side instruments

EXERCISE = Exercise(number=6, name="scaling", filename="ex06_scaling.py", max_score=10, time_limit=150)
WORLD_SIZES = (1, 2, 4)
REAL = dict(batch_size=128, hidden=256, warmup=5, iters=30, lr=0.01)
TOL = 0.10


@dataclass
class WorldRun:
    """One file's launch at one world size: every rank's observation, in rank order."""

    ranks: list[dict]

    @property
    def world(self) -> int:
        return len(self.ranks)

    def truth(self) -> dict:
        """What a correct measurement reports, and what the classic mistakes report, from the step logs."""
        b, n, k = SYNTH["batch_size"], SYNTH["iters"], SYNTH["warmup"]
        times = [r["times"] for r in self.ranks]
        samples = self.world * b * n
        window = max(t[-1, 1] for t in times) - max(t[k, 0] for t in times)
        rank0_alone = times[0][-1, 1] - times[0][k, 0]
        with_warmup = max(t[-1, 1] for t in times) - min(t[0, 0] for t in times)
        return {"truth": samples / window.item(), "window": window.item(), "rank0_alone": rank0_alone.item(),
                "with_warmup": with_warmup.item(), "samples": samples}


def _diagnosis(world: int, got: float, t: dict) -> str:
    """Which classic mistake the reported figure ``got`` matches, from the truth ``t`` of the step logs."""
    ratio = got / t["truth"]
    if world > 1 and abs(ratio * world - 1) <= TOL:
        return "you counted one rank's samples: multiply by the world size (every rank trains its own batch)"
    if ratio > 1 + TOL and abs(got / (t["samples"] / t["rank0_alone"]) - 1) <= TOL:
        return (f"that is rank 0's own time ({t['rank0_alone']:.3f} s) while the slowest rank took "
                f"{t['window']:.3f} s: call dist.barrier() (and torch.cuda.synchronize() on a GPU) before "
                "starting and before stopping the clock, so the window covers every rank's steps")
    if ratio < 1 - TOL and abs(got / (t["samples"] / t["with_warmup"]) - 1) <= TOL:
        return (f"your window ({t['with_warmup']:.3f} s) includes the {SYNTH['warmup']} slow warm-up steps: "
                "start the clock after the warm-up, behind a barrier")
    if ratio > 1:
        return "your window is shorter than the time the ranks spent on the timed steps"
    return "your window is longer than the timed steps: time only the iters steps, after the warm-up"


# Worth 2 at each of the three world sizes a learner is graded at (6 of 10 for the method).
@criterion("[W={world}] throughput within 10% of the truth", points=2)
def throughput_within_tolerance(run: WorldRun) -> Verdict:
    want = SYNTH["warmup"] + SYNTH["iters"]
    bad = [(r["rank"], len(r["times"])) for r in run.ranks if len(r["times"]) != want]
    if bad:
        return failed(f"step() was called {bad[0][1]} times on rank {bad[0][0]}; expected warmup + iters = {want}")
    t, got = run.truth(), run.ranks[0]["reported"]
    ratio = got / t["truth"]
    measured = {f"W{run.world}_synthetic_reported_over_truth": round(ratio, 3)}
    cause = (f"you reported {got:,.0f} samples/s at {run.world} rank(s); the ranks trained {t['samples']} "
             f"samples in {t['window']:.3f} s, {t['truth']:,.0f} samples/s (ratio {ratio:.2f}): "
             f"{_diagnosis(run.world, got, t)}")
    apart = [r for r in run.ranks[1:] if r["reported"] != got]
    if apart:
        return failed(f"rank {apart[0]['rank']} returned {apart[0]['reported']:,.1f} samples/s but rank 0 "
                      f"returned {got:,.1f}: return the same figure on every rank (broadcast rank 0's elapsed "
                      f"time, or all-reduce it with MAX, before dividing); " + cause, **measured)
    if abs(ratio - 1) <= TOL:
        return passed(f"ratio to the truth {ratio:.3f}, the same figure on every rank", **measured)
    return failed(cause, **measured)


METHOD_CRITERIA = [throughput_within_tolerance]  # judged at every world size


@dataclass
class Benchmark:
    """One file's launches at every world size, in order; ``kept``: its results folder outlives grading."""

    runs: list[WorldRun]
    kept: bool

    @property
    def last(self) -> dict:
        """Rank 0's observation in the last launch: the efficiency and the files it wrote."""
        return self.runs[-1].ranks[0]

    @property
    def figures(self) -> dict[int, float]:
        """The real model's throughput at each world size where the learner's step ran."""
        return {run.world: run.ranks[0]["real"] for run in self.runs if "real" in run.ranks[0]}


def _untrained(run: WorldRun) -> str:
    """'' if the real step trained the model identically on every rank, else what went wrong."""
    first = run.ranks[0]
    if first.get("step_error"):
        return f"make_ddp_step raised {first['step_error']}"
    if all(torch.equal(first["initial"][k], first["final"][k]) for k in first["final"]):
        return "the parameters did not change: the step must run forward, backward and optimizer.step()"
    for r in run.ranks[1:]:
        diff = parity(r["final"], first["final"], rtol=0, atol=0).max_abs_diff
        if diff > 0:
            return (f"at {run.world} workers rank {r['rank']}'s parameters differ from rank 0's by up to "
                    f"{diff:.3g}: wrap the model in DistributedDataParallel")
    return ""


@criterion("the real step trains with DDP", points=2)
def trains_with_ddp(bench: Benchmark) -> Verdict:
    problems = [p for p in map(_untrained, bench.runs) if p]
    return failed(problems[0]) if problems else passed("parameters changed and agree on every rank")


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
    return failed(f"for throughputs {thr} expected {ref}, got {eff}: efficiency is throughput[W] / (W * throughput[1])")


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


CRITERIA = [trains_with_ddp, efficiency_against_linear, results_written]  # judged once, after every launch


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
        for world, runs, wall_s in _launches(paths, world_sizes, base, {**REAL, **(real or {})}):
            for report, bench, ranks in zip(reports, benches, runs):
                bench.runs.append(WorldRun(ranks))
                report.judge(METHOD_CRITERIA, bench.runs[-1], world=world)
                report.measurements[f"W{world}_launch_s"] = round(wall_s, 2)
        for report, bench in zip(reports, benches):
            report.judge(CRITERIA, bench)  # inside the ``with``: the files are read back before they go
            _notes(report, bench)
    return [r.scale_to() for r in reports]
