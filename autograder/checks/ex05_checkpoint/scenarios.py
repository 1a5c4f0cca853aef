"""The launches of exercise 5's scenarios, in the grading process: each launch's files and phases, and what
is kept of a launch that a kill ended (the rank side, :func:`.probes.rank_main`, runs the phases).
"""
from __future__ import annotations

import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Sequence

import torch

from distlab import LaunchError, torchrun
from distlab.checkpoint import final_path
from distlab.runtime.launch import target_string

from ...grader import progress
from ...grader.launches import TRACES, traced, tracing
from .observations import WORLD
from .probes import FRESH_STOP, MID_EPOCH, RESHARD_FROM, RUN, SECOND_KILL, WRITE_KILL, rank_main


def _launch(paths: Sequence[str], outdirs: Sequence[str], phases: list[list[dict]], world: int, timeout: float,
            max_restarts: int = 0, label: str = "") -> tuple[LaunchError | None, float]:
    """One launch of each file's phases; a killed job is expected, so its error is returned, not raised."""
    t, error = time.perf_counter(), None
    files = f" for {len(paths)} files" if len(paths) > 1 else ""
    # The uninterrupted runs are traced (rank.trace), for the first divergence from the reference's.
    target, args = (traced, (target_string(rank_main),)) if label == "reference" and tracing() \
        else (rank_main, ())
    with progress.step(f"[W={world}] {label} launch, torchrun{files}"):
        try:
            torchrun(target, world, args=(*args, list(paths), list(outdirs), phases), timeout=timeout,
                     max_restarts=max_restarts)
        except LaunchError as exc:
            error = exc
    if target is traced:  # each file that finished left its ranks' traces (a later file may have killed the job)
        for path, outdir in zip(paths, outdirs):
            files = [Path(outdir) / f"trace-rank{r}.pt" for r in range(world)]
            if all(f.exists() for f in files):
                TRACES.setdefault(str(path), []).append([torch.load(f, weights_only=True) for f in files])
                for f in files:
                    f.unlink()
    return error, round(time.perf_counter() - t, 2)


def _batch(files: Sequence[int], paths, outdirs, phases: Callable[[int], list[dict]], world: int, launch: str,
           timeout: Callable[[str, int], float], out: list[dict]) -> None:
    """Launch ``files`` together (none kills a rank); when the launch dies in one file's phases, launch the
    files after it again. The error goes in that file's ``out[i][launch]``."""
    todo = list(files)
    while todo:
        err, wall_s = _launch([paths[i] for i in todo], [outdirs[i] for i in todo], [phases(i) for i in todo],
                              world, timeout(launch, len(todo)), label=launch)
        ended = [all((Path(outdirs[i]) / (f"{p['name']}-stopped" if "stop_step" in p else f"{p['name']}-final.pt"))
                     .exists() for p in phases(i)) for i in todo]
        for i in todo:
            out[i][f"{launch}_launch_s"] = wall_s
        if err is None or all(ended):
            return
        stuck = ended.index(False)
        out[todo[stuck]][launch], todo = err, todo[stuck + 1:]


def run_scenarios(paths: Sequence[str], outdirs: Sequence[str], wanted: Sequence[tuple[str, ...]],
                  reshard_world: int, timeout: Callable[[str, int], float]) -> list[dict]:
    """The launches: the reference (and the job stopped for the fresh scenario), then, side by side, the
    resumes (the fresh jobs, then the restarts: one launch per file, the fresh jobs of the others ride in
    the first) and the reshard (from a copy of A's directory without its last checkpoint). Returns, per file,
    the error of each launch that died in its phases and the seconds.

    The resumes read C and write B, the reshard reads and writes R only, so neither waits for the other: on
    this machine most of a launch is its ranks waiting on each other and on process starts, which two launches
    overlap (as exercise 1's two world sizes). A kill is scheduled by step, never by time.
    """
    n, out = len(paths), [{} for _ in paths]

    def phase(i: int, d: str, **kw) -> dict:
        return dict(name=d, dir=str(Path(outdirs[i]) / d), steps=RUN["steps"], **kw)

    _batch(range(n), paths, outdirs, lambda i: [phase(i, "A", tag="ref")] + (
        [phase(i, "C", tag="first", stop_step=FRESH_STOP)] if "fresh" in wanted[i] else []),
        WORLD, "reference", timeout, out)
    live = [i for i in range(n) if (Path(outdirs[i]) / "A-final.pt").exists()]
    reshard = [i for i in live if "reshard" in wanted[i]]
    for i in reshard:  # before either launch starts: the copies of A and of C are the reshard's alone
        _reshard_dir(Path(outdirs[i]))
        _mid_epoch_dir(Path(outdirs[i]))

    def reshards(i: int) -> list[dict]:
        return [phase(i, "R", tag="reshard")] + (
            [phase(i, MID_EPOCH, tag="reshard")] if (Path(outdirs[i]) / MID_EPOCH).is_dir() else [])

    with ThreadPoolExecutor(2) as pool:
        jobs = [pool.submit(_resumes, live, paths, outdirs, wanted, phase, timeout, out),
                pool.submit(_batch, reshard, paths, outdirs, reshards, reshard_world, "reshard", timeout, out)]
        for job in jobs:
            job.result()  # a launch that could not start raises here, as a sequential one would
    return out


