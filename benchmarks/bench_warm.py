"""Warm launches against the torchrun CLI, side by side in one run (issue 21's targets).

| measure                                                                    | target          |
|----------------------------------------------------------------------------|-----------------|
| a later warm 2-rank launch / the torchrun CLI's 2-rank launch, same job     | <= 0.2          |

A grading against the same floor (CLI 2-rank + 4-rank launch), from a cold process: ``bench_breakdown``.

The job is :func:`distlab.lab.examples.ddp_barrier` (a gloo group, a DDP of one ``nn.Linear``, a
barrier). CLI and warm launches alternate, so load that comes and goes falls on both; each figure
is a median. CPU seconds are those of the launched processes: the CLI's from ``RUSAGE_CHILDREN``,
the warm path's from the server's own account of the jobs it forked and collected.
"""
from __future__ import annotations

import resource
import statistics
import time

import distlab
from benchmarks import Row
from distlab.runtime import warm

REPEATS = 3
JOB = "distlab.lab.examples:ddp_barrier"


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _cpu_s() -> float:
    return _children_cpu_s() + warm.server_cpu_s()


def timed_launch(nprocs: int, cli: bool) -> tuple[float, float]:
    """(wall s, CPU s) of one launch of :data:`JOB`, through the CLI or warm."""
    cpu, start = _cpu_s(), time.perf_counter()
    if cli:
        with warm.cli_launches():
            distlab.torchrun(JOB, nprocs, timeout=300)
    else:
        distlab.torchrun(JOB, nprocs, timeout=300)
    return time.perf_counter() - start, _cpu_s() - cpu


def rows() -> list[Row]:
    start = time.perf_counter()
    distlab.torchrun(JOB, 2, timeout=300)  # the server starts and imports once
    first = time.perf_counter() - start
    samples = {(w, cli): [] for w in (2, 4) for cli in (True, False)}
    for _ in range(REPEATS):
        for w in (2, 4):
            for cli in (True, False):
                samples[w, cli].append(timed_launch(w, cli))
    wall = {k: statistics.median(s[0] for s in v) for k, v in samples.items()}
    cpu = {k: statistics.median(s[1] for s in v) for k, v in samples.items()}
    out = [Row("launch", "first warm launch of a process (the server starts, imports torch once)", first, "s")]
    for w in (2, 4):
        out.append(Row("launch", f"{w}-rank DDP job, torchrun CLI (median of {REPEATS})", wall[w, True], "s",
                       f"{cpu[w, True]:.1f} CPU-s"))
        out.append(Row("launch", f"{w}-rank DDP job, warm (median of {REPEATS})", wall[w, False], "s",
                       f"{cpu[w, False]:.1f} CPU-s"))
    ratio = wall[2, False] / wall[2, True]
    out.append(Row("launch", "warm 2-rank launch / CLI 2-rank launch", ratio, "x",
                   f"target <= 0.2: {'met' if ratio <= 0.2 else 'NOT met'}"))
    return out
