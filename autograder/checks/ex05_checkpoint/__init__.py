"""Exercise 5 check: stop or kill a job, resume, and demand the very same weights.

Scenarios, in three torchrun launches (``scenarios``; the rank side is in ``probes``):

1. ``reference``: an uninterrupted run in directory A (its records and final
   state are the yardstick), then, in the same processes, a run in directory C
   that every rank stops after step ``FRESH_STOP`` (the job ends there).
2. ``fresh`` + ``restart``: a new job (``--max-restarts=2``) first finishes C
   from its checkpoint (the fresh-job resume), then trains in directory B. In
   attempt 0 rank 1 is killed *inside* its second checkpoint write of B (its
   shard is on disk, DCP's ``.metadata`` is not), so attempt 1 must resume from
   the previous complete checkpoint; attempt 1 is killed inside the save after
   step ``SECOND_KILL``, once DCP's save has returned and before rank 1's own files
   (``commit_kill``), so attempt 2 must resume from the checkpoint before it; attempt 2 finishes.
   (C, finished in attempt 0, is not replayed.)
3. ``reshard``: a job at another world size resumes from A's checkpoint of step 9 (a copy of A's
   directory without its last checkpoint) and trains steps 10-12: it must start from the 2-rank run's
   state and continue the same global sample stream (the data position counts the samples all ranks
   together used, so it keeps its meaning when each rank's share changes). Where the fresh scenario ran, the
   same launch resumes C's checkpoint of step 3 too (mid-epoch, no whole number of batches at the other world
   size) and trains to step 12.

Launches 2 and 3 need only the first's directories and touch none of each other's, so they run side by side.

The reference, the fresh job alone and the reshard launches take several files
at once (tests); a file with the restart scenario has a resume launch of its own.
Where a fresh job in that launch failed, the restart scenario began in a later
attempt than its kills are scheduled from: it is launched again alone, so that
the fresh job's crash costs the fresh job's criterion only (issue 37).
On the CPU, reduction order is fixed, so resumed runs must match the
uninterrupted one bit for bit (``torch.equal``); on a GPU within assert_close's tolerance.
Where they do not, what each step started from (weights, Adam state, learning
rate, samples, RNG state, step number) is compared with the uninterrupted run,
and only what differs is named. The uninterrupted run itself is compared, step by step
and in the same way, with a single-process reference of the contract (``reference``:
one process plays both ranks), so a mistake both runs share (the scheduler stepped before
the optimizer) fails too; a resumed run equal to the uninterrupted one then equals the reference.
The uninterrupted runs' launch is traced (``rank.trace``): a failure that none of the causes below
explains gets the first divergence from the reference solution's trace (``autograder.grader.divergence``).

| mistake | message |
|---|---|
| a rank new to the reshard restores another rank's RNG state | "... rank 2's RNG state was rank 0's, so the two ..." |
| a DistributedSampler without drop_last=True | "train built its DistributedSampler without drop_last=True (...) ..." |
| step counter off after resuming | "the first step after resuming was numbered 5, but it trained ... step 4 ..." |
| model not restored | "rank 0 resumed with other weights than ... before step 4 (sum ... vs ...): ..." |
| optimizer state not restored | "Adam's step count was 0 where the uninterrupted run's was 3: ..." |
| data position saved before the step's samples were counted | "rank 0 read samples [..]... at step 4, ..." |
| the resumed epoch's shuffle not set (set_epoch skipped on resume) | "... batch 1 of epoch 0's shuffle ..." |
| data position not restored | "rank 0 read samples [..]... instead of [..]... (the samples of step 1): ..." |
| optimizer's param_groups not set back after dcp.load | "... the resumed job called dcp.load but neither ..." |
| scheduler not restored | "the learning rate it set for step 5 was 0.0025 instead of 0.00225 (...): ..." |
| another rank's RNG state restored | "rank 1's RNG state is rank 0's, so dropout drew rank 0's masks: ..." |
| a DataLoader without a generator draws from the global RNG after a restore | "... iterated its DataLoader ..." |
| RNG state not restored | "rank 0's RNG state differs ...: save each rank's torch.get_rng_state() ..." |
| scheduler stepped before the optimizer | "step 1 trained with a learning rate of 0.00295, the schedule's ..." |
| a DataLoader without a generator draws from the global RNG | "... your DataLoader, iterated at ..." |
| every rank's RNG not seeded with seed + rank | "rank 1's RNG state at step 1 is not torch.manual_seed(seed + 1)'s" |
| samples not the contract's sampler | "rank 0 read samples [..]... at step 1 where the contract's gives [..]...: ..." |
| on_step called before the step's checkpoint is saved | "on_step(3) ran before step 3's save_checkpoint ..." |
| steps not reported to on_step as numbered | "the first step the uninterrupted run reported ... was step 2 ..." |
| checkpoints not pruned | "after 12 steps saving every 3 with keep=2 the directory holds [...]: ..." |
| an interrupted write loaded (no staging and commit) | "rank 1 was killed while writing step 6's checkpoint ..." |
| a checkpoint complete before every rank's files are in it | "... inside step 9's save_checkpoint, ..." |
| a rank's file written into the checkpoint after its commit | "rank 0's torch.save (...) wrote into step_..." |
| no barrier after the commit: a rank goes on while rank 0 commits | "rank 1 returned from step 3's ..." |
| commit on every rank | "commit ran on more than one rank: rank 1's found no .tmp-step_00000003 to rename, ..." |
| a checkpoint committed before every rank's files are in it | "rank 1 wrote into ... after rank 0 had committed it" |
| a checkpoint collective called on some ranks only | "dcp.save ran on rank 0 (at step 3) but not on rank 1: ..." |
| a checkpoint written on some ranks only | (RuntimeError "Parent directory ... does not exist") "... dcp.save ..." |
| dcp.load of a key the checkpoint lacks | (RuntimeError "Missing key in checkpoint state_dict") "dcp.load fills ..." |
| a short last batch of an epoch trained on | "at 4 ranks rank 0 trained step 10 on the last 8 indices of ..." |
| the data position counted per rank: another stream at another world size | "the job at 4 ranks began at ..." |
| the data position saved one step behind, read at another world size | "the job at 4 ranks began where the ..." |
| the data position rounded down to a whole batch at another world size | "... the start of the 4 ranks' batch ..." |
| the epoch restarted at another world size | "the job at 4 ranks read the first samples of epoch 1 again ..." |
| the data position recomputed from the step count | "... where 9 steps at 4 ranks would have left it, but ..." |
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Sequence

from distlab import LaunchError, RankFailure

from ...grader.launches import launch_timeout
from ...grader.parity import parity
from ...grader.registry import Exercise
from ...grader.report import ExerciseReport, Verdict, criterion, failed, passed
from .causes import KNOWN_ERRORS, diagnose_resume, exact, one_sided_collective, restart_error, rooted, said
from .commit_causes import (committed_twice, committed_under_a_rank, complete_too_early, interrupted_write_loaded,
                            not_pruned, ran_ahead, written_after_commit)
from .contract_causes import against_reference
from .observations import WORLD, FinalState, Run
from .probes import FRESH_STOP, INTERRUPTED, RESUMED_FROM, SCENARIOS, SECOND_KILL
from .reshard import reshards, stream_continues
from .scenarios import run_scenarios

__all__ = ["EXERCISE", "KNOWN_ERRORS", "SCENARIOS", "criteria", "grade"]

# Grading the solution (all three launches, reshard to 4 ranks) took 42 s on 2 cores at load 4;
# the resume launch (three process starts) is the longest. The launches share what time_limit
# leaves after the grader's start-up in these proportions (30, 40 and 30 s: 2-3x each launch), so
# a hang is reported as a LaunchTimeout naming the ranks, not cut off by the CLI.
EXERCISE = Exercise(number=5, name="checkpoint", filename="ex05_checkpoint.py", max_score=10, time_limit=120)
SHARES = {"reference": 3, "resume": 4, "reshard": 3}
RESHARD_WORLD = 4


def _timeout(launch: str, files: int = 1) -> float:
    return launch_timeout(EXERCISE, files=files, share=SHARES[launch] / sum(SHARES.values()))


def _same_state(ref: FinalState, got: FinalState | None, world: int = WORLD) -> tuple[bool, str]:
    if got is None:
        return False, "the run did not finish"
    bitwise = exact(world)
    pairs = [(f"model '{k}'", v, got.model.get(k)) for k, v in ref.model.items()]
    pairs += [(f"optimizer '{k}'.{j}", v, got.optim.get(k, {}).get(j)) for k, s in ref.optim.items()
              for j, v in s.items()]
    for name, a, b in pairs:
        if b is None or a.shape != b.shape:
            return False, f"{name} is missing or has another shape"
        par = parity(b, a, rtol=0 if bitwise else None, atol=0 if bitwise else None)
        if not par.ok:
            return False, f"{name} differs (max abs difference {par.max_abs_diff:.3g})"
    return True, ""


@criterion("keeps only the last K checkpoints", points=1)
def keeps_last_k(run: Run) -> Verdict:
    return failed(why) if (why := not_pruned(run)) else passed(f"kept steps {run.committed}")


@criterion("[W={world}] the uninterrupted run matches a single-process reference", points=2)
def matches_reference(run: Run) -> Verdict:
    if why := against_reference(run):
        return failed(why)
    return passed("every step's samples, learning rate, Adam step" + (", RNG state and weights" if exact(WORLD) else
                  " (weights and RNG within the run's own comparisons: CUDA's dropout)") + " as the reference's")


@criterion("a fresh job resumes exactly", points=2)
def fresh_job_resumes(run: Run) -> Verdict:
    got = run.final("C")
    ok, why = _same_state(run.ref, got)
    if ok and run.reached == FRESH_STOP:
        return passed("bit-identical to the uninterrupted run" if exact(WORLD) else "within tolerance")
    if run.reached != FRESH_STOP:
        why = f"the run to be stopped after step {FRESH_STOP} stopped at step {run.reached}"
    elif got is None:
        cause = one_sided_collective(run, "C", tag="resume") or run.phase_error("C") or run.fresh_error
        why = f"the fresh job failed: {cause}"
    else:
        why = diagnose_resume(run, run.records("C", tag="resume")) or why
    return failed(f"stopped the job after step {FRESH_STOP} and started a new one on the same directory: {why}")


@criterion("an interrupted write is never loaded", points=2)
def interrupted_write_never_loaded(run: Run) -> Verdict:
    if why := interrupted_write_loaded(run) or complete_too_early(run) or written_after_commit(run) or ran_ahead(run):
        return failed(why)
    kill, again = run.commit_kill("B"), ""
    if kill is not None and kill.at != "step":
        again = (f"; killed again inside step {kill.after + 1}'s save, after dcp.save and before rank 1's {kill.at}: "
                 f"the newest complete checkpoint was step {kill.complete}'s")
    return passed(f"killed inside step {INTERRUPTED}'s write; resumed from step {RESUMED_FROM}{again}")


@criterion("torchrun --max-restarts resumes exactly", points=2)
def restart_resumes(run: Run) -> Verdict:
    # Attempt 1 must match the uninterrupted run step by step until it is killed again.
    att1 = run.attempt_steps(1)
    diag = diagnose_resume(run, run.records("B", attempt=1))
    if att1 and att1[-1] >= SECOND_KILL and not diag:
        return passed(f"steps {att1[0]}-{att1[-1]} identical to the uninterrupted run")
    return failed(diag or f"not checked: the first restart did not run to step {SECOND_KILL} "
                          f"({restart_error(run) or 'no records'})")


@criterion("two crashes, still exact", points=1, requires=[restart_resumes])
def two_crashes(run: Run) -> Verdict:
    ok, why = _same_state(run.ref, run.final("B"))
    err = restart_error(run)
    if ok and err is None:
        return passed("final weights and Adam state identical after resuming twice")
    kill, att2 = run.commit_kill("B"), run.attempt_steps(2)
    if complete_too_early(run) and att2 and att2[0] == kill.complete + 1:  # what it resumed from lacked a rank's files
        return failed(f"not judged: the job restarted after the second kill resumed from step {kill.complete}'s "
                      f"checkpoint, to which rank 1 had not yet written its {kill.at} ({kill.line}): what it restored "
                      f"was not all saved (see '{interrupted_write_never_loaded.rule.name}')")
    return failed(diagnose_resume(run, run.records("B", attempt=2)) or why or str(err))


SCENARIO_CRITERIA = {"fresh": [fresh_job_resumes],
                     "restart": [interrupted_write_never_loaded, restart_resumes, two_crashes],
                     "reshard": [reshards, stream_continues]}


def criteria(scenarios: Sequence[str] = SCENARIOS) -> list:
    """The criteria judged when these scenarios run (keeping the last K and the reference: in every grading)."""
    return [keeps_last_k, matches_reference] + [fn for s in SCENARIOS if s in scenarios for fn in SCENARIO_CRITERIA[s]]


def _failure(run: Run, err: LaunchError | None) -> str:
    """Why the uninterrupted run failed: a one-sided collective, else the error as grader.main explains it."""
    cause = committed_under_a_rank(run, err) or committed_twice(run, err) or one_sided_collective(run, "A", err=err) \
        or one_sided_collective(run, "C", err=err, tag="first")
    if err is None:
        return cause or "the uninterrupted run returned no final state"
    if cause:
        raw = f"rank {err.rank} raised {err.exc_type}: {err.exc_message.strip()[:300]}" if isinstance(
            err, RankFailure) else str(err)
        return f"{cause}\n  ({rooted(run, raw)})"
    return said(run, err)


def grade(paths: Sequence[Path], scenarios: tuple[str, ...] = SCENARIOS, reshard_world: int = RESHARD_WORLD,
          scenarios_of: Sequence[tuple[str, ...]] | None = None) -> list[ExerciseReport]:
    """Grade the files at ``paths``; tests pass fewer ``scenarios`` (``scenarios_of``: per file) or a
    cheaper ``reshard_world``. A subset of scenarios still scores out of ``max_score`` (scale_to).

    The files share the reference, fresh-job and reshard launches; each file with the restart
    scenario has a resume launch of its own, since torchrun restarts the whole job after a kill.
    """
    wanted = [tuple(s) for s in scenarios_of] if scenarios_of else [tuple(scenarios)] * len(paths)
    reports = [EXERCISE.new_report() for _ in paths]
    with tempfile.TemporaryDirectory(prefix="ex05-") as tmp:
        runs = [Run(Path(tmp) / f"file{i}", reshard_world) for i in range(len(paths))]
        launched = run_scenarios([str(p) for p in paths], [str(r.out) for r in runs], wanted, reshard_world, _timeout)
        for path, report, run, sc, got in zip(paths, reports, runs, wanted, launched):
            run.path = Path(path)
            report.measurements.update({k: v for k, v in got.items() if k.endswith("_s")})
            run.resume_error, run.reshard_error = got.get("resume"), got.get("reshard")
            run.fresh_error = got.get("fresh", run.resume_error)  # the guests' fresh jobs: in a "resume" launch
            if run.load_reference():
                report.judge(criteria(sc), run, world=WORLD, reshard_world=reshard_world)
            else:
                report.did_not_run(_failure(run, got.get("reference")))
    return [r.scale_to() for r in reports]