def _resumes(live: list[int], paths, outdirs, wanted, phase: Callable, timeout: Callable[[str, int], float],
             out: list[dict]) -> None:
    """The fresh jobs' resumes and the restart scenario's launches (``--max-restarts=2``), in ``out``."""
    fresh = [i for i in live if "fresh" in wanted[i] and (Path(outdirs[i]) / "C-stopped").exists()]
    restart = [i for i in live if "restart" in wanted[i]]
    guests = [i for i in fresh if i not in restart]

    def resume(i: int) -> list[dict]:
        return [phase(i, "C", tag="resume", once=True)] if i in fresh else []

    for k, j in enumerate(restart):
        files = (guests if k == 0 else []) + [j]
        b = phase(j, "B", tag="restart", kill_write={"0": WRITE_KILL}, kill_commit={"1": SECOND_KILL})
        phases = [resume(i) + ([b] if i == j else []) for i in files]
        err, wall_s = _launch([paths[i] for i in files], [outdirs[i] for i in files], phases, WORLD,
                              timeout("resume", len(files)), max_restarts=2, label="restart")
        for i in files:
            out[i]["fresh"] = err  # the fresh jobs' launch: what ended it, where one of them did
        if not _began_first(Path(outdirs[j]), "B"):
            # A fresh job before it in this launch failed (or hung), so B began in a later attempt than its kills
            # are scheduled from: B alone, again, so that a crash of the fresh job costs the fresh job only.
            _forget(Path(outdirs[j]), "B")
            err, more_s = _launch([paths[j]], [outdirs[j]], [[b]], WORLD, timeout("resume", 1), max_restarts=2,
                                  label="restart")
            wall_s += more_s
        out[j]["resume"], out[j]["resume_launch_s"] = err, wall_s
    if guests and not restart:
        _batch(guests, paths, outdirs, resume, WORLD, "resume", timeout, out)


def _began_first(outdir: Path, name: str) -> bool:
    """Every rank began phase ``name`` in the launch's first attempt (``probes._run_phase``'s marks)."""
    marks = [outdir / f"{name}-began-rank{r}" for r in range(WORLD)]
    return all(m.is_file() and m.read_text().strip() == "0" for m in marks)


def _forget(outdir: Path, name: str) -> None:
    """Everything phase ``name`` left (its checkpoints, records, marks), before it runs again from scratch."""
    shutil.rmtree(outdir / name, ignore_errors=True)
    for f in outdir.glob(f"{name}-*"):
        f.unlink()


def _mid_epoch_dir(outdir: Path) -> None:
    """R2: a copy of C as its job stopped (after step ``FRESH_STOP``; its checkpoint of step ``MID_EPOCH_FROM``, in
    the middle of the first epoch, a position no whole number of batches at the other world size), where the fresh
    scenario ran: the job at the other world size resumes there too, and trains to the end (its first epoch's short
    tail included). R resumes where the reshard's ranks have no whole batch left: any position past it reads the
    same."""
    if (outdir / "C-stopped").exists() and (outdir / "C").is_dir():
        shutil.copytree(outdir / "C", outdir / MID_EPOCH, dirs_exist_ok=True)


def _reshard_dir(outdir: Path) -> None:
    """R: a copy of A's checkpoints without the last one, so that the job at the other world size resumes in the
    middle of the run (from step ``RESHARD_FROM``) and trains on, where the data position must keep its meaning."""
    if not (outdir / "A").is_dir():  # a run that never saved: the job at the other world size starts afresh
        return
    shutil.copytree(outdir / "A", outdir / "R", dirs_exist_ok=True)
    for step in range(RESHARD_FROM + 1, RUN["steps"] + 1):
        shutil.rmtree(final_path(outdir / "R", step), ignore_errors=True)
