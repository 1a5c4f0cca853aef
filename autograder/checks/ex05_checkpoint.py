"""Exercise 5 check: kill a rank, resume, and demand the very same weights.

Scenarios, in three torchrun launches (the rank side is in ``_ex05_probes``):

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
from pathlib import Path

import torch

from distlab import LaunchError, pick_backend, torchrun
from distlab.checkpoint import complete_checkpoints

from ..parity import parity
from ..registry import Exercise
from ..report import ExerciseReport
from . import _ex05_probes as probes
from ._ex05_probes import RUN

# Grading the solution (all three launches, reshard to 4 ranks) took 42 s on 2 cores at load 4;
# the resume launch (three process starts) is the longest. Each timeout leaves 2-3x its launch's
# share and they sum to 105 s, inside time_limit - 15 s, so a hang is a LaunchTimeout naming the ranks.
EXERCISE = Exercise(number=5, name="checkpoint", filename="ex05_checkpoint.py", max_score=10, time_limit=120)
TIMEOUT = {"reference": 30, "resume": 45, "reshard": 30}
WORLD, RESHARD_WORLD = 2, 4
FRESH_KILL = 5                 # fresh-job scenario: killed after step 5, resumes from step 3
WRITE_KILL = 2                 # restart scenario, attempt 0: killed inside the 2nd checkpoint write (step 6)
SECOND_KILL = 8                # restart scenario, attempt 1: killed after step 8, resumes from step 6
SCENARIOS = ("fresh", "restart", "reshard")


def _records(outdir: Path, name: str, world: int) -> list[list[dict]]:
    out = []
    for r in range(world):
        f = outdir / f"{name}-rank{r}.jsonl"
        out.append([json.loads(ln) for ln in f.read_text().splitlines() if ln.strip()] if f.is_file() else [])
    return out


def _load(outdir: Path, name: str) -> dict | None:
    f = outdir / f"{name}-final.pt"
    return torch.load(f, weights_only=True) if f.is_file() else None


def _exact(world: int) -> bool:
    """Bit-identical under gloo on the CPU; within tolerance under NCCL (GPU kernels may reorder)."""
    return pick_backend(world) == "gloo"


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


def _launch(path: Path, outdir: Path, phases: list[dict], world: int, timeout: float, **kw) -> LaunchError | None:
    try:
        torchrun(probes.rank_main, world, args=(str(path), str(outdir), phases), timeout=timeout, **kw)
    except LaunchError as exc:
        return exc
    return None


def grade(path: Path, scenarios: tuple[str, ...] = SCENARIOS, reshard_world: int = RESHARD_WORLD) -> ExerciseReport:
    """Grade the file at ``path``; tests pass fewer ``scenarios`` or a cheaper ``reshard_world``."""
    report = ExerciseReport(EXERCISE.number, EXERCISE.name, EXERCISE.max_score)
    with tempfile.TemporaryDirectory(prefix="ex05-") as tmp:
        out = Path(tmp)
        A, B, C = (str(out / d) for d in "ABC")
        steps = RUN["steps"]
        phases = [dict(name="A", dir=A, steps=steps)]
        if "fresh" in scenarios:
            phases.append(dict(name="C", dir=C, steps=steps, kill_step={"0": FRESH_KILL}))
        t = time.perf_counter()
        err = _launch(path, out, phases, WORLD, TIMEOUT["reference"])
        report.measurements["reference_launch_s"] = round(time.perf_counter() - t, 2)
        ref, ref_rec = _load(out, "A"), _records(out, "A", WORLD)
        if ref is None:  # the uninterrupted run itself failed: that is the learner's error
            raise err if err else LaunchError("the uninterrupted run returned no final state")
        # keep the last K
        names = sorted(p.name for p in Path(A).iterdir()) if Path(A).is_dir() else []
        kept = [s for s, _ in complete_checkpoints(A)]
        want = list(range(steps, 0, -RUN["save_every"]))[:RUN["keep"]][::-1]
        report.check("keeps only the last K checkpoints", 1, kept == want and len(names) == len(want),
                     f"after {steps} steps saving every {RUN['save_every']} with keep={RUN['keep']} the directory "
                     f"holds {names}, expected the committed steps {want} only: call prune(root, keep) on rank 0 "
                     "after each commit", pass_note=f"kept steps {kept}")
        # one new job: the fresh-job resume of C, then the restart scenario on B
        reached = max((x["step"] for x in _records(out, "C", WORLD)[1]), default=0)
        resume = [dict(name="C", dir=C, steps=steps)] if "fresh" in scenarios and reached == FRESH_KILL else []
        if "restart" in scenarios:
            resume.append(dict(name="B", dir=B, steps=steps, kill_write={"0": WRITE_KILL},
                               kill_step={"1": SECOND_KILL}))
        err = None
        if resume:
            t = time.perf_counter()
            err = _launch(path, out, resume, WORLD, TIMEOUT["resume"],
                          max_restarts=2 if "restart" in scenarios else 0)
            report.measurements["resume_launch_s"] = round(time.perf_counter() - t, 2)
        if "fresh" in scenarios:
            _check_fresh(report, out, ref, ref_rec, reached, err)
        if "restart" in scenarios:
            _check_restart(report, out, ref, ref_rec, err)
        if "reshard" in scenarios:
            _check_reshard(report, path, out, A, ref, reshard_world)
    scale = EXERCISE.max_score / sum(c.points for c in report.criteria)
    for c in report.criteria:  # a subset of scenarios still scores out of max_score
        c.points, c.earned = c.points * scale, c.earned * scale
    return report


def _phase_error(out: Path, name: str, first_attempt: int = 0) -> str:
    """What a phase raised (not a peer's "connection closed" after a kill), as ``attempt A, rank R: ...``."""
    f = out / f"{name}-errors.jsonl"
    errors = [json.loads(ln) for ln in f.read_text().splitlines()] if f.is_file() else []
    errors = [e for e in errors if e["attempt"] >= first_attempt and "Connection" not in e["error"]]
    return f"attempt {errors[0]['attempt']}, rank {errors[0]['rank']}: {errors[0]['error']}" if errors else ""


def _check_fresh(report, out, ref, ref_rec, reached, err) -> None:
    got = _load(out, "C")
    ok, why = _same_state(ref, got)
    detail = why
    if reached != FRESH_KILL:
        detail = f"the run to be killed at step {FRESH_KILL} stopped at step {reached}"
    elif got is None:
        detail = f"the fresh job failed: {_phase_error(out, 'C') or err}"
    elif not ok:
        detail = _diagnose(ref_rec, _records(out, "C", WORLD)) or why
    report.check("a fresh job resumes exactly", 2, ok and reached == FRESH_KILL,
                 f"killed rank 1 after step {FRESH_KILL} and started a new job on the same directory: {detail}",
                 pass_note="bit-identical to the uninterrupted run" if _exact(WORLD) else "within tolerance")


def _check_restart(report, out, ref, ref_rec, err) -> None:
    rec = _records(out, "B", WORLD)
    resumed_from = RUN["save_every"] * (WRITE_KILL - 1)
    interrupted = RUN["save_every"] * WRITE_KILL
    att1 = [x["step"] for x in rec[0] if x["attempt"] == 1]
    # Name what a restarted attempt tripped on, not a peer's "connection closed" after a kill.
    if err is not None:
        err = _phase_error(out, "B", first_attempt=1) or err
    if not rec[0]:
        err = f"the job failed before it reached this scenario: {_phase_error(out, 'C') or err}"
    # an interrupted write is never loaded
    if att1 and att1[0] == resumed_from + 1:
        report.check("an interrupted write is never loaded", 2, True,
                     pass_note=f"killed inside step {interrupted}'s write; resumed from step {resumed_from}")
    else:
        seen = f"it resumed at step {att1[0]}" if att1 else f"it never trained again ({err})" if err else "no steps ran"
        report.check("an interrupted write is never loaded", 2, False,
                     f"rank 1 was killed while writing step {interrupted}'s checkpoint and torchrun restarted the "
                     f"job, which should resume from step {resumed_from}, but {seen}. Write into "
                     "staging_path(), commit() on rank 0 after a barrier, and load only latest_complete()")
    # torchrun restart: attempt 1 matches step by step until it is killed again
    diag = _diagnose(ref_rec, rec, attempt=1)
    ok1 = bool(att1) and att1[-1] == SECOND_KILL and not diag
    report.check("torchrun --max-restarts resumes exactly", 2, ok1,
                 diag or ("not checked: the first restart did not run to step "
                          f"{SECOND_KILL} ({err or 'no records'})"),
                 pass_note=f"steps {att1[0] if att1 else '?'}-{SECOND_KILL} identical to the uninterrupted run")
    ok2, why = _same_state(ref, _load(out, "B"))
    report.check("two crashes, still exact", 1, ok1 and ok2 and err is None,
                 (_diagnose(ref_rec, rec, attempt=2) or why or str(err)) if ok1 else
                 "not checked: the first restart was not exact",
                 pass_note="final weights and Adam state identical after resuming twice")


def _check_reshard(report, path, out, A, ref, world) -> None:
    err = _launch(path, out, [dict(name="R", dir=A, steps=RUN["steps"])], world, TIMEOUT["reshard"])
    got = _load(out, "R")
    ok, why = _same_state(ref, got, world)
    if err is not None:
        why = f"the job failed: {err}"
    elif got is not None and (got["step"], got["lr"]) != (ref["step"], ref["lr"]):
        ok, why = False, (f"it came back at step {got['step']} with lr {got['lr']:.6g}, expected step "
                          f"{ref['step']} and lr {ref['lr']:.6g}")
    report.check(f"resumes at world size {world} from a {WORLD}-rank checkpoint", 2, ok and err is None,
                 f"loading the last checkpoint of the {WORLD}-rank run with {world} ranks: {why}. DCP reshards "
                 "when you dcp.load into get_state_dict's (DTensor) state of the new model",
                 pass_note="model and Adam state identical after resharding")
