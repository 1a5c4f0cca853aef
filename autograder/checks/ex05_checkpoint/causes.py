"""Exercise 5's likely mistakes, tested against what the ranks recorded (see autograder/grader/diagnosis.py).

Each takes the :class:`~.observations.Run` of one file (its records: :mod:`.observations`). :func:`diagnose_resume`
compares a resumed run with the uninterrupted one step by step and, at the first step where anything
differs, names a shifted step counter or what that step started from (``COMPONENTS``: the weights,
Adam's state, the data position, the learning rate, the RNG state); :func:`against_reference` compares
the uninterrupted run with the single-process reference (``reference``) the same way, which
names what both of the learner's runs share (``CONTRACT``); the check's criteria ask for the
other causes themselves.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from distlab import LaunchError, RankFailure, pick_backend
from distlab.checkpoint import final_path

from ...grader.diagnosis import KnownError, mistake
from ...grader.parity import parity
from .observations import WORLD, Run, StepRecord
from .probes import DATA_SIZE, INTERRUPTED, RESUMED_FROM, RUN
from .reference import BATCH_SIZE, ReferenceStep, contract_batch, reference_run


KNOWN_ERRORS = [
    KnownError("a checkpoint written on some ranks only", r"Parent directory \S*\.tmp-step_\d+ does not exist",
               "the staging directory did not exist when this rank wrote into it: dcp.save makes it, on every rank "
               "that calls it, and commit() renames it. Every rank calls get_state_dict and dcp.save, then saves its "
               "own RNG state; rank 0 commits after a barrier"),
    KnownError("dcp.load of a key the checkpoint lacks", r"Missing key in checkpoint state_dict",
               "dcp.load fills the keys of the dict you pass it, and each must have been saved: build the same "
               "structure save_checkpoint saved (get_state_dict gives the tensors to load into)"),
]


def exact(world: int) -> bool:
    """Bit-identical under gloo on the CPU; within tolerance under NCCL (GPU kernels may reorder)."""
    return pick_backend(world) == "gloo"


def _close(a: float, b: float) -> bool:
    return a == b if exact(WORLD) else abs(a - b) <= 1e-5 * (1 + abs(b))


@mistake("a checkpoint collective called on some ranks only")
def one_sided_collective(run: Run, name: str, world: int = WORLD, **match) -> str | None:
    """The first DCP or state-dict call one rank made more often than another in a phase."""
    calls = run.calls(name, world, **match)
    for call in dict.fromkeys(c.call for rank in calls for c in rank if c.call != "torch.save"):
        made = [[c for c in rank if c.call == call] for rank in calls]
        more = max(range(world), key=lambda r: len(made[r]))
        fewer = min(range(world), key=lambda r: len(made[r]))
        if len(made[more]) != len(made[fewer]):
            done = made[more][len(made[fewer])].after_step
            when = f"at step {done + 1}" if done else "before the first step"
            return (f"{call} ran on rank {more} ({when}) but not on rank {fewer}: it is a "
                    "collective, so every rank calls it (each writes or reads its own shards); do not put it under "
                    "`if rank == 0:`")
    return None


@mistake("a checkpoint committed before every rank's files are in it")
def committed_under_a_rank(run: Run, err: LaunchError | None) -> str | None:
    """A rank's write into a staging directory that failed because rank 0 had already renamed it."""
    found = re.search(r"Parent directory (\S*)\.tmp-step_(\d+) does not exist", str(getattr(err, "exc_message", "")))
    if not (isinstance(err, RankFailure) and found):
        return None
    root, step = Path(found.group(1)), int(found.group(2))
    if not (final_path(root, step) / ".metadata").is_file():
        return None
    return (f"rank {err.rank} wrote into step {step}'s staging directory ({root.name}/.tmp-step_{step:08d}) after "
            f"rank 0 had committed it (renamed it to step_{step:08d}), so its own file never got there: rank 0 "
            "committed before every rank had written its files. Call dist.barrier() on every rank once its own "
            "files are written, and have rank 0 commit only after it")


@mistake("no barrier after the commit: a rank goes on while rank 0 commits")
def ran_ahead(run: Run) -> str | None:
    record = run.out / "A-commit-order.json"  # commit_order: the first save rank 1 returned from first
    if not record.is_file():
        return None
    step = json.loads(record.read_text())["step"]
    return (f"rank 1 returned from step {step}'s save_checkpoint while rank 0 had not yet committed it (the grader "
            "held rank 0's commit until rank 1 either waited in a barrier or went on): end save_checkpoint with a "
            "second dist.barrier(), after rank 0's commit and prune, so that no rank goes on, or is stopped, before "
            "the checkpoint it saved exists")


