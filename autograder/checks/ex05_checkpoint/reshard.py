"""Exercise 5's reshard scenario: a job at another world size resumes the 2-rank run's checkpoint of step
``RESHARD_FROM`` (a copy of A's directory without its last checkpoint, ``scenarios._reshard_dir``) and trains on. Its
criteria: the first step starts from the 2-rank run's state (DCP reshards the weights and Adam's state), and every
rank's samples continue the same global stream (the data position keeps its meaning when each rank's share
changes); and the named ways to lose the stream.
"""
from __future__ import annotations

import math
import re

from ...grader.diagnosis import mistake
from ...grader.report import Verdict, criterion, failed, passed
from .causes import PARAM_GROUPS, loaded_without_set, one_sided_collective, resumed_behind, said
from .observations import WORLD, Run
from .probes import DATA_SIZE, MID_EPOCH, MID_EPOCH_FROM, RESHARD_FROM, RUN
from .reference import BATCH_SIZE, contract_batch, position_after, short_batch_said, stream


def ranks(n: int) -> str:
    return f"{n} rank" + ("s" if n != 1 else "")


def reshard_stream(world: int, frm: int = RESHARD_FROM) -> list[tuple[int, int, list[list[int]]]]:
    """The contract's stream for the steps after ``frm`` at ``world`` ranks: where the 2-rank run left it."""
    return stream(world, RUN["steps"] - frm, *position_after(frm))


@mistake("the data position counted per rank: another stream at another world size")
def per_rank_position(run: Run, first: list[list[int]], frm: int = RESHARD_FROM) -> str | None:
    """The saved position read as this rank's batches (or indices) of its share: right at the world size that
    saved it, a jump in the stream at another (``used / W`` of a share is ``used W' / W`` of the stream at ``W'``)."""
    epoch, used = position_after(frm)
    world = run.reshard_world
    kept = used // WORLD * world
    if kept == used or first != stream(world, 1, epoch, kept)[0][2]:
        return None
    return (f"the job at {ranks(world)} began at sample {kept} of epoch {epoch}'s stream, where the {WORLD}-rank run "
            f"had used {used} (rank 0 read {first[0][:3]}...): the saved position counted this rank's own share "
            f"(its batches or indices), and a rank's share of a step changes with the world size ({WORLD * BATCH_SIZE} "
            f"samples a step at {WORLD} ranks, {world * BATCH_SIZE} at {ranks(world)}). Save the samples all ranks "
            "together used, and start each rank at that number / W of its sampler's indices")


@mistake("the data position saved one step behind, read at another world size")
def reshard_behind(run: Run, first: list[list[int]], frm: int = RESHARD_FROM) -> str | None:
    """The 2-rank resumes read their checkpoint's step again, and this job began where step ``frm`` began."""
    if (step := resumed_behind(run)) is None or first != stream(run.reshard_world, 1, *position_after(frm - 1))[0][2]:
        return None
    return (f"the job at {ranks(run.reshard_world)} began where the {WORLD}-rank run's step {frm} began "
            f"(rank 0 read {first[0][:3]}...), not where it ended: the saved data position is one step behind, as "
            f"the {WORLD}-rank resume at step {step} shows. Count a step's samples before saving its checkpoint")


