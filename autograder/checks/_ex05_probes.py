"""Rank-side instruments of the exercise 5 check: run the learner's ``train``, kill it, record.

Everything here observes; the verdicts are computed in ``ex05_checkpoint``.
A launch runs a list of *phases* (one ``train`` call each, on its own
checkpoint directory). Rank 1 can SIGKILL itself after a given step, or
inside its N-th DCP write (its shard on disk, DCP's ``.metadata`` not),
chosen per torchrun attempt. Every rank appends one record per step to a
file (the step, the LR, a hash of its RNG state, the sample indices it read,
the float64 sum of its local parameter shards): a killed process returns
nothing, but its files survive.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from distlab import init_distributed
from distlab.data import RecordingDataset, synthetic_classification

from ..harness import CapturedPrints, echo, load_learner

RUN = dict(steps=12, save_every=3, keep=2, seed=5)
DATA_SIZE = 256                # 8 batches of 16 per rank per epoch at W=2: the run crosses an epoch


def _attempt() -> int:
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def _die() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
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
    """One ``train`` call, recorded step by step; rank 1 dies where the phase says (per attempt)."""
    rank, attempt = dist.get_rank(), _attempt()
    data = RecordingDataset(synthetic_classification(DATA_SIZE, 64, 10, seed=3))
    kill_step = phase.get("kill_step", {}).get(str(attempt)) if rank == 1 else None
    kill_write = phase.get("kill_write", {}).get(str(attempt)) if rank == 1 else None
    with open(outdir / f"{phase['name']}-rank{rank}.jsonl", "a") as log, _killed_in_write(kill_write):
        try:
            with CapturedPrints() as out:
                returned = learner.train(phase["dir"], data, steps=phase["steps"], save_every=RUN["save_every"],
                                         keep=RUN["keep"], seed=RUN["seed"],
                                         on_step=_step_recorder(data, log, kill_step))
        except BaseException as exc:  # DCP raises CheckpointException, a BaseException
            _record_error(outdir / f"{phase['name']}-errors.jsonl", exc)
            raise
    echo(out.lines)
    _save_final(returned, outdir / f"{phase['name']}-final.pt")


def _step_recorder(data: RecordingDataset, log, kill_step: int | None):
    """The ``on_step`` hook: one record per step in ``log``, and SIGKILL after step ``kill_step``."""
    attempt, read = _attempt(), {"n": 0}

    def on_step(step, optimizer):
        rec = {"attempt": attempt, "step": int(step), "lr": optimizer.param_groups[0]["lr"], "rng": _rng_hash(),
               "data": data.accessed[read["n"]:], "fp": _fingerprint(optimizer)}
        read["n"] = len(data.accessed)
        log.write(json.dumps(rec) + "\n")
        log.flush()  # a killed process writes nothing more: what it recorded must be on disk already
        if kill_step is not None and step == kill_step:
            _die()

    return on_step


@contextlib.contextmanager
def _killed_in_write(kill_write: int | None):
    """While the block runs, this rank dies right after its ``kill_write``-th DCP shard write."""
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
        yield
    finally:
        FileSystemWriter.write_data = real_write


def _record_error(errors: Path, exc: BaseException) -> None:
    """Kept for the verdict: a restarted attempt's error is the telling one (not the crash it follows)."""
    lines = [ln.strip() for ln in f"{type(exc).__name__}: {exc}".splitlines() if ln.strip()]
    cause = next((ln for ln in reversed(lines) if "Error" in ln), lines[0])
    with open(errors, "a") as f:
        f.write(json.dumps({"attempt": _attempt(), "rank": dist.get_rank(), "error": cause[:300]}) + "\n")


def _save_final(returned: tuple, path: Path) -> None:
    """Rank 0 saves the trained model's and optimizer's full state, the step, LR and scheduler epoch."""
    model, optimizer, scheduler, step = returned
    state = _full_state(model, optimizer)  # a collective: every rank calls it
    if dist.get_rank() == 0:
        state.update(step=int(step), lr=float(optimizer.param_groups[0]["lr"]),
                     scheduler_epoch=int(scheduler.last_epoch))
        torch.save(state, path)
    dist.barrier()


def rank_main(paths: list[str], outdir: str, phases: list[dict]) -> list[dict]:
    """Runs on every rank: the phases in order for the one file in ``paths`` (one observation).

    One file per launch: a phase that kills a rank ends the whole job, and a restart replays it.
    """
    (path,) = paths
    init_distributed()
    learner = load_learner(path)
    for phase in phases:
        _run_phase(learner, phase, Path(outdir))
    return [{"rank": dist.get_rank()}]
