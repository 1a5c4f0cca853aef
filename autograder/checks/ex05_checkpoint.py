"""Exercise 5 check: kill a rank, resume, and demand the very same weights.

Scenarios, in three torchrun launches per file (the rank side is in ``_ex05_probes``):

1. ``reference``: an uninterrupted run in directory A (its records and final
   state are the yardstick), then, in the same processes, a run in directory C
   in which rank 1 SIGKILLs itself at step ``FRESH_KILL`` (the job dies; no restart).
2. ``fresh`` + ``restart``: a new job (``--max-restarts=2``) first finishes C
   from its checkpoint (the fresh-job resume), then trains in directory B. In
   attempt 0 rank 1 is killed *inside* its second checkpoint write of B (its
   shard is on disk, DCP's ``.metadata`` is not), so attempt 1 must resume from
   the previous complete checkpoint; attempt 1 is killed at ``SECOND_KILL``;
   attempt 2 finishes. (C, already complete, resumes at its last step in
   attempts 1 and 2 and trains no further.)
3. ``reshard``: a job at another world size resumes from A's last checkpoint.

On the CPU, reduction order is fixed, so resumed runs must match the
uninterrupted one bit for bit (``torch.equal``); on a GPU within assert_close's tolerance.
"""
from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch

from distlab import LaunchError, pick_backend, torchrun
from distlab.checkpoint import complete_checkpoints

from ..grading import launch_timeout
from ..parity import parity
from ..registry import Exercise
from ..report import ExerciseReport, Verdict, criterion, failed, passed
from ._ex05_probes import RUN, rank_main

# Grading the solution (all three launches, reshard to 4 ranks) took 42 s on 2 cores at load 4;
# the resume launch (three process starts) is the longest. The launches share what time_limit
# leaves after the grader's start-up in these proportions (30, 40 and 30 s: 2-3x each launch), so
# a hang is reported as a LaunchTimeout naming the ranks, not cut off by the CLI.
EXERCISE = Exercise(number=5, name="checkpoint", filename="ex05_checkpoint.py", max_score=10, time_limit=120)
SHARES = {"reference": 3, "resume": 4, "reshard": 3}
WORLD, RESHARD_WORLD = 2, 4
FRESH_KILL = 5                 # fresh-job scenario: killed after step 5, resumes from step 3
WRITE_KILL = 2                 # restart scenario, attempt 0: killed inside the 2nd checkpoint write (step 6)
SECOND_KILL = 8                # restart scenario, attempt 1: killed after step 8, resumes from step 6
RESUMED_FROM = RUN["save_every"] * (WRITE_KILL - 1)  # the last checkpoint committed before the killed write
INTERRUPTED = RUN["save_every"] * WRITE_KILL         # the step whose checkpoint write was killed
SCENARIOS = ("fresh", "restart", "reshard")


def _timeout(launch: str) -> float:
    return launch_timeout(EXERCISE, share=SHARES[launch] / sum(SHARES.values()))


def _exact(world: int) -> bool:
    """Bit-identical under gloo on the CPU; within tolerance under NCCL (GPU kernels may reorder)."""
    return pick_backend(world) == "gloo"


