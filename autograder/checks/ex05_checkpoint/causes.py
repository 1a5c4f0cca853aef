"""Exercise 5's likely mistakes in a resume, tested against what the ranks recorded (see
autograder/grader/diagnosis.py), and the helpers the other cause modules share.

Each takes the :class:`~.observations.Run` of one file (its records: :mod:`.observations`). :func:`diagnose_resume`
compares a resumed run with the uninterrupted one step by step and, at the first step where anything
differs, names a shifted step counter or what that step started from (``COMPONENTS``: the weights,
Adam's state, the data position, the learning rate, the RNG state). The uninterrupted run against the
single-process reference is :mod:`.contract_causes`'s; the commit protocol's mistakes, :mod:`.commit_causes`'s.
"""
from __future__ import annotations

import re

from distlab import LaunchError, pick_backend
from distlab.runtime.failures import RankKilled

from ...grader.diagnosis import KnownError, mistake
from .observations import WORLD, Run, StepRecord
from .probes import RUN
from .reference import contract_batch


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


def died(err: LaunchError | None, rank: int) -> bool:
    """Whether the launch ended because ``rank`` died (a signal, an exit with no Python exception: ``RankKilled``,
    ``RankExited``): then its missing calls are calls it never reached, not calls it skipped. Not a rank that
    raised: one that skipped a collective goes on, and raises later (a folder the others never made)."""
    return isinstance(err, RankKilled) and err.rank == rank


@mistake("a checkpoint collective called on some ranks only")
def one_sided_collective(run: Run, name: str, world: int = WORLD, err: LaunchError | None = None,
                         **match) -> str | None:
    """The first DCP or state-dict call one rank made more often than another in a phase; not where the rank
    with fewer is the one whose death or error ended the launch (``err``): it did not skip the call, it never got
    there, and ``err`` says why."""
    calls = run.calls(name, world, **match)
    logged = ("torch.save", "DataLoader iterated", "DistributedSampler")  # logged, not collectives
    for call in dict.fromkeys(c.call for rank in calls for c in rank if c.call not in logged):
        made = [[c for c in rank if c.call == call] for rank in calls]
        more = max(range(world), key=lambda r: len(made[r]))
        fewer = min(range(world), key=lambda r: len(made[r]))
        if len(made[more]) != len(made[fewer]):
            if died(err, fewer):
                return None
            done = made[more][len(made[fewer])].after_step
            when = f"at step {done + 1}" if done else "before the first step"
            return (f"{call} ran on rank {more} ({when}) but not on rank {fewer}: it is a "
                    "collective, so every rank calls it (each writes or reads its own shards); do not put it under "
                    "`if rank == 0:`")
    return None


def rooted(run: Run, text: str) -> str:
    """``text`` with the phases' directories (the grader's scratch folders) said as train's ``root``."""
    return re.sub(re.escape(str(run.out)) + r"/[A-Z]\d?(?=/|\b)", "root", text)  # A, B, C, R and R2


def said(run: Run, err: LaunchError | str) -> str:
    """A launch's failure in the learner's terms (``grader.main.explain``: the line of the learner's file, gloo's
    sizes where it aborted a rank), its paths from train's root."""
    from ...grader.main import explain
    return rooted(run, explain(err, run.path, KNOWN_ERRORS) if isinstance(err, LaunchError) and run.path else str(err))


def restart_error(run: Run) -> str | LaunchError | None:
    """What stopped the restart scenario: what a restarted attempt tripped on, not the kill before it."""
    err = run.resume_error
    if err is not None:
        err = (one_sided_collective(run, "B", err=err, attempt=1) or run.phase_error("B", first_attempt=1) or
               said(run, err))
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


@mistake("the resumed epoch's shuffle not set (set_epoch skipped on resume)")
def epoch_not_set(run: Run, x: StepRecord, a: StepRecord, r: int) -> str | None:
    """The resumed step read the right offset of another epoch's shuffle: the position came back, the epoch's
    order did not (``set_epoch`` called only where an epoch starts)."""
    want, got = contract_batch(r, a.data), contract_batch(r, x.data)
    if x.data == a.data or want is None or got is None or got[1] != want[1] or got[0] == want[0]:
        return None
    return (f"rank {r} read samples {x.data[:3]}..., batch {got[1]} of epoch {got[0]}'s shuffle, where step {x.step} "
            f"is batch {want[1]} of epoch {want[0]}: the position within the epoch was restored, but the sampler "
            f"still dealt epoch {got[0]}'s order. Call sampler.set_epoch(epoch) for the epoch the job resumes in, "
            "before reading from it, not only when an epoch starts")


@mistake("data position not restored")
def data_not_restored(run: Run, x: StepRecord, a: StepRecord, r: int) -> str | None:
    if x.data == a.data or read_again(run, x, r) or epoch_not_set(run, x, a, r):  # their causes
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


COMPONENTS = [model_not_restored, optimizer_not_restored, position_behind, epoch_not_set, data_not_restored,
              groups_not_set, scheduler_not_restored, other_ranks_rng, loader_after_restore, rng_not_restored]


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


