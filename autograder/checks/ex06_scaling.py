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
import time
from pathlib import Path

import torch
import torch.distributed as dist

import distlab
from distlab import torchrun
from distlab.models import cpu_state, make_mlp
from distlab.timing import cpu_cores

from ..harness import CapturedPrints, echo, load_learner
from ..parity import parity
from ..registry import Exercise
from ..report import ExerciseReport

EXERCISE = Exercise(number=6, name="scaling", filename="ex06_scaling.py", max_score=10, time_limit=150)
WORLD_SIZES = (1, 2, 4)
SYNTH = dict(batch_size=32, warmup=2, iters=8)
STEP_S, WARMUP_STEP_S, SLOWER_PER_RANK = 0.03, 0.1, 0.5
REAL = dict(batch_size=128, hidden=256, warmup=5, iters=30, lr=0.01)
TOL = 0.10
MARGIN_S = 15  # the launches' timeouts sum to time_limit - MARGIN_S: a hang is a LaunchTimeout, not a kill


class SyntheticStep:
    """A step that sleeps for a known time and records when it ran."""

    def __init__(self, rank: int, warmup: int):
        self.rank, self.warmup, self.times = rank, warmup, []

    def __call__(self) -> None:
        start = time.perf_counter()
        slow = len(self.times) < self.warmup
        time.sleep(WARMUP_STEP_S if slow else STEP_S * (1 + SLOWER_PER_RANK * self.rank))
        self.times.append((start, time.perf_counter()))


def _guard(fn, *args, **kwargs):
    """(result, None) or (None, "Type: message"): a part that raises costs only its own marks."""
    try:
        return fn(*args, **kwargs), None
    except Exception as exc:  # noqa: BLE001 - reported to the learner
        return None, f"{type(exc).__name__}: {str(exc).strip()[:300]}" or type(exc).__name__


def rank_main(paths: list[str], so_far: list[dict], out_dirs: list[str], final: bool, real: dict) -> list[dict]:
    """Runs on every rank: the synthetic method check, then the real benchmark, for each file."""
    dev = distlab.init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    observed = []
    for i, path in enumerate(paths):
        learner = load_learner(path)
        step = SyntheticStep(rank, SYNTH["warmup"])
        dist.barrier()
        with CapturedPrints() as out:
            reported = learner.measure_throughput(step, SYNTH["batch_size"], warmup=SYNTH["warmup"],
                                                  iters=SYNTH["iters"])
        echo(out.lines)
        obs = {"rank": rank, "reported": float(reported), "times": torch.tensor(step.times, dtype=torch.float64)}
        # The real model: a different start on every rank, so a step without DDP ends with ranks apart.
        model = make_mlp(seed=1000 + rank, hidden=real["hidden"]).to(dev)
        obs["initial"] = cpu_state(model)
        gen = torch.Generator().manual_seed(rank)
        x = torch.randn(real["batch_size"], 64, generator=gen).to(dev)
        y = torch.randint(0, 10, (real["batch_size"],), generator=gen).to(dev)
        dist.barrier()
        real_step, obs["step_error"] = _guard(learner.make_ddp_step, model, x, y, lr=real["lr"])
        if real_step is not None:
            with CapturedPrints():
                figure = learner.measure_throughput(real_step, real["batch_size"], warmup=real["warmup"],
                                                    iters=real["iters"])
            obs["real"] = float(figure)
        obs["final"] = cpu_state(model)
        if final and rank == 0 and "real" in obs:
            throughput = {**{int(k): float(v) for k, v in so_far[i].items()}, world: obs["real"]}
            obs["throughput"] = throughput
            eff, obs["efficiency_error"] = _guard(learner.scaling_efficiency, dict(throughput))
            obs["efficiency"] = {int(k): float(v) for k, v in eff.items()} if isinstance(eff, dict) else None
            if obs["efficiency"] is not None:
                files, obs["files_error"] = _guard(learner.write_results, dict(throughput), dict(eff), out_dirs[i])
                obs["files"] = {str(k): str(v) for k, v in files.items()} if isinstance(files, dict) else None
        observed.append(obs)
    distlab.shutdown()
    return observed


def _truth(ranks: list[dict]) -> dict:
    """What a correct measurement reports, and what the classic mistakes report, from the step logs."""
    w, b, n, k = len(ranks), SYNTH["batch_size"], SYNTH["iters"], SYNTH["warmup"]
    times = [r["times"] for r in ranks]
    samples = w * b * n
    window = max(t[-1, 1] for t in times) - max(t[k, 0] for t in times)
    rank0_alone = times[0][-1, 1] - times[0][k, 0]
    with_warmup = max(t[-1, 1] for t in times) - min(t[0, 0] for t in times)
    return {"truth": samples / window.item(), "window": window.item(), "rank0_alone": rank0_alone.item(),
            "with_warmup": with_warmup.item(), "samples": samples}


