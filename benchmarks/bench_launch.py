"""Launch floor, grading cost of exercise 1, DDP throughput of its model at 1 and 2 ranks, and how
long ending a hung job takes.

Target from the foundation issue: grading exercise 1 costs at most 2x the launch floor
per world size it checks (it checks 2 and 4). A hang is ended within 10 s of its limit, for a
launch and for a grading (tests/distlab/test_launch.py and tests/autograder/test_cli.py check that it is ended and
that nothing is left; the seconds are measured here, where load cannot fail the suite).
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import distlab
from autograder.checks.ex01_ddp import EXERCISE, MODEL, WORLD_SIZES
from autograder.grader.supervise import grade_one
from benchmarks import Row
from distlab.runtime.importing import REPO_ROOT
from distlab.runtime.failures import LaunchTimeout
from distlab.runtime.launch import time_scale
from distlab.models import make_mlp

REPEATS = 3
HANG_TARGET_S = 10  # a hang is ended within this many seconds of its limit


def hang(ready_dir: str) -> None:
    """Every rank says it started, then sleeps far past the limit; rank 0 also starts a grandchild
    that does too (the clean-up has to find it)."""
    import torch.distributed as dist

    distlab.init_distributed()
    if dist.get_rank() == 0:
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    Path(ready_dir, f"rank{dist.get_rank()}").touch()
    time.sleep(600)


def seconds_to_end_a_hung_launch(limit: float) -> tuple[float, bool]:
    """(seconds from the launch's limit to torchrun() raising LaunchTimeout, whether both ranks had
    started, so that the figure includes ending started ranks and a grandchild)."""
    with tempfile.TemporaryDirectory() as ready:
        start = time.perf_counter()
        try:
            distlab.torchrun(hang, 2, args=(ready,), timeout=limit)
        except LaunchTimeout:
            pass
        late = time.perf_counter() - start - limit * time_scale()
        return late, len(os.listdir(ready)) == 2


def seconds_to_end_a_hung_grading(limit: float = 8) -> float:
    """Seconds from the grading's limit to grade_one returning, for an exercise 1 submission that
    sleeps in train_ddp (as tests/autograder/test_cli.py's hang test)."""
    text = (REPO_ROOT / "solutions" / EXERCISE.filename).read_text()
    needle = "    rank = dist.get_rank()\n"
    assert needle in text, "the hang is inserted after this line of the solution"
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, EXERCISE.filename).write_text(text.replace(needle, needle + "    import time; time.sleep(3600)\n"))
        start = time.perf_counter()
        report = grade_one(EXERCISE, Path(tmp), time_limit=limit)
        late = time.perf_counter() - start - limit * time_scale()
    assert "grading took longer than" in report.feedback, report.feedback  # it measured the right thing
    return late


def ddp_throughput(batch_size: int = 256, repeats: int = 5) -> float:
    """Samples/s of DDP training on exercise 1's MLP, all ranks counted: the median of ``repeats``
    windows, each measured by exercise 6's reference ``measure_throughput`` (warm-up, barriers)."""
    from solutions.ex06_scaling import make_ddp_step, measure_throughput

    dev = distlab.init_distributed()
    model = make_mlp(seed=0, **MODEL).to(dev)
    x, y = torch.randn(batch_size, 64, device=dev), torch.randint(0, 10, (batch_size,), device=dev)
    step = make_ddp_step(model, x, y, lr=0.1)
    rates = [measure_throughput(step, batch_size, warmup=5, iters=30) for _ in range(repeats)]
    distlab.shutdown()
    return statistics.median(rates)


def rows() -> list[Row]:
    floors = {w: statistics.median(distlab.torchrun("distlab.lab.examples:noop", w, timeout=120).wall_s
                                   for _ in range(REPEATS)) for w in WORLD_SIZES}
    start = time.perf_counter()
    report = grade_one(EXERCISE, REPO_ROOT / "solutions")
    grading = time.perf_counter() - start
    assert report.passed, report.feedback  # a fast grade of a wrong answer would mean nothing
    out = [Row("launch", f"torchrun of {w} ranks doing nothing (median of {REPEATS})", floors[w], "s",
               "the floor every check pays") for w in WORLD_SIZES]
    budget = 2 * sum(floors.values())
    out.append(Row("grading", "grade exercise 1 (solution, W=2 and W=4)", grading, "s",
                   f"target <= 2x floors = {budget:.1f} s: {'met' if grading <= budget else 'NOT met'}"))
    rates = {w: distlab.torchrun(ddp_throughput, w, timeout=300).results[0] for w in (1, 2)}
    for w, r in rates.items():
        out.append(Row("ddp", f"DDP throughput, exercise MLP, batch 256/rank, {w} rank(s)", r, "samples/s",
                       "median of 5 windows between barriers (exercise 6's method)"))
    out.append(Row("ddp", "scaling efficiency 1 -> 2 ranks", rates[2] / (2 * rates[1]), "x of linear",
                   "CPU ranks share 2 cores and memory bandwidth here: not what GPUs show"))
    # A limit of 3x the 2-rank floor (at least 10 s) lets the ranks start before it runs out.
    late, started = seconds_to_end_a_hung_launch(max(10.0, 3 * floors.get(2, 5.0)))
    out.append(Row("launch", "end a hung 2-rank job (and a grandchild): time past its limit", late, "s",
                   f"target <= {HANG_TARGET_S} s: {'met' if late <= HANG_TARGET_S else 'NOT met'}"
                   + ("" if started else "; the ranks had not all started by the limit")))
    late = seconds_to_end_a_hung_grading()
    out.append(Row("grading", "stop a hanging exercise 1 grading: time past its 8 s limit", late, "s",
                   f"target <= {HANG_TARGET_S} s: {'met' if late <= HANG_TARGET_S else 'NOT met'}"))
    return out