@mistake("commit on every rank")
def committed_twice(run: Run, err: LaunchError | None) -> str | None:
    """A rank's rename of a staging directory that failed because another rank's commit had renamed it already."""
    found = re.search(r"No such file or directory: '(\S*)\.tmp-step_(\d+)' -> ", str(getattr(err, "exc_message", "")))
    if not (isinstance(err, RankFailure) and found):
        return None
    root, step = Path(found.group(1)), int(found.group(2))
    if not final_path(root, step).is_dir():
        return None
    return (f"commit ran on more than one rank: rank {err.rank}'s found no .tmp-step_{step:08d} to rename, another "
            f"rank's had already renamed it to step_{step:08d}. Commit (and prune) on rank 0 only, between the two "
            "barriers: `if dist.get_rank() == 0:`")


def said(run: Run, err: LaunchError | str) -> str:
    """A launch's failure in the learner's terms (``grader.main.explain``: the line of the learner's file, gloo's
    sizes where it aborted a rank)."""
    from ...grader.main import explain
    return explain(err, run.path, KNOWN_ERRORS) if isinstance(err, LaunchError) and run.path else str(err)


def restart_error(run: Run) -> str | LaunchError | None:
    """What stopped the restart scenario: what a restarted attempt tripped on, not the kill before it."""
    err = run.resume_error
    if err is not None:
        err = one_sided_collective(run, "B", attempt=1) or run.phase_error("B", first_attempt=1) or said(run, err)
    if not any((run.out / f"B-began-rank{r}").is_file() for r in range(WORLD)):  # B never began
        err = f"the job failed before it reached this scenario: {run.phase_error('C') or err}"
    return err


@mistake("step counter off after resuming")
def step_shift(run: Run, xs: list[StepRecord], first: bool) -> str | None:
    s = xs[0].step
    for k in (1, -1, 2, -2):
        refs = [run.ref_at(r, s + k) for r in range(len(xs))]
        if all(a is not None and not _differs(x, a) for x, a in zip(xs, refs)):
            return (f"{'the first step after resuming' if first else f'step {s}'} was numbered {s}, but it trained "
                    f"exactly what the uninterrupted run trained at step {s + k} (the same weights, Adam state, "
                    f"learning rate, RNG state and samples): the checkpoint was written after step {s + k - 1}, so "
                    f"the step counter is {abs(k)} {'behind' if k > 0 else 'ahead'}. Resume with step = {s + k - 1}, "
                    f"the number of steps done, so that the next step is {s + k}")
    return None


def _differs(x: StepRecord, a: StepRecord) -> list[str]:
    """What a step started from that differs between a record ``x`` and the uninterrupted run's ``a``."""
    p, q = x.pre, a.pre
    out = [] if x.data == a.data else ["data"]
    if p and q:
        adam = p.adam_step != q.adam_step or not _close(p.moments, q.moments)
        out += [k for k, bad in (("model", not _close(p.fp, q.fp)), ("optimizer", adam),
                                 ("scheduler", p.lr != q.lr or x.lr != a.lr),
                                 ("rng", p.rng != q.rng)) if bad]
    return out


# How each part of the state is named among a checkpoint's keys (the contract's names, and the usual others).
KEYS = {"optimizer": ("optim",), "scheduler": ("sched", "lr_sched"), "data": ("data", "position", "epoch", "offset"),
        "rng": ("rng", "cpu", "cuda")}


def saved(run: Run, part: str, r: int) -> str | None:
    """Where rank ``r``'s uninterrupted run saved ``part`` of the state, as "'optim' (dcp.save at
    ex05_checkpoint.py:90)"; ``None`` when no save of the learner's held it."""
    for call in run.calls("A")[r]:
        held = call.held if call.call in ("dcp.save", "dcp.async_save", "torch.save") else None
        keys = [k for k in held if k.split(".")[0].lower().startswith(KEYS[part])] if isinstance(held, list) else []
        if keys and call.line is not None:
            return f"'{keys[0].split('.')[0]}' ({call.call} at {call.file}:{call.line})"
    return None


