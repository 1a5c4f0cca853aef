"""What each launch of this process cost, and where its seconds went: the breakdown of a grading.

Every :func:`distlab.torchrun` of a process appends one :class:`LaunchCost` to :data:`LAUNCHES`:
its wall-clock seconds, the CPU seconds of all its processes (torchrun's agent and the ranks,
where the warm path's job root can count them: :attr:`distlab.runtime.process.Finished.cpu_s`),
and, per rank, the wall and CPU seconds of the target itself (the rank's function, from its call
to its return, as :mod:`distlab.runtime.worker` times it and writes ``cost-<rank>.json``). What a
launch costs beyond its slowest rank's target is the launcher's: forks, torchrun's rendezvous, the
results' round trip. ``make bench`` (``benchmarks/bench_breakdown.py``) reads these, with the
grading process's own account (:func:`process_account`).

Measured, never asserted: a test may check that a record exists, not what it says.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class LaunchCost:
    """One launch: ``world`` ranks, ``wall_s`` from the request to the results, ``cpu_s`` of every process of the
    job (``None`` where the path cannot tell), and each rank's target (``rank_wall_s``, ``rank_cpu_s``)."""

    world: int
    wall_s: float
    cpu_s: float | None
    rank_wall_s: list[float] = field(default_factory=list)
    rank_cpu_s: list[float] = field(default_factory=list)
    rank_started: list[float] = field(default_factory=list)  # time.time() when each rank's target was called
    ended: float = field(default_factory=time.time)  # when the launch returned (launches may overlap)


LAUNCHES: list[LaunchCost] = []
ACCOUNT_VAR = "DISTLAB_COSTS_FILE"  # where a grading process writes its account (make bench; never a rank)


def write_rank_cost(outdir: Path, rank: int, started: float, cpu_s: float) -> None:
    """In a rank: what its target cost since ``started`` (a ``time.time()``; a target that raised writes none)."""
    cost = {"started": started, "wall_s": round(time.time() - started, 4), "cpu_s": round(cpu_s, 4)}
    (outdir / f"cost-{rank}.json").write_text(json.dumps(cost))


def record(outdir: Path, world: int, wall_s: float, cpu_s: float | None) -> LaunchCost:
    """In the launching process, once the job is over: the launch's cost, with what its ranks wrote."""
    ranks = [c for c in (_rank_cost(outdir / f"cost-{r}.json") for r in range(world)) if c is not None]
    cost = LaunchCost(world, round(wall_s, 4), cpu_s, [w for _, w, _ in ranks], [c for _, _, c in ranks],
                      [s for s, _, _ in ranks])
    LAUNCHES.append(cost)
    return cost


def _rank_cost(path: Path) -> tuple[float, float, float] | None:
    """A rank's start (``time.time()``), wall and CPU seconds; ``None`` for a file missing or not as written: a
    rank runs the learner's code, which may have written anything there, and an account never fails a grading."""
    try:
        with open(path, "rb") as f:
            got = json.loads(f.read(4096))
        return float(got["started"]), float(got["wall_s"]), float(got["cpu_s"])
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None


def write_account(started: float, ready: dict) -> None:
    """Where :data:`ACCOUNT_VAR` names a file: this process's account since ``started`` (a ``time.time()``:
    :func:`process_account`), with ``ready``, the account taken once it was ready to work (its check imported)."""
    path = os.environ.get(ACCOUNT_VAR)
    if path:
        Path(path).write_text(json.dumps({**process_account(started), "ready": ready}))


def process_account(started: float) -> dict:
    """This process's own seconds: wall since ``started`` (a ``time.time()``), its CPU since it began (a fork's
    count starts at the fork), and the costs of its launches."""
    times = os.times()
    return {"started": started, "wall_s": round(time.time() - started, 4),
            "cpu_s": round(times.user + times.system, 4), "launches": [asdict(c) for c in LAUNCHES]}