@dataclass
class Run:
    """One file's launches: where the ranks recorded each phase, and what the launches raised.

    Filled in as the launches go; what a later launch could change (A's directory) is read at once.
    """

    out: Path
    reshard_world: int
    ref: dict = field(default_factory=dict)        # A's final state: the uninterrupted run
    ref_rec: list = field(default_factory=list)    # A's records, per rank
    checkpoints: list[str] = field(default_factory=list)  # what A's directory held after the run
    committed: list[int] = field(default_factory=list)    # the steps of its complete checkpoints
    reached: int = 0               # the last step rank 1 recorded in C before it was killed
    resume_error: LaunchError | None = None
    reshard_error: LaunchError | None = None

    def records(self, name: str, world: int = WORLD) -> list[list[dict]]:
        out = []
        for r in range(world):
            f = self.out / f"{name}-rank{r}.jsonl"
            out.append([json.loads(ln) for ln in f.read_text().splitlines() if ln.strip()] if f.is_file() else [])
        return out

    def final(self, name: str) -> dict | None:
        f = self.out / f"{name}-final.pt"
        return torch.load(f, weights_only=True) if f.is_file() else None

    def attempt_steps(self, attempt: int) -> list[int]:
        """The steps rank 0 trained in B during torchrun attempt ``attempt``."""
        return [x["step"] for x in self.records("B")[0] if x["attempt"] == attempt]

    def phase_error(self, name: str, first_attempt: int = 0) -> str:
        """What a phase raised (not a peer's "connection closed" after a kill), as ``attempt A, rank R: ...``."""
        f = self.out / f"{name}-errors.jsonl"
        errors = [json.loads(ln) for ln in f.read_text().splitlines()] if f.is_file() else []
        errors = [e for e in errors if e["attempt"] >= first_attempt and "Connection" not in e["error"]]
        return f"attempt {errors[0]['attempt']}, rank {errors[0]['rank']}: {errors[0]['error']}" if errors else ""

    def restart_error(self) -> str | LaunchError | None:
        """What stopped the restart scenario: what a restarted attempt tripped on, not the kill before it."""
        err = self.resume_error
        if err is not None:
            err = self.phase_error("B", first_attempt=1) or err
        if not self.records("B")[0]:
            err = f"the job failed before it reached this scenario: {self.phase_error('C') or err}"
        return err


def _launch(path: Path, out: Path, phases: list[dict], world: int, timeout: float,
            **kw) -> tuple[LaunchError | None, float]:
    """One launch of the phases; a killed job is expected, so its error is returned, not raised."""
    t = time.perf_counter()
    try:
        torchrun(rank_main, world, args=([str(path)], str(out), phases), timeout=timeout, **kw)
    except LaunchError as exc:
        return exc, round(time.perf_counter() - t, 2)
    return None, round(time.perf_counter() - t, 2)


def _run_file(path: Path, out: Path, scenarios: Sequence[str], reshard_world: int, measured: dict) -> Run:
    """The launches for one file, in order: the reference (and the run killed for the fresh job), the
    resume (the fresh job, then the restarts), the reshard. Raises if the uninterrupted run failed."""
    run, steps = Run(out, reshard_world), RUN["steps"]
    A, B, C = (str(out / d) for d in "ABC")
    phases = [dict(name="A", dir=A, steps=steps)]
    if "fresh" in scenarios:
        phases.append(dict(name="C", dir=C, steps=steps, kill_step={"0": FRESH_KILL}))
    err, measured["reference_launch_s"] = _launch(path, out, phases, WORLD, _timeout("reference"))
    ref = run.final("A")
    if ref is None:  # the uninterrupted run itself failed: that is the learner's error
        raise err if err else LaunchError("the uninterrupted run returned no final state")
    run.ref, run.ref_rec = ref, run.records("A")
    run.checkpoints = sorted(p.name for p in Path(A).iterdir()) if Path(A).is_dir() else []
    run.committed = [s for s, _ in complete_checkpoints(A)]
    run.reached = max((x["step"] for x in run.records("C")[1]), default=0)
    resume = [dict(name="C", dir=C, steps=steps)] if "fresh" in scenarios and run.reached == FRESH_KILL else []
    if "restart" in scenarios:
        resume.append(dict(name="B", dir=B, steps=steps, kill_write={"0": WRITE_KILL}, kill_step={"1": SECOND_KILL}))
    if resume:
        run.resume_error, measured["resume_launch_s"] = _launch(
            path, out, resume, WORLD, _timeout("resume"), max_restarts=2 if "restart" in scenarios else 0)
    if "reshard" in scenarios:
        run.reshard_error, _ = _launch(path, out, [dict(name="R", dir=A, steps=steps)], reshard_world,
                                       _timeout("reshard"))
    return run