def _advice(run: Run, part: str, r: int, save: str, restore: str) -> str:
    """``save`` (the advice to save and load ``part``), or where the checkpoint already holds it and ``restore``."""
    where = saved(run, part, r)
    return f": your checkpoint holds {where}, but it was not restored: {restore}" if where else save


@mistake("model not restored")
def model_not_restored(run: Run, x: StepRecord, a: StepRecord, r: int) -> str | None:
    if "model" not in _differs(x, a):
        return None
    fresh = run.ref_rec[r][0].pre if run.ref_rec[r] else None
    how = ("the freshly built model's: train the model the checkpoint was loaded into" if fresh and
           _close(x.pre.fp, fresh.fp) else "restore the model")
    return (f"rank {r} resumed with other weights than the uninterrupted run had before step {x.step} (sum of "
            f"its shards {x.pre.fp:.9g} vs {a.pre.fp:.9g}): {how} (dcp.load into get_state_dict's "
            "tensors, then set_state_dict)")


@mistake("optimizer state not restored")
def optimizer_not_restored(run: Run, x: StepRecord, a: StepRecord, r: int) -> str | None:
    if "optimizer" not in _differs(x, a):
        return None
    p, q = x.pre, a.pre
    what = (f"Adam's step count was {p.adam_step:g} where the uninterrupted run's was {q.adam_step:g}"
            if p.adam_step != q.adam_step else
            f"Adam's moments differ (sum {p.moments:.9g} vs {q.moments:.9g})")
    return what + _advice(run, "optimizer", r, ": save the optimizer's state from get_state_dict(model, optimizer) "
                          "and load it with set_state_dict",
                          "dcp.load it into get_state_dict's tensors, then set_state_dict")


def read_again(run: Run, x: StepRecord, r: int) -> bool:
    """Whether rank ``r``'s step ``x`` read the samples of the step before it, a step a checkpoint was saved after."""
    before = run.ref_at(r, x.step - 1)
    return before is not None and x.data == before.data and (x.step - 1) % RUN["save_every"] == 0


@mistake("data position saved before the step's samples were counted")
def position_behind(run: Run, x: StepRecord, a: StepRecord, r: int) -> str | None:
    if x.data == a.data or not read_again(run, x, r):
        return None
    return (f"rank {r} read samples {x.data[:3]}..., those of step {x.step - 1} again, the step whose checkpoint it "
            f"resumed from: the data position it resumed with is where step {x.step - 1} began, not "
            "where it ended. Count a step's samples before saving its checkpoint")


def resumed_behind(run: Run) -> int | None:
    """The step at which a 2-rank resume read the samples of its checkpoint's step again (:func:`position_behind`)."""
    for recs in (run.records("C", tag="resume"), run.records("B", attempt=1)):
        for r, mine in enumerate(recs):
            if mine and mine[0].data != getattr(run.ref_at(r, mine[0].step), "data", None) and \
                    read_again(run, mine[0], r):
                return mine[0].step
    return None


@mistake("data position not restored")
def data_not_restored(run: Run, x: StepRecord, a: StepRecord, r: int) -> str | None:
    if x.data == a.data or read_again(run, x, r):  # position_behind's
        return None
    same = [y.step for y in run.ref_rec[r] if y.data == x.data]
    return (f"rank {r} read samples {x.data[:3]}... instead of {a.data[:3]}..."
            + (f" (the samples of step {same[0]})" if same else "")
            + _advice(run, "data", r, ": save the data position (sampler epoch and samples used) and continue from it",
                      "continue from the epoch and samples used that load_checkpoint returned"))


def loaded_without_set(run: Run, phase: str, r: int, world: int = WORLD, **match) -> bool:
    """Whether rank ``r`` called dcp.load in ``phase`` and neither set_state_dict nor set_optimizer_state_dict."""
    calls = {c.call for c in run.calls(phase, world, **match)[r]}
    return "dcp.load" in calls and not {"set_state_dict", "set_optimizer_state_dict"} & calls


PARAM_GROUPS = ("dcp.load fills get_state_dict's tensors in place (the weights, Adam's moments), but an optimizer's "
                "param_groups, its learning rate among them, come back only with set_state_dict(model, optimizer, "
                "model_state_dict=..., optim_state_dict=...)")