def _check_method(report: ExerciseReport, ranks: list[dict], points: float) -> None:
    w = len(ranks)
    tag = f"[W={w}]"
    want = SYNTH["warmup"] + SYNTH["iters"]
    bad = [(r["rank"], len(r["times"])) for r in ranks if len(r["times"]) != want]
    if bad:
        report.check(f"{tag} throughput within 10% of the truth", points, False,
                     f"step() was called {bad[0][1]} times on rank {bad[0][0]}; expected warmup + iters = {want}")
        return
    t = _truth(ranks)
    got = ranks[0]["reported"]
    ratio = got / t["truth"]
    report.measurements[f"W{w}_synthetic_reported_over_truth"] = round(ratio, 3)
    head = (f"you reported {got:,.0f} samples/s at {w} rank(s); the ranks trained {t['samples']} samples in "
            f"{t['window']:.3f} s, {t['truth']:,.0f} samples/s (ratio {ratio:.2f})")
    if w > 1 and abs(ratio * w - 1) <= TOL:
        why = "you counted one rank's samples: multiply by the world size (every rank trains its own batch)"
    elif ratio > 1 + TOL and abs(got / (t["samples"] / t["rank0_alone"]) - 1) <= TOL:
        why = (f"that is rank 0's own time ({t['rank0_alone']:.3f} s) while the slowest rank took "
               f"{t['window']:.3f} s: call dist.barrier() (and torch.cuda.synchronize() on a GPU) before "
               "starting and before stopping the clock, so the window covers every rank's steps")
    elif ratio < 1 - TOL and abs(got / (t["samples"] / t["with_warmup"]) - 1) <= TOL:
        why = (f"your window ({t['with_warmup']:.3f} s) includes the {SYNTH['warmup']} slow warm-up steps: "
               "start the clock after the warm-up, behind a barrier")
    elif ratio > 1:
        why = "your window is shorter than the time the ranks spent on the timed steps"
    else:
        why = "your window is longer than the timed steps: time only the iters steps, after the warm-up"
    fb, ok = f"{head}: {why}", abs(ratio - 1) <= TOL
    apart = [r for r in ranks[1:] if r["reported"] != got]
    if apart:
        ok = False
        fb = (f"rank {apart[0]['rank']} returned {apart[0]['reported']:,.1f} samples/s but rank 0 returned "
              f"{got:,.1f}: return the same figure on every rank (broadcast rank 0's elapsed time, or "
              f"all-reduce it with MAX, before dividing); " + fb)
    report.check(f"{tag} throughput within 10% of the truth", points, ok, fb,
                 pass_note=f"ratio to the truth {ratio:.3f}, the same figure on every rank")


def _check_files(report: ExerciseReport, obs: dict, kept: bool) -> None:
    thr = obs.get("throughput", {})
    ref = {w: thr[w] / (w * thr[1]) for w in thr} if 1 in thr else {}
    eff = obs.get("efficiency")
    ok = eff is not None and set(eff) == set(ref) and all(abs(eff[w] - ref[w]) <= 1e-6 * ref[w] for w in ref)
    report.check("scaling efficiency against linear", 1, ok,
                 obs.get("efficiency_error") and f"scaling_efficiency raised {obs['efficiency_error']}" or
                 f"for throughputs {thr} expected {ref}, got {eff}: efficiency is throughput[W] / (W * throughput[1])")
    files, msg = obs.get("files"), obs.get("files_error") and f"write_results raised {obs['files_error']}"
    if files and not msg:
        try:
            doc = json.loads(Path(files["json"]).read_text())
            got = {int(k): float(v) for k, v in doc["throughput"].items()}
            geff = {int(k): float(v) for k, v in doc["efficiency"].items()}
            if got != thr or set(geff) != set(thr):
                msg = f"the JSON's throughput {got} is not the measured {thr}"
            elif Path(files["plot"]).read_bytes()[:8] != b"\x89PNG\r\n\x1a\n":
                msg = f"{files['plot']} is not a PNG image: save the figure with fig.savefig(path)"
        except (OSError, KeyError, ValueError, TypeError, AttributeError) as exc:
            msg = f"could not read the results back ({type(exc).__name__}: {exc})"
    report.check("JSON result and plot written", 1, bool(files) and not msg,
                 msg or "write_results returned no paths",
                 pass_note=(f"plot: {files['plot']}" + ("" if kept else " (in a temporary folder the grader "
                            "removed after reading it back; run_scaling() in your file writes scaling-results/)"))
                 if files else "")