@mistake("the data position rounded down to a whole batch at another world size")
def batch_aligned(run: Run, first: list[list[int]], frm: int = RESHARD_FROM) -> str | None:
    epoch, used = position_after(frm)
    world = run.reshard_world
    step = world * BATCH_SIZE
    if used % step == 0 or first != stream(world, 1, epoch, used // step * step)[0][2]:
        return None
    return (f"the job at {ranks(world)} began at sample {used // step * step} of epoch {epoch}'s stream, the start of "
            f"the {ranks(world)}' batch that sample {used} falls in, where the {WORLD}-rank run had used {used}: the "
            f"position was rounded down to a whole step at {ranks(world)} ({step} samples), so samples "
            f"{used // step * step}-{used - 1} were seen twice. Start each rank at used / W of its sampler's indices, "
            "whether or not that is a whole number of batches")


@mistake("the epoch restarted at another world size")
def epoch_restarted(run: Run, first: list[list[int]], frm: int = RESHARD_FROM) -> str | None:
    epoch, used = position_after(frm)
    if used == 0 or first != stream(run.reshard_world, 1, epoch, 0)[0][2]:
        return None
    return (f"the job at {ranks(run.reshard_world)} read the first samples of epoch {epoch} again (rank 0 "
            f"{first[0][:3]}...), where the {WORLD}-rank run had used {used} of them: continue from the saved position")


@mistake("the data position recomputed from the step count")
def position_from_steps(run: Run, first: list[list[int]], frm: int = RESHARD_FROM) -> str | None:
    """The position the step count gives at the new world size (a step is another number of samples there)."""
    world = run.reshard_world
    epoch, used = position_after(frm, world)
    saved = position_after(frm)
    if (epoch, used) == saved or first != stream(world, 1, epoch, used)[0][2]:
        return None
    return (f"the job at {ranks(world)} began at sample {used} of epoch {epoch}'s stream (rank 0 read "
            f"{first[0][:3]}...), where {frm} steps at {ranks(world)} would have left it, but the "
            f"{WORLD}-rank run's {frm} steps had used {saved[1]} samples of epoch {saved[0]}: the position "
            f"was derived from the step count, and a step is {WORLD * BATCH_SIZE} samples at {WORLD} ranks, "
            f"{world * BATCH_SIZE} at {ranks(world)}. Restore the saved position (the samples all ranks together "
            "used) instead")


@mistake("a short last batch of an epoch trained on")
def short_batch(run: Run, first: list[list[int]], frm: int = RESHARD_FROM) -> str | None:
    """The job at the other world size resumed past the last whole batch of its epoch and trained on what was left."""
    return next((said for r, data in enumerate(first)
                 if (said := short_batch_said(r, data, frm + 1, run.reshard_world))), None)


RESHARD_DATA = [short_batch, per_rank_position, batch_aligned, reshard_behind, epoch_restarted,
                position_from_steps]


def _reshard_start(run: Run) -> str | None:
    """Unless the job at the other world size began where the 2-rank run was after step ``RESHARD_FROM`` (the
    weights, Adam's state and the learning rate its first step started from, summed over the ranks' shards),
    what differs."""
    first = RESHARD_FROM + 1
    got = [next((x for x in recs if x.step == first), None) for recs in run.records("R", run.reshard_world)]
    want = [run.ref_at(r, first) for r in range(WORLD)]
    if any(x is None or x.pre is None for x in got) or any(a is None or a.pre is None for a in want):
        steps = sorted({x.step for recs in run.records("R", run.reshard_world) for x in recs})
        return f"it did not train step {first} on every rank (steps recorded: {steps})"
    total = {k: (sum(getattr(x.pre, k) for x in got), sum(getattr(a.pre, k) for a in want))
             for k in ("fp", "moments")}
    names = {"fp": "the weights", "moments": "Adam's moments"}
    for k, (mine, ref) in total.items():
        if not math.isclose(mine, ref, rel_tol=1e-9, abs_tol=1e-9):  # the same values, summed in other groups
            return f"step {first} started from other {names[k]} (sum {mine:.10g} vs {ref:.10g})"
    for k, what in (("adam_step", "Adam's step count"), ("lr", "the learning rate")):
        if getattr(got[0].pre, k) != getattr(want[0].pre, k):
            why = (f": the job called dcp.load but neither set_state_dict nor set_optimizer_state_dict. {PARAM_GROUPS}"
                   if k == "lr" and loaded_without_set(run, "R", 0, run.reshard_world) else "")
            return (f"step {first} started with {what} {getattr(got[0].pre, k):.6g}, not "
                    f"{getattr(want[0].pre, k):.6g}{why}")
    return None


def _failed(run: Run, err) -> str:
    """Why the job at the other world size failed: a collective some ranks skipped, what a rank raised (at the
    learner's line), else the launch's failure as the learner's."""
    return one_sided_collective(run, "R", run.reshard_world) or run.phase_error("R") or said(run, err)


@criterion("resumes at world size {reshard_world} from a {world}-rank checkpoint", points=2)
def reshards(run: Run) -> Verdict:
    got, err, world = run.final("R"), run.reshard_error, run.reshard_world
    steps = sorted({x.step for recs in run.records("R", world) for x in recs})
    if err is not None and steps:  # it loaded and trained: the failure came after the load
        start = _reshard_start(run) or (f"step {RESHARD_FROM + 1} started from the {WORLD}-rank run's weights, Adam "
                                        "state and learning rate")
        return failed(f"the job at {ranks(world)} resumed from the {WORLD}-rank run's checkpoint of step "
                      f"{RESHARD_FROM}: {start}; it trained steps {steps[0]}-{steps[-1]}, then failed: "
                      f"{_failed(run, err)}")
    why, start = None, None
    if err is not None:
        why = f"the job failed: {_failed(run, err)}"
    elif got is None:
        why = "the job did not finish"
    elif start := _reshard_start(run):  # the first step's state, before how the job ended
        why = start
    elif (got.step, got.lr) != (run.ref.step, run.ref.lr):
        why = (f"step {RESHARD_FROM + 1} started from the {WORLD}-rank run's weights, Adam state and learning rate, "
               f"but the job ended at step {got.step} with lr {got.lr:.6g}, expected step {run.ref.step} and lr "
               f"{run.ref.lr:.6g}: the schedule went on from another state than the one saved")
    if why:
        # the advice where the load is in question: the weights or Adam's state, or an error of DCP's
        about_dcp = (start is not None and "started from other" in start) or \
            re.search(r"dcp\.|state_dict|Checkpoint|Size mismatch|Missing key", why)
        return failed(f"loading the {WORLD}-rank run's checkpoint of step {RESHARD_FROM} with "
                      f"{ranks(run.reshard_world)}: {why}" + (". DCP reshards when you dcp.load into "
                                                              "get_state_dict's (DTensor) state of the new model"
                                                              if about_dcp else ""))
    if shared := shared_rng(run):
        return failed(shared)
    return passed(f"step {RESHARD_FROM + 1} started from the {WORLD}-rank run's weights, Adam state and learning "
                  f"rate, and the job finished at step {got.step}")


@mistake("a rank new to the reshard restores another rank's RNG state")
def shared_rng(run: Run) -> str | None:
    """A rank the checkpoint has no ``rng-rank{R}.pt`` for that loads another's (rank 0's): two ranks, one state."""
    world, step = run.reshard_world, RESHARD_FROM + 1
    first = [next((x for x in recs if x.step == step and x.pre), None) for recs in run.records("R", world)]
    for r in range(WORLD, world):
        q = next((q for q in range(world) if q != r and first[r] and first[q] and first[q].pre.rng == first[r].pre.rng),
                 None)
        if q is not None:
            return (f"at step {step} of the job at {ranks(world)}, rank {r}'s RNG state was rank {q}'s, so the two "
                    f"drew the same dropout masks: the {WORLD}-rank checkpoint has no rng-rank{r}.pt, and a rank "
                    "without its file keeps its own seed's (seed + rank), not another rank's")
    return None


def _own_stream_differs(run: Run) -> str | None:
    """Where the 2-rank run itself left the contract's stream before its checkpoint of step ``RESHARD_FROM``, what
    it read there: the job at the other world size continues that run's position, which is not the contract's, so
    its samples say nothing of the position's meaning (the uninterrupted run's criterion names the mistake)."""
    for k, (epoch, used, batch) in enumerate(stream(WORLD, RESHARD_FROM, 0, 0)):
        for r, recs in enumerate(run.records("A", WORLD)):
            rec = next((x for x in recs if x.step == k + 1), None)
            if rec is not None and rec.data != batch[r]:
                return (f"not judged: the {WORLD}-rank run itself read samples {rec.data[:3]}... on rank {r} at step "
                        f"{k + 1}, where the contract's stream has {batch[r][:3]}... (sample {used} of epoch "
                        f"{epoch}; the uninterrupted run's criterion says why), and the job at "
                        f"{ranks(run.reshard_world)} continues that run's position, not the contract's")
    return None


def _stream_fault(run: Run, phase: str, frm: int) -> str | None:
    """Where the job at the other world size that resumed from the 2-rank run's step ``frm`` (phase ``phase``) left
    the contract's stream, named where a cause explains it; ``None`` where it did not."""
    world, got = run.reshard_world, run.records(phase, run.reshard_world)
    first = [[x.data for x in recs if x.step == frm + 1] for recs in got]
    for k, (epoch, used, batch) in enumerate(reshard_stream(world, frm)):
        step = frm + 1 + k
        for r in range(world):
            rec = next((x for x in got[r] if x.step == step), None)
            if rec is None:
                return f"not judged past step {step - 1}: rank {r} recorded no step {step}"
            if rec.data != batch[r]:
                named = short_batch_said(r, rec.data, step, world) or all(len(f) == 1 for f in first) and next(
                    (why for cause in RESHARD_DATA if (why := cause(run, [f[0] for f in first], frm))), None)
                found = contract_batch(r, rec.data, world)
                theirs = (f", the contract's batch {found[1]} of epoch {found[0]} at {ranks(world)} (sample "
                          f"{found[1] * world * BATCH_SIZE} of that epoch's stream)") if found else ""
                return named or (f"resumed from the {WORLD}-rank run's step {frm}, rank {r} read samples "
                                 f"{rec.data[:3]}...{theirs} at step {step}, where the stream continues with "
                                 f"{batch[r][:3]}... (sample {used} of epoch {epoch}, every rank together; rank r of "
                                 f"{world} takes its sampler's indices from {used} / {world} on)")
    return None


@mistake("a DistributedSampler without drop_last=True")
def sampler_keeps_tail(run: Run) -> str | None:
    """The contract's sampler drops the tail; here W divides the data set, so the shards are the same either way."""
    built = next((c for rank in run.calls("A") for c in rank if c.call == "DistributedSampler"), None)
    if built is None:
        return None
    return (f"train built its DistributedSampler without drop_last=True ({built.file}:{built.line}), where the "
            f"contract's has it: {DATA_SIZE} samples divide among {WORLD} and {run.reshard_world} ranks, so the "
            "shards are the same here, but where W does not divide the data set the sampler pads every rank's share "
            "with repeated samples: an epoch then sees some samples twice, and its length, with the data position's "
            "meaning, changes with the world size")


@criterion("the data position means the same samples at world size {reshard_world}", points=2)
def stream_continues(run: Run) -> Verdict:
    """From the 2-rank run's step ``RESHARD_FROM`` (where the other world size has no whole batch left of the epoch,
    or few) and, where the fresh scenario ran, from its step ``MID_EPOCH_FROM`` (mid-epoch: no whole number of
    batches at the other world size), through the end of the run."""
    world = run.reshard_world
    if run.reshard_error is not None and not any(run.records("R", world)):
        return failed("not judged: the job at the other world size failed before its first step")
    if own := sampler_keeps_tail(run) or _own_stream_differs(run):
        return failed(own)
    resumes = [("R", RESHARD_FROM)] + ([(MID_EPOCH, MID_EPOCH_FROM)] if (run.out / MID_EPOCH).is_dir() else [])
    for phase, frm in resumes:
        if why := _stream_fault(run, phase, frm):
            return failed(why)
    starts = {frm: reshard_stream(world, frm)[0][:2] for _, frm in resumes}  # (epoch, samples used) at each
    said = " and ".join(f"from step {frm} (sample {used} of epoch {epoch}'s stream)"
                        for frm, (epoch, used) in starts.items())
    return passed(f"at {ranks(world)} the job continued where the {WORLD}-rank run stopped, {said}: no sample "
                  f"skipped or seen twice through step {RUN['steps']}")