@mistake("optimizer's param_groups not set back after dcp.load")
def groups_not_set(run: Run, x: StepRecord, a: StepRecord, r: int) -> str | None:
    phase = PHASE_OF_TAG.get(x.tag)
    if "scheduler" not in _differs(x, a) or x.pre.lr == a.pre.lr or phase is None:
        return None
    if not loaded_without_set(run, phase, r, attempt=x.attempt, tag=x.tag):
        return None
    return (f"the learning rate was {x.pre.lr:.6g} instead of {a.pre.lr:.6g}: the resumed job called dcp.load but "
            f"neither set_state_dict nor set_optimizer_state_dict. {PARAM_GROUPS}")


@mistake("scheduler not restored")
def scheduler_not_restored(run: Run, x: StepRecord, a: StepRecord, r: int) -> str | None:
    if "scheduler" not in _differs(x, a) or groups_not_set(run, x, a, r):
        return None
    advice = _advice(run, "scheduler", r, ": save scheduler.state_dict() and load it on resume",
                     "scheduler.load_state_dict() it on resume")
    if x.pre.lr == a.pre.lr:  # the optimizer's state gave this step's rate back, not the schedule
        return (f"the learning rate it set for step {x.step + 1} was {x.lr:.6g} instead of {a.lr:.6g} (the "
                "optimizer's state restored the current rate, not the schedule)" + advice)
    same = [y.step for y in run.ref_rec[r] if y.pre and y.pre.lr == x.pre.lr]
    if same and same[0] == x.step - 1 > 1:  # restored, but as it was one step earlier: saved before it stepped
        return (f"the learning rate was {x.pre.lr:.6g} instead of {a.pre.lr:.6g}, the uninterrupted run's "
                f"at step {same[0]}: the scheduler state you restored is one step behind, so it was saved before "
                "that step's scheduler.step(): step the optimizer and the scheduler, then save")
    return (f"the learning rate was {x.pre.lr:.6g} instead of {a.pre.lr:.6g}"
            + (f" (the uninterrupted run's at step {same[0]}: the schedule started over)" if same else "") + advice)


@mistake("another rank's RNG state restored")
def other_ranks_rng(run: Run, x: StepRecord, a: StepRecord, r: int) -> str | None:
    if "rng" not in _differs(x, a):
        return None
    for q in range(len(run.ref_rec)):
        b = run.ref_at(q, x.step)
        if q != r and b and b.pre and b.pre.rng == x.pre.rng:
            return (f"rank {r}'s RNG state is rank {q}'s, so dropout drew rank {q}'s masks: each rank restores its "
                    "own rng-rank{R}.pt (the RNG state differs per rank)")
    return None


LOADER_ADVICE = ("each time it is iterated it draws its base seed from the global RNG, which dropout draws from "
                 "too. Pass generator=torch.Generator() to the DataLoader: the data loading then draws from its own")


PHASE_OF_TAG = {"resume": "C", "restart": "B"}  # the resumed phases (scenarios): a step record's tag, its phase


def loader_drew(run: Run, phase: str, r: int, **match) -> str | None:
    """Where rank ``r`` iterated a DataLoader without ``generator=`` in ``phase`` ("ex05_checkpoint.py:180")."""
    calls = [c for c in run.calls(phase, **match)[r] if c.call == "DataLoader iterated"]
    return f"{calls[0].file}:{calls[0].line}" if calls else None


@mistake("a DataLoader without a generator draws from the global RNG after a restore")
def loader_after_restore(run: Run, x: StepRecord, a: StepRecord, r: int) -> str | None:
    phase = PHASE_OF_TAG.get(x.tag)
    if "rng" not in _differs(x, a) or not phase or not (where := loader_drew(run, phase, r, attempt=x.attempt,
                                                                            tag=x.tag)):
        return None
    if loader_drew(run, "A", r, after_step=x.step - 1):  # the uninterrupted run drew there too
        return None
    return (f"rank {r}'s RNG state differs from the uninterrupted run's: the resumed job iterated its DataLoader "
            f"(at {where}) before step {x.step}, where the uninterrupted run did not; it has no generator=, so "
            + LOADER_ADVICE)


