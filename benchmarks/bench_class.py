"""Grading a class: submissions graded per hour at --jobs 1 and --jobs 2, beside the single gradings.

A class of :data:`LEARNERS` learners, each submitting every reference solution (so every grading
does all its work), graded by :func:`autograder.commands.classroom.grade_class` at 1 and 2 gradings at a
time, in one run: at --jobs 1 the wall time is the sum of the single gradings. The extrapolation to a large class
divides the CPU seconds per submission by the cores
(gradings here are CPU-bound: on a 16-core box without GPUs, 4 gradings of 4 ranks at a time).
"""
from __future__ import annotations

import resource
import shutil
import tempfile
import time
from pathlib import Path

from autograder.commands import classroom
from autograder.grader.registry import exercises
from benchmarks import Row
from distlab.runtime import warm
from distlab.runtime.importing import REPO_ROOT

LEARNERS = 2


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime + warm.server_cpu_s()


def _make_class(root: Path) -> int:
    for i in range(LEARNERS):
        folder = root / f"learner{i}"
        folder.mkdir(parents=True)
        for ex in exercises().values():
            shutil.copy(REPO_ROOT / "solutions" / ex.filename, folder / ex.filename)
    return LEARNERS * len(exercises())


def _on_the_cluster(root: Path, n: int) -> list[Row]:
    """The same class as a 2-task job array (course/slurm/grade_class.sbatch) on the two-node cluster
    of distlab/runtime/slurm_cluster.py (both nodes are this host: the row shows the array's overhead, not a
    second machine's cores). Skipped with the reason where no cluster can start (root, slurm-wlm)."""
    import os
    import sys

    from distlab.runtime import slurm_cluster

    why = slurm_cluster.missing()
    if why:
        return [Row("class", "submissions graded per hour, 2-task Slurm array", float("nan"), "/h", f"not run: {why}")]
    with slurm_cluster.SlurmCluster() as cluster, tempfile.TemporaryDirectory() as out:
        env = cluster.env(PATH=f"{Path(sys.executable).parent}{os.pathsep}{cluster.env()['PATH']}",
                          DISTLAB_REPO=str(REPO_ROOT), DISTLAB_VENV=str(Path(sys.executable).parent.parent))
        start = time.perf_counter()
        job = cluster.sbatch("--array=0-1", str(REPO_ROOT / "course/slurm/grade_class.sbatch"), str(root), out,
                             cwd=Path(out), env=env)
        states = [cluster.wait(f"{job}_{k}", timeout=3600).get("JobState") for k in (0, 1)]
        wall = time.perf_counter() - start
    return [Row("class", f"submissions graded per hour, 2-task Slurm array on 2 nodes of this host ({n} gradings)",
                n / wall * 3600, "/h", f"{wall:.0f} s; tasks {', '.join(states)}")]


def rows() -> list[Row]:
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        n = _make_class(Path(tmp))
        warm.available()  # the server is up before the clock starts, as in a class run's steady state
        for jobs in (1, 2):
            cpu, start = _cpu_s(), time.perf_counter()
            results = classroom.grade_class(Path(tmp), jobs=jobs)
            wall, cpu = time.perf_counter() - start, _cpu_s() - cpu
            full = sum(r.passed for v in results.values() for r in v)
            out.append(Row("class", f"submissions graded per hour, --jobs {jobs} ({n} gradings)", n / wall * 3600,
                           "/h", f"{wall:.0f} s, {cpu:.0f} CPU-s, {full}/{n} full marks"))
            if jobs == 1:
                per_cpu = cpu / n
        out += _on_the_cluster(Path(tmp), n)
        hours = 200 * len(exercises()) * per_cpu / 16 / 3600
        out.append(Row("class", f"a class of 200 x {len(exercises())} exercises on a 16-core box (extrapolated)",
                       hours, "h", f"{per_cpu:.1f} CPU-s per submission here, / 16 cores"))
    return out
