"""Rank-side instruments of the exercise 5 check: run the learner's ``train``, stop or kill it, record.

Everything here observes; the verdicts are computed in ``ex05_checkpoint``.
A launch runs, for each learner file, a list of *phases* (one ``train`` call
each, on its own checkpoint directory). A phase can end with every rank
raising :class:`Stopped` after a given step (the job ends there, so a new job
can resume: several files share such a launch), or with rank 1 SIGKILLing
itself after a given step, inside its N-th DCP write (its shard on disk,
DCP's ``.metadata`` not), or inside the next save after a given step, after
DCP's save and before its own files (``commit_kill``), chosen per torchrun attempt. Every rank appends one
record per step to a file: the step, the sample indices it read, the float64
sum of its local parameter shards and the learning rate after the step (the
scheduler's next value), and a snapshot taken just
before ``optimizer.step()`` of what the step started from (the weights, Adam's
step count and moments, the learning rate, a hash of the RNG state). It also
logs each call of a DCP or state-dict function, a collective every rank must
make. A killed process returns nothing, but its files survive.

The scenarios themselves, as the phases of each launch, are the grading process's (``scenarios``).
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.distributed.checkpoint.state_dict as dcp_state
import torch.distributed.checkpoint.state_dict_loader as dcp_loader
import torch.distributed.checkpoint.state_dict_saver as dcp_saver
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils.data import DistributedSampler, dataloader

from distlab import checkpoint, init_distributed
from distlab.data import RecordingDataset, synthetic_classification
from distlab.measure.memory import local_tensor

from ...rank import CapturedPrints, Replace, echo, learner_frame, load_learner, trace
from ...rank.spies import learner_line
from .commit_kill import CommitKill, die
from .commit_order import CommitOrder, commit_spy, watch_saves
from .observations import CallRecord, ErrorRecord, FinalState, PreStep, RankObservation, StepRecord

RUN = dict(steps=12, save_every=3, keep=2, seed=5)
# 5 batches of 16 per rank per epoch at W=2, no index left over (the run crosses two epochs: a loop that skips the
# epoch's last whole batch shows); at the reshard's 4 ranks 2 batches and 8 indices over, and the job resumes at
# index 32 of 40, past the last whole batch (a short batch of the 8 shows). The contract's two edges of an epoch.
DATA_SIZE = 160
SCENARIOS = ("fresh", "restart", "reshard")
FRESH_STOP = 5                 # fresh-job scenario: stopped after step 5, resumes from step 3
WRITE_KILL = 2                 # restart scenario, attempt 0: killed inside the 2nd checkpoint write (step 6)
SECOND_KILL = 8                # restart scenario, attempt 1: killed inside step 9's save_checkpoint, after
                               # DCP's save, before rank 1's own files (commit_kill); resumes from step 6
RESUMED_FROM = RUN["save_every"] * (WRITE_KILL - 1)  # the last checkpoint committed before the killed write
INTERRUPTED = RUN["save_every"] * WRITE_KILL         # the step whose checkpoint write was killed
RESHARD_FROM = RUN["steps"] - RUN["save_every"]     # reshard scenario: resumes from A's step 9, trains 10-12
MID_EPOCH, MID_EPOCH_FROM = "R2", RUN["save_every"]  # and from C's step 3, mid-epoch, trains 4-12 (scenarios)
# (module, name, the name logged): DCP's and the state-dict API's collectives, by every public name.
COLLECTIVES = [(dcp, n, f"dcp.{n}") for n in ("save", "load", "async_save")] + [
    (dcp_saver, "save", "dcp.save"), (dcp_saver, "async_save", "dcp.async_save"), (dcp_loader, "load", "dcp.load")] + [
    (dcp_state, n, n) for n in ("get_state_dict", "set_state_dict", "get_model_state_dict", "get_optimizer_state_dict",
                                "set_model_state_dict", "set_optimizer_state_dict")]
TORCH_SAVES = [(torch, "save", "torch.save"), (torch.serialization, "save", "torch.save")]  # logged, not collectives
# logged where the learner's code iterates a DataLoader without generator=: each iteration draws its base seed
# (and a RandomSampler its seed) from the global RNG, which dropout draws from too
LOADERS = [(dataloader._BaseDataLoaderIter, "__init__", "DataLoader iterated"),
           (DistributedSampler, "__init__", "DistributedSampler")]  # built without drop_last=True, logged
# watched, not logged: where the restart scenario's second kill lands (commit_kill)
BARRIERS = [(dist, "barrier", "dist.barrier"), (dist.distributed_c10d, "barrier", "dist.barrier")]
# the phase running: the learner's file, its call log, tag, last step, snapshot
_now = {"path": None, "log": None, "tag": "", "step": 0, "pre": None, "commit": None, "order": None}


class Stopped(BaseException):
    """Raised from ``on_step`` on every rank: the job stops there (a BaseException, past ``except Exception``)."""


def _restart_count() -> int:
    """Which torchrun attempt this is: 0, then 1 after the first restart (the records' ``attempt``)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def _rng_hash() -> str:
    """This rank's RNG state (CPU, and CUDA's under NCCL, where dropout draws from it), hashed."""
    state = torch.get_rng_state().numpy().tobytes()
    if dist.get_backend() == "nccl":
        state += torch.cuda.get_rng_state().numpy().tobytes()
    return hashlib.sha1(state).hexdigest()[:16]


def _fingerprint(optimizer) -> float:
    with torch.no_grad():
        return float(sum(local_tensor(p).double().sum().item() for g in optimizer.param_groups for p in g["params"]))


def _snapshot(optimizer, args, kwargs) -> None:
    """Global optimizer step pre-hook: what this step starts from (the last call before ``on_step`` wins)."""
    first = optimizer.state.get(optimizer.param_groups[0]["params"][0], {})
    moments = sum(local_tensor(v).double().sum().item() for s in optimizer.state.values() for k, v in s.items()
                  if k in ("exp_avg", "exp_avg_sq"))
    _now["pre"] = PreStep(fp=_fingerprint(optimizer), adam_step=float(first.get("step", 0)), moments=moments,
                          lr=float(optimizer.param_groups[0]["lr"]), rng=_rng_hash())


def _spy(name: str):
    def make(real):
        def spy(*args, **kwargs):
            found = learner_line(_now["path"]) if _now["log"] is not None else None  # inside a phase only
            where = (Path(found[0]).name, found[1]) if found else None  # the learner's file and line, if on the stack
            if _now["log"] is not None and name != "dist.barrier" and (name != "torch.save" or where):
                # logged before the call: a call that hangs or raises is on disk already; a save with what it held
                call = CallRecord(call=name, after_step=_now["step"], attempt=_restart_count(), tag=_now["tag"])
                if "save" in name or "load" in name:
                    call.held = trace.held(args[0] if args else kwargs.get("state_dict", kwargs.get("obj")))
                    call.file, call.line = where or (None, None)
                if name.startswith("dcp."):
                    call.checkpoint = _checkpoint_name(args, kwargs)
                elif name == "torch.save":  # the directory it wrote into: the staging one, or already the final
                    to = args[1] if len(args) > 1 else kwargs.get("f")
                    call.checkpoint = Path(to).parent.name if isinstance(to, (str, os.PathLike)) else None
                _log(call)
            commit, order = _now["commit"], _now["order"]
            if commit is not None and where:
                commit.reached(name, f"{where[0]}:{where[1]}")  # rank 1 may die here (commit_kill)
            if order is not None and where and name == "dist.barrier":
                order.barrier(entering=True)
            result = real(*args, **kwargs)
            if order is not None and where and name == "dist.barrier":
                order.barrier(entering=False)
            if commit is not None and name in ("dcp.save", "dcp.async_save"):
                commit.dcp_saved()
            return result
        return spy
    return make


def _log(call: CallRecord) -> None:
    """One call in the phase's log, on disk at once: a call that hangs, raises or is killed is there already."""
    _now["log"].write(json.dumps(call.to_wire()) + "\n")
    _now["log"].flush()


def _loader_spy(label: str):
    """Logs a DataLoader iterated without ``generator=``, and a DistributedSampler built without drop_last=True."""
    def make(real):
        def spy(self, loader, *args, **kwargs):
            found = learner_line(_now["path"]) if _now["log"] is not None else None
            sampler = label == "DistributedSampler"
            wrong = not kwargs.get("drop_last", args[4] if len(args) > 4 else False) if sampler else \
                getattr(loader, "generator", None) is None
            if found and wrong:
                _log(CallRecord(call=label, after_step=_now["step"], attempt=_restart_count(), tag=_now["tag"],
                                file=Path(found[0]).name, line=found[1]))
            return real(self, loader, *args, **kwargs)
        return spy
    return make


def _checkpoint_name(args: tuple, kwargs: dict) -> str | None:
    """The directory a DCP save or load was given (``checkpoint_id``, or its storage's ``path``), by its name
    (``step_3``, ``.tmp-step_6``): which checkpoint a resumed job read."""
    where = kwargs.get("checkpoint_id")
    if where is None:
        storage = kwargs.get("storage_writer", kwargs.get("storage_reader"))
        where = getattr(storage, "path", None)
    return Path(str(where)).name if where is not None else None


def _collective_spies() -> Replace:
    """Entered before the learner's file is imported, so ``from ... import get_state_dict`` (or
    ``state_dict_saver.save``) binds the spy too (:class:`~autograder.rank.Replace`); the learner's own
    ``torch.save`` calls (each rank's RNG state) are logged too, with what they held (not a collective)."""
    return Replace({**{(module, name): _spy(label) for module, name, label in COLLECTIVES + TORCH_SAVES + BARRIERS
                       if getattr(module, name, None) is not None},
                    **{(owner, name): _loader_spy(label) for owner, name, label in LOADERS},
                    (checkpoint, "commit"): commit_spy(lambda: _now["order"])})


def _full_state(model, optimizer) -> tuple[dict, dict]:
    """The model's full state dict, and the optimizer's state by parameter name (``FinalState``'s)."""
    msd, osd = get_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return msd, osd.get("state", {}) if isinstance(osd, dict) else {}


def _run_phase(learner, phase: dict, outdir: Path) -> None:
    """One ``train`` call, recorded step by step; rank 1 dies, or every rank stops, where the phase says."""
    rank, attempt, name = dist.get_rank(), _restart_count(), phase["name"]
    if phase.get("once") and ((outdir / f"{name}-final.pt").exists() or (outdir / f"{name}-errors.jsonl").exists()):
        return  # a torchrun restart replays the launch: this phase already ran in an earlier attempt
    if not (began := outdir / f"{name}-began-rank{rank}").exists():
        began.write_text(str(attempt))  # the attempt the phase began in: its kills are scheduled from attempt 0
    data = RecordingDataset(synthetic_classification(DATA_SIZE, 64, 10, seed=3))
    kill_step = phase.get("kill_step", {}).get(str(attempt)) if rank == 1 else None
    kill_write = phase.get("kill_write", {}).get(str(attempt)) if rank == 1 else None
    hook = register_optimizer_step_pre_hook(_snapshot)
    with open(outdir / f"{name}-rank{rank}.jsonl", "a") as log, \
            open(outdir / f"{name}-calls-rank{rank}.jsonl", "a") as calls, _killed_in_write(kill_write):
        _now.update(path=Path(learner.__file__).resolve(), log=calls, tag=phase["tag"], step=0, pre=None,
                    commit=CommitKill(phase, rank, attempt, outdir), order=CommitOrder(phase, rank, outdir))
        try:
            with CapturedPrints() as out:
                returned = learner.train(phase["dir"], data, steps=phase["steps"], save_every=RUN["save_every"],
                                         keep=RUN["keep"], seed=RUN["seed"],
                                         on_step=_step_recorder(data, log, phase, kill_step))
        except Stopped:
            echo(out.lines)
            if rank == 0:
                (outdir / f"{name}-stopped").touch()
            return
        except BaseException as exc:  # DCP raises CheckpointException, a BaseException
            _record_error(outdir / f"{name}-errors.jsonl", exc, learner.__file__, root=phase["dir"])
            raise
        finally:
            _now["log"] = _now["commit"] = _now["order"] = None
            hook.remove()
    echo(out.lines)
    if not (isinstance(returned, (tuple, list)) and len(returned) == 4):
        line, code = trace.return_line(learner.train)
        raise TypeError(f"train returned {type(returned).__name__}, not (model, optimizer, scheduler, step), at "
                        f"{Path(learner.__file__).name} line {line}: {code}")
    _save_final(returned, outdir / f"{name}-final.pt")


def _step_recorder(data: RecordingDataset, log, phase: dict, kill_step: int | None):
    """The ``on_step`` hook: one record per step in ``log``; SIGKILL after ``kill_step``, stop after ``stop_step``."""
    read = {"n": 0}

    def on_step(step, optimizer):
        rec = StepRecord(attempt=_restart_count(), tag=phase["tag"], step=int(step), data=data.accessed[read["n"]:],
                         fp=_fingerprint(optimizer), lr=optimizer.param_groups[0]["lr"], pre=_now["pre"])
        read["n"], _now["step"] = len(data.accessed), int(step)
        log.write(json.dumps(rec.to_wire()) + "\n")
        log.flush()  # a killed process writes nothing more: what it recorded must be on disk already
        if kill_step is not None and step == kill_step:
            die()
        _now["commit"].reported(int(step))
        if step == phase.get("stop_step"):
            raise Stopped()

    return on_step


def _killed_in_write(kill_write: int | None) -> Replace:
    """While entered, this rank dies right after its ``kill_write``-th DCP shard write."""
    from torch.distributed.checkpoint.filesystem import FileSystemWriter
    writes = {"n": 0}

    def make(real_write):
        def write_data(self, plan, planner):
            fut = real_write(self, plan, planner)
            fut.wait()
            writes["n"] += 1
            if kill_write is not None and writes["n"] == kill_write:
                die()  # this rank's shard is written; DCP's .metadata never will be
            return fut
        return write_data

    return Replace({(FileSystemWriter, "write_data"): make})


def _record_error(errors: Path, exc: BaseException, path: str, root: str) -> None:
    """Kept for the verdict: a restarted attempt's error is the telling one (not the crash it follows); with
    the learner's line it came from. The paths in it are said from ``root`` (train's), not the grader's folders."""
    said = f"{type(exc).__name__}: {exc}".replace(str(Path(root).resolve()), "root").replace(str(root), "root")
    lines = [ln.strip() for ln in said.splitlines() if ln.strip()]
    cause = next((ln for ln in reversed(lines) if "Error" in ln), lines[0])
    frame = learner_frame(exc, path)
    with open(errors, "a") as f:
        f.write(json.dumps(ErrorRecord(attempt=_restart_count(), rank=dist.get_rank(), error=cause[:300],
                                       at=str(frame) if frame else "").to_wire()) + "\n")


def _save_final(returned: tuple, path: Path) -> None:
    """Rank 0 saves the trained model's and optimizer's full state, the step, LR and scheduler epoch."""
    model, optimizer, scheduler, step = returned
    msd, osd = _full_state(model, optimizer)  # a collective: every rank calls it
    if dist.get_rank() == 0:
        state = FinalState(model=msd, optim=osd, step=int(step), lr=float(optimizer.param_groups[0]["lr"]),
                           scheduler_epoch=int(scheduler.last_epoch))
        torch.save(state.to_wire(), path)
    dist.barrier()


def rank_main(paths: list[str], outdirs: list[str], phases: list[list[dict]]) -> list[dict]:
    """Runs on every rank: for each file in ``paths``, its ``phases`` in order, recorded in its ``outdirs``.

    A phase that kills a rank ends the whole job (and a torchrun restart replays the launch); one
    that stops every rank lets the next file run.
    """
    init_distributed()
    with _collective_spies():
        for path, outdir, file_phases in zip(paths, outdirs, phases):
            Path(outdir).mkdir(parents=True, exist_ok=True)
            learner = load_learner(path)
            watch_saves(learner, lambda: _now["order"])
            for phase in file_phases:
                _run_phase(learner, phase, Path(outdir))
            trace.dump(path, Path(outdir) / f"trace-rank{dist.get_rank()}.pt")  # if traced: its events so far
    return [RankObservation(rank=dist.get_rank()).to_wire() for _ in paths]