@mistake("RNG state not restored")
def rng_not_restored(run: Run, x: StepRecord, a: StepRecord, r: int) -> str | None:
    if "rng" not in _differs(x, a) or other_ranks_rng(run, x, a, r) or loader_after_restore(run, x, a, r):
        return None
    first = run.ref_at(r, 1)  # the state the run's own seeding makes, before step 1 drew anything
    if first is not None and x.pre.rng == first.pre.rng and x.step > 1:
        where = saved(run, "rng", r)
        others = [q for q in range(len(run.ref_rec)) if q != r and saved(run, "rng", q)]
        if where is None and others:
            return (f"rank {r}'s RNG state, the first step after the resume, is the one the run's seeding makes "
                    f"before step 1: rank {r} never saved its RNG state. In the uninterrupted run only rank(s) "
                    f"{others} saved one, {saved(run, 'rng', others[0])}, so rank {r} had none to restore: every rank "
                    "saves its own torch.get_rng_state() (rng-rank{R}.pt), since the states differ per rank")
        return (f"rank {r}'s RNG state, the first step after the resume, is the one the run's seeding makes "
                "before step 1 (torch.manual_seed(seed + rank)), not the one saved with the checkpoint"
                + (f", which holds it in {where}" if where else "") + ": it was not restored, or a seeding after "
                "the restore replaced it. Restore it with torch.set_rng_state(), after any torch.manual_seed")
    return (f"rank {r}'s RNG state differs from the uninterrupted run's, so dropout drew other masks"
            + _advice(run, "rng", r, ": save each rank's torch.get_rng_state() and restore it",
                      "torch.set_rng_state() with it on resume"))


COMPONENTS = [model_not_restored, optimizer_not_restored, position_behind, data_not_restored, groups_not_set,
              scheduler_not_restored, other_ranks_rng, loader_after_restore, rng_not_restored]


def diagnose_resume(run: Run, got: list[list[StepRecord]]) -> str:
    """Name what differs from the uninterrupted run at the first step of ``got`` (the resumed records,
    per rank) where anything does: the step number, or what the step started from, each with numbers."""
    for i in range(min(map(len, got), default=0)):
        xs = [g[i] for g in got]
        refs = [run.ref_at(r, x.step) for r, x in enumerate(xs)]
        if all(a is not None and not _differs(x, a) and _close(x.fp, a.fp) for x, a in zip(xs, refs)):
            continue
        if shift := step_shift(run, xs, i == 0):
            return shift
        missing = [r for r, a in enumerate(refs) if a is None]
        if missing:
            return f"rank {missing[0]} reported step {xs[0].step}, which the uninterrupted run never reached"
        parts = [next((m for r, (x, a) in enumerate(zip(xs, refs)) if (m := cause(run, x, a, r))), None)
                 for cause in COMPONENTS]
        if any(parts):
            return f"at step {xs[0].step} " + "; ".join(p for p in parts if p)
        r = next((r for r, (x, a) in enumerate(zip(xs, refs)) if not _close(x.fp, a.fp)), None)
        if r is None:  # the same weights after the step, from a start that differs in what no cause above names
            r, what = next((r, d) for r, (x, a) in enumerate(zip(xs, refs)) if (d := _differs(x, a)))
            return (f"step {xs[r].step} on rank {r} started from another {' and '.join(what)} state than the "
                    "uninterrupted run's step of that number")
        return (f"after step {xs[r].step} rank {r}'s parameters differ (sum of its shards {xs[r].fp:.9g} vs "
                f"{refs[r].fp:.9g}) although the step started from the same weights, Adam state, learning rate, "
                "samples and RNG state as the uninterrupted run's")
    return ""


@mistake("checkpoints not pruned")
def not_pruned(run: Run) -> str | None:
    steps = RUN["steps"]
    want = list(range(steps, 0, -RUN["save_every"]))[:RUN["keep"]][::-1]
    if run.committed == want and len(run.checkpoints) == len(want):
        return None
    if not run.checkpoints:  # nothing to prune: the advice would be about a step that never had a chance
        return (f"after {steps} steps saving every {RUN['save_every']} the checkpoint directory holds nothing: "
                "call save_checkpoint after every save_every-th step (it stages, commits, then prunes)")
    head = (f"after {steps} steps saving every {RUN['save_every']} with keep={RUN['keep']} the directory holds "
            f"{run.checkpoints}, expected the committed steps {want} only")
    if len(run.checkpoints) <= RUN["keep"]:  # pruned, but other steps were saved: the advice is not prune's
        return (head + f": as many as keep={RUN['keep']}, but of other steps: save after the steps whose number (the "
                f"steps done, from 1) is a multiple of save_every")
    return head + ": call prune(root, keep) on rank 0 after each commit"