def _same_state(ref: dict, got: dict | None, world: int = WORLD) -> tuple[bool, str]:
    if got is None:
        return False, "the run did not finish"
    exact = _exact(world)
    pairs = [(f"model '{k}'", v, got["model"].get(k)) for k, v in ref["model"].items()]
    pairs += [(f"optimizer '{k}'.{j}", v, got["optim"].get(k, {}).get(j)) for k, s in ref["optim"].items()
              for j, v in s.items()]
    for name, a, b in pairs:
        if b is None or a.shape != b.shape:
            return False, f"{name} is missing or has another shape"
        par = parity(b, a, rtol=0 if exact else None, atol=0 if exact else None)
        if not par.ok:
            return False, f"{name} differs (max abs difference {par.max_abs_diff:.3g})"
    return True, ""


def _diagnose(ref: list[list[dict]], got: list[list[dict]], attempt: int | None = None) -> str:
    """Name the first thing that differs from the uninterrupted run, step by step, rank by rank."""
    for rank, (ref_r, got_r) in enumerate(zip(ref, got)):
        by_step = {x["step"]: x for x in ref_r}
        for x in got_r:
            if attempt is not None and x["attempt"] != attempt:
                continue
            a, s = by_step.get(x["step"]), x["step"]
            if a is None:
                return f"rank {rank} reported step {s}, which the uninterrupted run never reached"
            wrong = []  # every component that differs, so several mistakes are all named
            if x["data"] != a["data"]:
                wrong.append(f"rank {rank} read samples {x['data'][:3]}... instead of {a['data'][:3]}...: save "
                             "the data position (sampler epoch and batch offset) and continue from it")
            if x["lr"] != a["lr"]:
                wrong.append(f"the learning rate was {x['lr']:.6g} instead of {a['lr']:.6g}: save "
                             "scheduler.state_dict() and load it on resume")
            if x["rng"] != a["rng"]:
                wrong.append(f"rank {rank}'s RNG state differs from the uninterrupted run's, so dropout drew "
                             "other masks: save each rank's torch.get_rng_state() and restore it")
            if wrong:
                return f"at step {s} " + "; ".join(wrong)
            if (x["fp"] != a["fp"]) if _exact(WORLD) else abs(x["fp"] - a["fp"]) > 1e-5 * (1 + abs(a["fp"])):
                return (f"after step {s} rank {rank}'s parameters differ (sum of its shards {x['fp']:.9g} vs "
                        f"{a['fp']:.9g}) although data, LR and RNG match: restore model and optimizer with "
                        "dcp.load into get_state_dict's tensors, then set_state_dict")
    return ""


@criterion("keeps only the last K checkpoints", points=1)
def keeps_last_k(run: Run) -> Verdict:
    steps = RUN["steps"]
    want = list(range(steps, 0, -RUN["save_every"]))[:RUN["keep"]][::-1]
    if run.committed == want and len(run.checkpoints) == len(want):
        return passed(f"kept steps {run.committed}")
    return failed(f"after {steps} steps saving every {RUN['save_every']} with keep={RUN['keep']} the directory "
                  f"holds {run.checkpoints}, expected the committed steps {want} only: call prune(root, keep) on "
                  "rank 0 after each commit")


@criterion("a fresh job resumes exactly", points=2)
def fresh_job_resumes(run: Run) -> Verdict:
    got = run.final("C")
    ok, why = _same_state(run.ref, got)
    if ok and run.reached == FRESH_KILL:
        return passed("bit-identical to the uninterrupted run" if _exact(WORLD) else "within tolerance")
    if run.reached != FRESH_KILL:
        why = f"the run to be killed at step {FRESH_KILL} stopped at step {run.reached}"
    elif got is None:
        why = f"the fresh job failed: {run.phase_error('C') or run.resume_error}"
    else:
        why = _diagnose(run.ref_rec, run.records("C")) or why
    return failed(f"killed rank 1 after step {FRESH_KILL} and started a new job on the same directory: {why}")


