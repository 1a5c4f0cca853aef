"""Exercise 5 check: kill a rank, resume, and demand the very same weights.

Scenarios (each a torchrun launch; the grader shares launches where it can):

* ``reference``: an uninterrupted run in directory A (its records and final
  state are the yardstick), then, in the same processes, a run in directory C
  in which rank 1 SIGKILLs itself at step ``FRESH_KILL`` (the job dies; no restart).
* ``fresh``: a new job on directory C finishes the run.
* ``restart``: one torchrun job with ``--max-restarts=2`` on directory B. In
  attempt 0 rank 1 is killed *inside* its second checkpoint write (its shard
  is on disk, DCP's ``.metadata`` is not), so attempt 1 must resume from the
  previous complete checkpoint; attempt 1 is killed at ``SECOND_KILL``;
  attempt 2 finishes.
* ``reshard``: a job at another world size resumes from A's last checkpoint.

Every rank appends one record per step to a file (the step, the LR, a hash of
its RNG state, the sample indices it read, the float64 sum of its local
parameter shards): killed processes return nothing, files survive. On the
CPU, reduction order is fixed, so resumed runs must match the uninterrupted
one bit for bit (``torch.equal``); on a GPU within assert_close's tolerance.
"""
from __future__ import annotations

import hashlib
import json
import os
import signal
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from distlab import LaunchError, init_distributed, pick_backend, torchrun
from distlab.checkpoint import complete_checkpoints
from distlab.data import RecordingDataset, synthetic_classification

from ..harness import CapturedPrints, echo, load_learner
from ..registry import Exercise
from ..report import ExerciseReport

EXERCISE = Exercise(number=5, name="checkpoint", filename="ex05_checkpoint.py", max_score=10, time_limit=200)
WORLD, RESHARD_WORLD = 2, 4
RUN = dict(steps=12, save_every=3, keep=2, seed=5)
DATA_SIZE = 256                # 8 batches of 16 per rank per epoch at W=2: the run crosses an epoch
FRESH_KILL = 5                 # fresh-job scenario: killed after step 5, resumes from step 3
WRITE_KILL = 2                 # restart scenario, attempt 0: killed inside the 2nd checkpoint write (step 6)
SECOND_KILL = 8                # restart scenario, attempt 1: killed after step 8, resumes from step 6
SCENARIOS = ("fresh", "restart", "reshard")


def _attempt() -> int:
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def _die() -> None:
    for stream in ("stdout", "stderr"):
        getattr(__import__("sys"), stream).flush()
    os.kill(os.getpid(), signal.SIGKILL)


def _rng_hash() -> str:
    """This rank's RNG state (CPU, and CUDA's under NCCL, where dropout draws from it), hashed."""
    state = torch.get_rng_state().numpy().tobytes()
    if dist.get_backend() == "nccl":
        state += torch.cuda.get_rng_state().numpy().tobytes()
    return hashlib.sha1(state).hexdigest()[:16]


def _fingerprint(optimizer) -> float:
    with torch.no_grad():
        return float(sum(p.to_local().double().sum().item() if hasattr(p, "to_local") else p.double().sum().item()
                         for g in optimizer.param_groups for p in g["params"]))


def _full_state(model, optimizer) -> dict:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
    msd, osd = get_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {"model": msd, "optim": osd.get("state", {}) if isinstance(osd, dict) else {}}


def _run_phase(learner, phase: dict, outdir: Path) -> None:
    rank, attempt = dist.get_rank(), _attempt()
    data = RecordingDataset(synthetic_classification(DATA_SIZE, 64, 10, seed=3))
    log = open(outdir / f"{phase['name']}-rank{rank}.jsonl", "a")
    read = {"n": 0}
    kill_step = phase.get("kill_step", {}).get(str(attempt)) if rank == 1 else None
    kill_write = phase.get("kill_write", {}).get(str(attempt)) if rank == 1 else None

    def on_step(step, optimizer):
        rec = {"attempt": attempt, "step": int(step), "lr": optimizer.param_groups[0]["lr"],
               "rng": _rng_hash(),
               "data": data.accessed[read["n"]:], "fp": _fingerprint(optimizer)}
        read["n"] = len(data.accessed)
        log.write(json.dumps(rec) + "\n")
        log.flush()
        if kill_step is not None and step == kill_step:
            _die()

    from torch.distributed.checkpoint.filesystem import FileSystemWriter
    real_write = FileSystemWriter.write_data
    writes = {"n": 0}

    def write_data(self, plan, planner):
        fut = real_write(self, plan, planner)
        fut.wait()
        writes["n"] += 1
        if kill_write is not None and writes["n"] == kill_write:
            _die()  # this rank's shard is written; DCP's .metadata never will be
        return fut

    FileSystemWriter.write_data = write_data
    try:
        with CapturedPrints() as out:
            returned = learner.train(phase["dir"], data, steps=phase["steps"], save_every=RUN["save_every"],
                                     keep=RUN["keep"], seed=RUN["seed"], on_step=on_step)
    except BaseException as exc:  # DCP raises CheckpointException, a BaseException
        # Kept for the verdict: a restarted attempt's error is the telling one.
        lines = [ln.strip() for ln in f"{type(exc).__name__}: {exc}".splitlines() if ln.strip()]
        cause = next((ln for ln in reversed(lines) if "Error" in ln), lines[0])
        with open(outdir / f"{phase['name']}-errors.jsonl", "a") as f:
            f.write(json.dumps({"attempt": attempt, "rank": rank, "error": cause[:300]}) + "\n")
        raise
    finally:
        FileSystemWriter.write_data = real_write
        log.close()
    echo(out.lines)
    model, optimizer, scheduler, step = returned
    state = _full_state(model, optimizer)
    if rank == 0:
        state.update(step=int(step), lr=float(optimizer.param_groups[0]["lr"]),
                     scheduler_epoch=int(scheduler.last_epoch))
        torch.save(state, outdir / f"{phase['name']}-final.pt")
    dist.barrier()