@mistake("an interrupted write loaded (no staging and commit)")
def interrupted_write_loaded(run: Run) -> str | None:
    """The first restart (attempt 1) read another checkpoint than the last one committed before the killed
    write: judged from the directories its ``dcp.load`` calls read, where they were given one, else from the
    step it resumed at (so a restart that read the right one and failed later is not this mistake)."""
    att1 = run.attempt_steps(1)
    loaded = sorted({c.checkpoint for rank in run.calls("B", attempt=1, call="dcp.load") for c in rank} - {None})
    read = [re.fullmatch(r"(\.tmp-)?step_0*(\d+)", name) for name in loaded]  # final_path's and staging_path's
    if loaded and all(read):  # the directories say which step, and whether a staging one
        if all(not m[1] and int(m[2]) == RESUMED_FROM for m in read):
            return None
    elif att1 and att1[0] == RESUMED_FROM + 1:  # names of the learner's own: the step it resumed at
        return None
    err = restart_error(run)
    head = (f"rank 1 was killed while writing step {INTERRUPTED}'s checkpoint and torchrun restarted the job, which "
            f"should resume from step {RESUMED_FROM}, but")
    staging = re.search(r"\.tmp-step_(\d+)", " ".join(loaded) or str(err or ""))
    if staging:  # the resume read a staging directory
        then = f"and resumed at step {att1[0]}" if att1 else "and never trained again" + (f" ({err})" if err else "")
        return (f"{head} it read the staging directory .tmp-step_{staging.group(1)}, whose write had not finished, "
                f"{then}. Load only the checkpoint latest_complete() returns: it never returns a .tmp- directory")
    then = f"it resumed at step {att1[0]}" if att1 else f"it never trained again ({err})" if err else "no steps ran"
    seen = f"it loaded {' and '.join(loaded)}, and {then.removeprefix('it ')}" if loaded else then
    return (f"{head} {seen}. A checkpoint may look complete only once every rank's files are in it: write into "
            "staging_path(), and have rank 0 commit it only after a dist.barrier(); load only the checkpoint "
            "latest_complete() returns")


@mistake("a checkpoint complete before every rank's files are in it")
def complete_too_early(run: Run) -> str | None:
    """The second kill (``commit_kill``) found the checkpoint being saved already complete, though rank 1 had
    not yet made its own ``torch.save`` or reached the barrier: written in place, or committed without waiting."""
    kill = run.commit_kill("B")
    if kill is None or kill.at == "step" or kill.complete is None or kill.complete <= kill.after:
        return None
    att2 = run.attempt_steps(2)
    then = (f"the restarted job resumed from it (its first step was {att2[0]})" if att2 and att2[0] == kill.complete + 1
            else f"the restarted job's first step was {att2[0]}" if att2 else "the restarted job trained no step")
    return (f"rank 1 was killed inside step {kill.complete}'s save_checkpoint, after dcp.save had returned and before "
            f"its {kill.at} at {kill.line}; step {kill.complete}'s checkpoint already looked complete to "
            f"latest_complete() then (its directory and DCP's .metadata were in place), and {then}, without what "
            "rank 1 had still to write. A checkpoint may look complete only once every rank has written all of it: "
            "write into staging_path(), and have rank 0 commit it only after a dist.barrier() that every rank reaches "
            "with its own files written")


def _near(a: float, b: float) -> bool:
    """Sums over every shard: equal but for the order FSDP's reduce-scatter adds the ranks' gradients in."""
    return abs(a - b) <= 1e-6 * (1 + abs(b))


@mistake("scheduler stepped before the optimizer")
def scheduler_first(run: Run, xs: list[StepRecord], a: ReferenceStep, refs: list[ReferenceStep]) -> str | None:
    lr, want = xs[0].pre.lr, a.pre.lr
    if lr == want or a.step >= len(refs) or abs(lr - refs[a.step].pre.lr) > 1e-12 * want:
        return None
    return (f"step {a.step} trained with a learning rate of {lr:.6g}, the schedule's value for step "
            f"{a.step + 1}, where the reference's is {want:.6g}: scheduler.step() ran before optimizer.step(), "
            "so every step used the next step's rate. Call optimizer.step(), then scheduler.step()")


