"""What every check shares: one launch grades many files, and a launch's time budget.

A launch costs seconds of process start-up (every rank imports torch); the
test suite and the self-test grade a solution and its mutants (known
mistakes) together. A check's ``rank_main(paths, ...)`` receives the list of
paths and returns one observation per path; :func:`launch_files` hands back,
for each path, the list of every rank's observation of it.
"""
from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Sequence, TypeVar

from distlab import torchrun
from distlab.runtime.launch import target_string
from distlab.runtime.process import Budget, time_scale

from . import progress
from ..rank.trace import traced_main as traced
from .registry import Exercise

# What a grading subprocess spends outside its launches: starting Python and torch, the
# single-process reference, the verdicts. A launch's timeout leaves it, so that a hang is
# reported as a LaunchTimeout naming the ranks that never finished, not cut off by the CLI.
RESERVE_S = 20.0
PER_EXTRA_FILE_S = 10.0  # what one more file costs a launch that already started (no start-up)


T = TypeVar("T")


def side_by_side() -> bool:
    """Whether a check's launches at several world sizes run at once: on the CPU, where most of a launch is process
    starts and ranks waiting on each other, which two launches overlap on the cores (no criterion reads a time);
    not on a GPU machine, where each needs W devices. Side by side, each launch may take the whole budget."""
    import torch

    return not torch.cuda.is_available()


def each_world_size(launch: Callable[[int], T], worlds: Sequence[int]) -> list[tuple[int, T]]:
    """``(world, launch(world))`` for each of ``worlds``, in their order: at once where :func:`side_by_side`, else
    one after the other. A launch that raises raises here, as a sequential one would."""
    if len(worlds) < 2 or not side_by_side():
        return [(w, launch(w)) for w in worlds]
    with ThreadPoolExecutor(len(worlds)) as pool:
        jobs = [(w, pool.submit(launch, w)) for w in worlds]
        return [(w, job.result()) for w, job in jobs]


@functools.cache
def process_scale() -> float:
    """This grading process's time scale, read once: the supervisor hands it down (``Budget.env``)."""
    return time_scale()


def launch_timeout(exercise: Exercise, *, files: int = 1, launches: int = 1, share: float | None = None,
                   reserve_s: float = RESERVE_S, per_extra_file_s: float = PER_EXTRA_FILE_S) -> Budget:
    """The budget of one of ``launches`` launches, run one after another, that grade ``files`` files.

    For one file the launches share what is left of ``exercise.time_limit`` after ``reserve_s``,
    equally, or this launch gets ``share`` of it (a fraction; the shares of the launches add up to 1);
    every more file in the same launch (the test suite's mutants) adds ``per_extra_file_s``. Nominal
    seconds, at this process's scale (:func:`process_scale`): ``torchrun`` takes the budget as it is.
    """
    fraction = 1 / launches if share is None else share
    return Budget(exercise.time_limit, process_scale()).share(fraction, reserve_s=reserve_s,
                                                               plus_s=per_extra_file_s * (files - 1))


def launch_files(rank_main: Callable, paths: Sequence[str | Path], *, world: int, timeout: Budget,
                 args: tuple = (), untraced: Sequence[int] = ()) -> tuple[list[list], float]:
    """One launch of ``rank_main([paths], *args)`` on ``world`` ranks.

    Returns, for each path, every rank's observation of it (rank order), and the launch's seconds.
    ``untraced``: the indexes of paths whose traces are not kept (a part of a file run again alone: its trace
    has no counterpart in the reference's).
    """
    files = f" for {len(paths)} files" if len(paths) > 1 else ""
    with progress.step(f"[W={world}] torchrun, {world} ranks{files}"):
        target, first = (traced, (target_string(rank_main),)) if tracing() else (rank_main, ())
        run = torchrun(target, world, args=(*first, [str(p) for p in paths], *args), timeout=timeout)
    traced_paths = [p for i, p in enumerate(paths) if i not in untraced]
    results = [keep_traces(traced_paths, got) for got in run.results]
    return [[per_rank[i] for per_rank in results] for i in range(len(paths))], run.wall_s


def tracing() -> bool:
    """Whether launches run their ranks under ``rank.trace`` (``DISTLAB_TRACE=0``: not)."""
    import os

    return os.environ.get("DISTLAB_TRACE", "1") != "0"


# Every launch's trace of each file graded (``rank.trace``), per path: one entry per launch, each the
# ranks' traces in rank order. ``divergence`` compares them with the reference's, and takes them.
TRACES: dict[str, list[list[list[dict]]]] = {}


def keep_traces(paths: Sequence[str | Path], got: dict) -> object:
    """What ``rank.trace.traced_main`` returned on one rank (ranks in order): its traces go in
    :data:`TRACES` (rank 0 opens this launch's entry), its results are returned."""
    if not (isinstance(got, dict) and "traces" in got):
        return got
    for path in map(str, paths):
        launches = TRACES.setdefault(path, [])
        if got.get("rank", 0) == 0 or not launches:
            launches.append([])
        launches[-1].append(got["traces"].get(path, []))
    return got["results"]

