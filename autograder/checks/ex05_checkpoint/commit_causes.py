"""Exercise 5's mistakes of the commit protocol (stage, barrier, rank 0 commits and prunes, barrier): what the
kills and the held commit (``commit_kill``, ``commit_order``) and the checkpoint directories show."""
from __future__ import annotations

import json
import re
from pathlib import Path

from distlab import LaunchError, RankFailure
from distlab.checkpoint import final_path

from ...grader.diagnosis import mistake
from .causes import restart_error
from .observations import Run
from .probes import INTERRUPTED, RESUMED_FROM, RUN


def _staging(err: LaunchError | None, pattern: str) -> tuple[Path, int] | None:
    r"""The checkpoint root and step of the staging directory a rank's error names (``pattern``: the error's words
    around ``(\S*)\.tmp-step_(\d+)``), where a rank raised one."""
    found = re.search(pattern, str(getattr(err, "exc_message", "")))
    return (Path(found.group(1)), int(found.group(2))) if isinstance(err, RankFailure) and found else None


@mistake("a checkpoint committed before every rank's files are in it")
def committed_under_a_rank(run: Run, err: LaunchError | None) -> str | None:
    """A rank's write into a staging directory that failed because rank 0 had already renamed it."""
    if not (staged := _staging(err, r"Parent directory (\S*)\.tmp-step_(\d+) does not exist")):
        return None
    root, step = staged
    if not (final_path(root, step) / ".metadata").is_file():
        return None
    return (f"rank {err.rank} wrote into step {step}'s staging directory ({root.name}/.tmp-step_{step:08d}) after "
            f"rank 0 had committed it (renamed it to step_{step:08d}), so its own file never got there: rank 0 "
            "committed before every rank had written its files. Call dist.barrier() on every rank once its own "
            "files are written, and have rank 0 commit only after it")


@mistake("a rank's file written into the checkpoint after its commit")
def written_after_commit(run: Run) -> str | None:
    """A ``torch.save`` of the uninterrupted run into a committed checkpoint's directory whose DCP save went to the
    staging one: the file came after the rename, and a crash in between leaves a complete-looking checkpoint
    without it (the kills fall before the commit: this is read from where the saves went)."""
    for r, calls in enumerate(run.calls("A")):
        staged = {c.checkpoint for c in calls if c.call in ("dcp.save", "dcp.async_save") and c.checkpoint}
        late = next((c for c in calls if c.call == "torch.save" and c.checkpoint and f".tmp-{c.checkpoint}" in staged),
                    None)
        if late is not None:
            where = f" ({late.file}:{late.line})" if late.file else ""
            return (f"rank {r}'s torch.save{where} wrote into {late.checkpoint}, the committed checkpoint, after its "
                    f"commit (its dcp.save went to .tmp-{late.checkpoint}): a crash between the commit and that save "
                    "leaves a checkpoint that looks complete without the file, and a resume from it is not exact. "
                    "Write every rank's files into the staging directory before the barrier and rank 0's commit")
    return None


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
    if not (staged := _staging(err, r"No such file or directory: '(\S*)\.tmp-step_(\d+)' -> ")):
        return None
    root, step = staged
    if not final_path(root, step).is_dir():
        return None
    return (f"commit ran on more than one rank: rank {err.rank}'s found no .tmp-step_{step:08d} to rename, another "
            f"rank's had already renamed it to step_{step:08d}. Commit (and prune) on rank 0 only, between the two "
            "barriers: `if dist.get_rank() == 0:`")


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