@mistake("a DataLoader without a generator draws from the global RNG")
def loader_rng(run: Run, xs: list[StepRecord], a: ReferenceStep, refs: list[ReferenceStep]) -> str | None:
    if not exact(WORLD):
        return None
    bad = [r for r, x in enumerate(xs) if x.pre.rng != a.pre.rng[r] and loader_drew(run, "A", r, after_step=0)]
    if not bad:
        return None
    return (f"rank {bad[0]}'s RNG state at step {a.step} is not the reference's, so dropout drew other masks: your "
            f"DataLoader, iterated at {loader_drew(run, 'A', bad[0], after_step=0)}, has no generator=, so "
            + LOADER_ADVICE)


@mistake("every rank's RNG not seeded with seed + rank")
def rng_not_per_rank(run: Run, xs: list[StepRecord], a: ReferenceStep, refs: list[ReferenceStep]) -> str | None:
    if not exact(WORLD) or loader_rng(run, xs, a, refs):  # NCCL: dropout draws from CUDA's, which the reference
        return None                                             # does not play
    bad = [r for r, x in enumerate(xs) if x.pre.rng != a.pre.rng[r]]
    if not bad:
        return None
    alike = len({x.pre.rng for x in xs}) == 1
    return (f"rank {bad[0]}'s RNG state at step {a.step} is not torch.manual_seed(seed + {bad[0]})'s"
            + (" (every rank's is the same: each was seeded alike)" if alike else "")
            + ", so dropout drew other masks than the reference's: seed each rank with "
            "torch.manual_seed(seed + rank), after build() and before load_checkpoint()")


@mistake("samples not the contract's sampler")
def samples_not_contract(run: Run, xs: list[StepRecord], a: ReferenceStep, refs: list[ReferenceStep]) -> str | None:
    bad = [r for r, x in enumerate(xs) if x.data != a.data[r]]
    if not bad:
        return None
    r, s, got = bad[0], a.step, xs[bad[0]].data
    epoch_0 = [ref for ref in refs if ref.data[r] == got]
    per_epoch = DATA_SIZE // WORLD // BATCH_SIZE
    found, (epoch, batch) = contract_batch(r, got), divmod(s - 1, per_epoch)
    if epoch_0 and epoch_0[0].step < s:
        advice = (f"the samples of step {epoch_0[0].step}, in the first epoch: call sampler.set_epoch(epoch) at "
                  "the start of every epoch")
    elif len(got) != BATCH_SIZE:  # the sampler may well be the contract's: the batch is not
        advice = (f"a batch of {len(got)} samples, not BATCH_SIZE={BATCH_SIZE}: a batch is BATCH_SIZE consecutive "
                  "indices of the sampler's order")
    elif found and s > 1 and batch == per_epoch - 1 and found == (epoch + 1, 0):  # the epoch's last batch skipped
        advice = (f"the contract sampler's batch 0 of epoch {epoch + 1}, where step {s} is batch {batch} of epoch "
                  f"{epoch}, its last: the epoch's last full batch was skipped. A rank's share of an epoch holds "
                  f"{per_epoch} batches of {BATCH_SIZE} ({DATA_SIZE // WORLD} indices): a loop that stops before "
                  "len - BATCH_SIZE leaves the last one out; it runs while offset + BATCH_SIZE <= len")
    elif found and s > 1:  # at step 1 another seed looks the same (seed + 1's epoch 0 is seed's epoch 1)
        advice = (f"the contract sampler's batch {found[1]} of epoch {found[0]}, where step {s} is batch {batch} of "
                  f"epoch {epoch}: the data position (epoch, offset) moved wrongly; the next batch is offset + 1, "
                  "and after the epoch's last batch, batch 0 of the next epoch")
    else:
        advice = ("use DistributedSampler(dataset, shuffle=True, seed=seed, drop_last=True) and batches of "
                  "BATCH_SIZE consecutive indices of it")
    return (f"rank {r} read samples {xs[r].data[:3]}... at step {s} where the contract's gives "
            f"{a.data[r][:3]}...: {advice}")


CONTRACT = [scheduler_first, samples_not_contract, loader_rng, rng_not_per_rank]