@criterion("an interrupted write is never loaded", points=2)
def interrupted_write_never_loaded(run: Run) -> Verdict:
    att1 = run.attempt_steps(1)
    if att1 and att1[0] == RESUMED_FROM + 1:
        return passed(f"killed inside step {INTERRUPTED}'s write; resumed from step {RESUMED_FROM}")
    err = run.restart_error()
    seen = f"it resumed at step {att1[0]}" if att1 else f"it never trained again ({err})" if err else "no steps ran"
    return failed(f"rank 1 was killed while writing step {INTERRUPTED}'s checkpoint and torchrun restarted the "
                  f"job, which should resume from step {RESUMED_FROM}, but {seen}. Write into staging_path(), "
                  "commit() on rank 0 after a barrier, and load only latest_complete()")


@criterion("torchrun --max-restarts resumes exactly", points=2)
def restart_resumes(run: Run) -> Verdict:
    # Attempt 1 must match the uninterrupted run step by step until it is killed again.
    att1 = run.attempt_steps(1)
    diag = _diagnose(run.ref_rec, run.records("B"), attempt=1)
    if att1 and att1[-1] == SECOND_KILL and not diag:
        return passed(f"steps {att1[0]}-{SECOND_KILL} identical to the uninterrupted run")
    return failed(diag or f"not checked: the first restart did not run to step {SECOND_KILL} "
                          f"({run.restart_error() or 'no records'})")


@criterion("two crashes, still exact", points=1, requires=[restart_resumes])
def two_crashes(run: Run) -> Verdict:
    ok, why = _same_state(run.ref, run.final("B"))
    err = run.restart_error()
    if ok and err is None:
        return passed("final weights and Adam state identical after resuming twice")
    return failed(_diagnose(run.ref_rec, run.records("B"), attempt=2) or why or str(err))


@criterion("resumes at world size {reshard_world} from a {world}-rank checkpoint", points=2)
def reshards(run: Run) -> Verdict:
    got, err = run.final("R"), run.reshard_error
    ok, why = _same_state(run.ref, got, run.reshard_world)
    if err is not None:
        ok, why = False, f"the job failed: {err}"
    elif got is not None and (got["step"], got["lr"]) != (run.ref["step"], run.ref["lr"]):
        ok, why = False, (f"it came back at step {got['step']} with lr {got['lr']:.6g}, expected step "
                          f"{run.ref['step']} and lr {run.ref['lr']:.6g}")
    if ok:
        return passed("model and Adam state identical after resharding")
    return failed(f"loading the last checkpoint of the {WORLD}-rank run with {run.reshard_world} ranks: {why}. "
                  "DCP reshards when you dcp.load into get_state_dict's (DTensor) state of the new model")


SCENARIO_CRITERIA = {"fresh": [fresh_job_resumes],
                     "restart": [interrupted_write_never_loaded, restart_resumes, two_crashes],
                     "reshard": [reshards]}


def criteria(scenarios: Sequence[str] = SCENARIOS) -> list:
    """The criteria judged when these scenarios run (keeping the last K is judged in every grading)."""
    return [keeps_last_k] + [fn for s in SCENARIOS if s in scenarios for fn in SCENARIO_CRITERIA[s]]


def grade(paths: Sequence[Path], scenarios: tuple[str, ...] = SCENARIOS,
          reshard_world: int = RESHARD_WORLD) -> list[ExerciseReport]:
    """Grade the files at ``paths``; tests pass fewer ``scenarios`` or a cheaper ``reshard_world``.

    One file after the other, each with its own launches: every launch kills a rank (and with it the
    job) on purpose, and torchrun restarts the whole job, so files cannot share a launch. A subset of
    scenarios still scores out of ``max_score`` (scale_to).
    """
    reports = []
    for path in paths:
        report = EXERCISE.new_report()
        with tempfile.TemporaryDirectory(prefix="ex05-") as tmp:
            run = _run_file(Path(path), Path(tmp), scenarios, reshard_world, report.measurements)
            report.judge(criteria(scenarios), run, world=WORLD, reshard_world=reshard_world)
        reports.append(report.scale_to())
    return reports