def _notes(report: ExerciseReport, thr: dict, eff: dict | None, backend: str) -> None:
    cores = cpu_cores()
    report.notes.append("Your benchmark on the real model (reported, not graded: speed depends on the machine):")
    for w in sorted(thr):
        e = f", efficiency {eff[w]:.0%}" if eff and w in eff else ""
        over = " (oversubscribed)" if backend == "gloo" and w > cores else ""
        report.notes.append(f"  {w} worker(s): {thr[w]:,.0f} samples/s{e}{over}")
    if backend == "gloo" and max(thr, default=0) > cores:
        report.notes.append(f"  This machine has {cores} CPU cores: with more workers than cores they take turns "
                            "on the cores, so the efficiency there measures contention, not DDP.")


def launch_timeouts(world_sizes: tuple[int, ...], budget: float = EXERCISE.time_limit - MARGIN_S) -> dict:
    """Seconds allowed per launch, shared out by world size (start-up grows with the ranks), summing to
    ``budget``: a hang is then reported as a ``LaunchTimeout`` naming the ranks, inside ``time_limit``."""
    weight = {w: 2 + w for w in world_sizes}
    return {w: budget * weight[w] / sum(weight.values()) for w in world_sizes}


def grade_all(paths: list[Path], world_sizes: tuple[int, ...] = WORLD_SIZES,
              out_dir: Path | None = None, real: dict | None = None) -> list[ExerciseReport]:
    """Grade several files, one launch per world size (the grader owns the process group).

    Each launch needs the figures of the previous ones (the efficiency and the files are made at
    the last world size), so this loops over launches itself rather than using ``grade_files``.
    ``real`` overrides the real benchmark's settings (tests run fewer steps). The learner's
    ``write_results`` writes into ``out_dir``/submission<i>; without ``out_dir``, into a temporary
    folder removed once the files have been read back (the feedback says so).
    """
    with contextlib.ExitStack() as stack:
        base = Path(out_dir) if out_dir else Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="distlab-ex06-")))
        return _grade_into(paths, world_sizes, base, kept=out_dir is not None, real={**REAL, **(real or {})})


def _grade_into(paths: list[Path], world_sizes: tuple[int, ...], base: Path, kept: bool,
                real: dict) -> list[ExerciseReport]:
    out_dirs = [str(base / f"submission{i}") for i in range(len(paths))]
    reports = [ExerciseReport(EXERCISE.number, EXERCISE.name, EXERCISE.max_score) for _ in paths]
    so_far: list[dict] = [{} for _ in paths]
    trained = [[] for _ in paths]
    last: list[dict] = [{} for _ in paths]
    backend = "gloo"
    timeouts = launch_timeouts(world_sizes)
    for w in world_sizes:
        final = w == world_sizes[-1]
        run = torchrun(rank_main, w, args=([str(p) for p in paths], so_far, out_dirs, final, real),
                       timeout=timeouts[w])
        backend = run.backend
        for i, report in enumerate(reports):
            ranks = [run.results[r][i] for r in range(w)]
            _check_method(report, ranks, 6 / len(world_sizes))
            report.measurements[f"W{w}_launch_s"] = round(run.wall_s, 2)
            if "real" in ranks[0]:
                so_far[i][w] = ranks[0]["real"]
            trained[i].append(_trained(ranks))
            last[i] = ranks[0]
    for i, report in enumerate(reports):
        problems = [t for t in trained[i] if t]
        report.check("the real step trains with DDP", 2, not problems, problems[0] if problems else "",
                     pass_note="parameters changed and agree on every rank")
        _check_files(report, last[i], kept)
        report.measurements["real_samples_per_s"] = {str(k): round(v, 1) for k, v in so_far[i].items()}
        _notes(report, so_far[i], last[i].get("efficiency"), backend)
    return reports


def _trained(ranks: list[dict]) -> str:
    """'' if the real step trained the model identically on every rank, else what went wrong."""
    first = ranks[0]
    if first.get("step_error"):
        return f"make_ddp_step raised {first['step_error']}"
    if all(torch.equal(first["initial"][k], first["final"][k]) for k in first["final"]):
        return "the parameters did not change: the step must run forward, backward and optimizer.step()"
    for r in ranks[1:]:
        diff = parity(r["final"], first["final"], rtol=0, atol=0).max_abs_diff
        if diff > 0:
            return (f"at {len(ranks)} workers rank {r['rank']}'s parameters differ from rank 0's by up to "
                    f"{diff:.3g}: wrap the model in DistributedDataParallel")
    return ""


def grade(path: Path, world_sizes: tuple[int, ...] = WORLD_SIZES, out_dir: Path | None = None) -> ExerciseReport:
    """Grade the file at ``path`` (tests pass fewer ``world_sizes`` to run faster)."""
    return grade_all([path], world_sizes, out_dir)[0]