def _step_symptom(xs: list[StepRecord], a: ReferenceStep) -> str:
    p, q, s = sum(x.pre.fp for x in xs), a.pre, a.step
    if xs[0].pre.adam_step != q.adam_step:
        return (f"before step {s} Adam had stepped {xs[0].pre.adam_step:g} times where the reference had "
                f"{q.adam_step:g}: one optimizer.step() per step")
    if xs[0].pre.lr != q.lr or xs[0].lr != a.lr:
        return (f"step {s} trained with a learning rate of {xs[0].pre.lr:.6g} and set {xs[0].lr:.6g} for "
                f"the next, where build()'s CosineAnnealingLR gives {q.lr:.6g} and {a.lr:.6g}")
    if not _near(p, q.fp):
        return (f"step {s} started from other weights than the reference's (sum {p:.9g} vs {q.fp:.9g})"
                + (": train the model build(steps, seed) made" if s == 1 else ""))
    got = sum(x.fp for x in xs)
    return (f"step {s} started from the reference's weights, samples, learning rate, Adam state and RNG state, "
            f"but ended with other weights (sum {got:.9g} vs {a.fp:.9g}): each step is zero_grad, the mean "
            "cross-entropy, backward, optimizer.step(), scheduler.step()")


@mistake("on_step called before the step's checkpoint is saved")
def reported_before_save(run: Run) -> str | None:
    """A save step ``s`` whose first DCP save ran after ``on_step(s)`` had reported it (the contract: save, then
    on_step); a save of the same step again later (after the run, say) is not the step's first."""
    first: dict[int, int] = {}  # step saved -> the last step reported when its first dcp.save ran
    for call in run.calls("A")[0]:
        name = re.search(r"(\d+)$", call.checkpoint or "") if call.call in ("dcp.save", "dcp.async_save") else None
        if name:
            first.setdefault(int(name.group(1)), call.after_step)
    late = sorted(s for s, reported in first.items() if reported >= s)
    if not late:
        return None
    return (f"on_step({late[0]}) ran before step {late[0]}'s save_checkpoint (its dcp.save began after the report): "
            f"after step s, save first, then call on_step(s), so that whatever on_step does (a job stopped or killed "
            "there, as the grader's are) finds step s's checkpoint")


@mistake("steps not reported to on_step as numbered")
def steps_not_reported(run: Run, step: int) -> str | None:
    """No rank called ``on_step``, or the first step it reported is not step 1."""
    if not any(run.ref_rec):
        return ("train finished without calling on_step(step, optimizer) once: call it after every step (after "
                "that step's checkpoint, if any), with the number of steps done")
    first = min(rank[0].step for rank in run.ref_rec if rank)
    if step == 1 and first != 1:
        return (f"the first step the uninterrupted run reported to on_step was step {first}, not 1: start from "
                "step = 0 (the steps done) and count each step after it ran, so the first is step 1")
    return None


def against_reference(run: Run) -> str:
    """'' if the uninterrupted run (A) is the reference's, else what differs at the first step it does."""
    refs, final = reference_run(WORLD)
    recs = run.ref_rec
    for i, a in enumerate(refs):
        xs = [rank[i] if i < len(rank) else None for rank in recs]
        if any(x is None or x.step != a.step for x in xs):
            return steps_not_reported(run, a.step) or \
                f"the uninterrupted run's records stop or skip before step {a.step}"
        if any(x.pre is None for x in xs):
            return f"step {a.step} made no optimizer.step() before on_step: step the optimizer once per step"
        found = {cause: m for cause in CONTRACT if (m := cause(run, xs, a, refs))}
        if samples_not_contract in found and "every rank's is the same" not in found.get(rng_not_per_rank, "x"):
            # more samples, more dropout draws: unless the ranks were seeded alike, the samples explain the RNG
            if rng_not_per_rank in found:  # (the seeding advice would name a step the learner may well have taken)
                found[rng_not_per_rank] = "the RNG state differs too (other samples draw other dropout masks)"
        parts = list(found.values())
        if parts:
            return "; ".join(parts)
        p, q = xs[0].pre, a.pre
        fp_ok = not exact(WORLD) or (_near(sum(x.pre.fp for x in xs), q.fp)
                                     and _near(sum(x.fp for x in xs), a.fp))
        if p.adam_step != q.adam_step or p.lr != q.lr or xs[0].lr != a.lr or not fp_ok:
            return _step_symptom(xs, a)
    same = parity(run.ref.model, final) if exact(WORLD) else None
    if same is not None and not same.ok:
        return (f"after the last step the weights differ from the reference's (max abs difference "
                f"{same.max_abs_diff:.3g} in {same.worst})")
    return reported_before_save(run) or ""