def rank_main(path: str, outdir: str, phases: list[dict]) -> dict:
    """Runs on every rank: the phases in order (a phase that kills a rank ends the job)."""
    init_distributed()
    learner = load_learner(path)
    for phase in phases:
        _run_phase(learner, phase, Path(outdir))
    return {"rank": dist.get_rank()}


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
        if exact and not torch.equal(a, b):
            return False, f"{name} differs (max abs difference {(a.double() - b.double()).abs().max().item():.3g})"
        if not exact:
            try:
                torch.testing.assert_close(b, a)
            except AssertionError:
                return False, f"{name} differs beyond tolerance"
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


def _launch(path: Path, outdir: Path, phases: list[dict], world: int, **kw) -> LaunchError | None:
    try:
        torchrun(rank_main, world, args=(str(path), str(outdir), phases), timeout=120, **kw)
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
        err = _launch(path, out, phases, WORLD)
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
        if "fresh" in scenarios:
            _check_fresh(report, path, out, C, ref, ref_rec)
        if "restart" in scenarios:
            _check_restart(report, path, out, B, ref, ref_rec)
        if "reshard" in scenarios:
            _check_reshard(report, path, out, A, ref, reshard_world)
    scale = EXERCISE.max_score / sum(c.points for c in report.criteria)
    for c in report.criteria:  # a subset of scenarios still scores out of max_score
        c.points, c.earned = c.points * scale, c.earned * scale
    return report


def _check_fresh(report, path, out, C, ref, ref_rec) -> None:
    first = _records(out, "C", WORLD)
    reached = max((x["step"] for x in first[1]), default=0)
    err = _launch(path, out, [dict(name="C", dir=C, steps=RUN["steps"])], WORLD) if reached == FRESH_KILL else None
    ok, why = _same_state(ref, _load(out, "C"))
    detail = why
    if reached != FRESH_KILL:
        detail = f"the run to be killed at step {FRESH_KILL} stopped at step {reached}"
    elif err is not None:
        detail = f"the fresh job failed: {err}"
    elif not ok:
        detail = _diagnose(ref_rec, _records(out, "C", WORLD)) or why
    report.check("a fresh job resumes exactly", 2, ok and reached == FRESH_KILL and err is None,
                 f"killed rank 1 after step {FRESH_KILL} and started a new job on the same directory: {detail}",
                 pass_note="bit-identical to the uninterrupted run" if _exact(WORLD) else "within tolerance")


def _check_restart(report, path, out, B, ref, ref_rec) -> None:
    t = __import__("time").perf_counter()
    err = _launch(path, out, [dict(name="B", dir=B, steps=RUN["steps"], kill_write={"0": WRITE_KILL},
                                   kill_step={"1": SECOND_KILL})], WORLD, max_restarts=2)
    report.measurements["restart_scenario_s"] = round(__import__("time").perf_counter() - t, 2)
    rec = _records(out, "B", WORLD)
    resumed_from = RUN["save_every"] * (WRITE_KILL - 1)
    interrupted = RUN["save_every"] * WRITE_KILL
    att1 = [x["step"] for x in rec[0] if x["attempt"] == 1]
    errors = out / "B-errors.jsonl"
    later = [json.loads(ln) for ln in errors.read_text().splitlines()] if errors.is_file() else []
    # Name what a restarted attempt tripped on, not a peer's "connection closed" after a kill.
    later = [e for e in later if e["attempt"] >= 1 and "Connection" not in e["error"]]
    if later and err is not None:
        err = f"attempt {later[0]['attempt']}, rank {later[0]['rank']}: {later[0]['error']}"
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
    err = _launch(path, out, [dict(name="R", dir=A, steps=RUN["steps"])], world)
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
