"""Where a grading's seconds go, per exercise, against issue 40's targets (measured, never asserted in tests).

| measure                                                                  | target                         |
|--------------------------------------------------------------------------|--------------------------------|
| ``check(N)``, the first call of a fresh process (its warm server starts) | <= 6 s                         |
| ``check(N)``, the second call                                            | <= 3 s                         |
| the second call / the CPU seconds of the ranks' targets                  | <= 2                           |
| one exercise graded by a cold ``python -m autograder grade`` / CLI floor | <= 1.0                         |
| every reference graded by one cold process / CLI floor                   | <= 0.5 per exercise            |

Each exercise runs in a process of its own (:data:`_CALLS`), as a notebook kernel would: ``check(N)`` on its
reference solution twice in a row. The second call's seconds are split from the grading process's own
account (:mod:`distlab.runtime.costs`, written where ``DISTLAB_COSTS_FILE`` says): the start (the call to
the grading process ready: its fork or interpreter, its imports), the launches (the seconds during which
one ran; of those, the seconds during which a rank's target ran: the learner's functions with the check's
probes and the trace around them; the rest is the launcher's: forks, rendezvous, results), the grader's own
work (single-process references, verdicts, divergence) and the report (written, read back, shown). The
CLI floor is a 2-rank plus a 4-rank launch of a trivial DDP job by the torchrun CLI, measured in the same
run (``bench_warm``'s job).
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time

from autograder.grader.registry import exercises
from benchmarks import Row
from benchmarks.bench_warm import timed_launch
from distlab.runtime.importing import REPO_ROOT

# One exercise in a fresh process: check(N) twice, each with its grading process's account.
_CALLS = """
import contextlib, io, json, os, sys, tempfile, time
from autograder import check
import IPython  # a notebook kernel has it: check(N) shows its feedback through it
out = []
for call in range(2):
    with tempfile.NamedTemporaryFile(suffix=".json") as account:
        os.environ["DISTLAB_COSTS_FILE"] = account.name
        started, start = time.time(), time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            report = check(int(sys.argv[1]), sys.argv[2], raise_on_fail=False)
        wall = time.perf_counter() - start
        out.append({"started": started, "wall_s": wall, "passed": report.passed,
                    "account": json.loads(open(account.name).read() or "{}")})
print(json.dumps(out))
"""


def _covered(spans: list[tuple[float, float]]) -> float:
    """The seconds during which at least one of ``spans`` ran (exercise 1 runs its two world sizes at once)."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        total += max(0.0, end - max(start, reach))
        reach = max(reach, end)
    return total


def split(call: dict) -> dict:
    """A ``check(N)`` call's seconds by phase, and the CPU seconds of the ranks' targets and of the launches."""
    acct = call["account"]
    launches = acct["launches"]
    ready_at = acct["started"] + acct["ready"]["wall_s"]
    in_launches = _covered([(c["ended"] - c["wall_s"], c["ended"]) for c in launches])
    ranks = _covered([(s, s + w) for c in launches for s, w in zip(c["rank_started"], c["rank_wall_s"])])
    return {"total": call["wall_s"], "start": ready_at - call["started"], "launches": in_launches, "ranks": ranks,
            "grader": acct["wall_s"] - acct["ready"]["wall_s"] - in_launches,
            "after": call["started"] + call["wall_s"] - (acct["started"] + acct["wall_s"]),
            "ranks_cpu": sum(sum(c["rank_cpu_s"]) for c in launches),
            "launches_cpu": sum(c["cpu_s"] or 0.0 for c in launches), "grader_cpu": acct["cpu_s"],
            "n_launches": len(launches)}


def _exercise(n: int) -> list[dict]:
    done = subprocess.run([sys.executable, "-c", _CALLS, str(n), str(REPO_ROOT / "solutions")], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"exercise {n}: {done.stderr[-2000:]}")
    calls = json.loads(done.stdout.strip().splitlines()[-1])
    # a fast grade of a wrong answer would mean nothing
    assert all(c["passed"] for c in calls), f"exercise {n}: the reference lost marks"
    return calls


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def _rows_of(n: int, calls: list[dict]) -> list[Row]:
    first, second = calls[0]["wall_s"], split(calls[1])
    ratio = second["total"] / second["ranks_cpu"] if second["ranks_cpu"] else float("nan")
    note = (f"start {second['start']:.2f} s | {second['n_launches']} launch(es) {second['launches']:.2f} s, "
            f"the ranks' targets running {second['ranks']:.2f} s of it | grader {second['grader']:.2f} s | report "
            f"{second['after']:.2f} s; CPU: ranks' targets {second['ranks_cpu']:.1f} s, launches "
            f"{second['launches_cpu']:.1f} s, grading process {second['grader_cpu']:.1f} s")
    return [
        Row("breakdown", f"ex{n:02d} check({n}), first call of a fresh process", first, "s",
            f"target <= 6 s: {_met(first <= 6)}"),
        Row("breakdown", f"ex{n:02d} check({n}), second call", second["total"], "s",
            f"target <= 3 s: {_met(second['total'] <= 3)}; {note}"),
        Row("breakdown", f"ex{n:02d} second call / CPU-s of the ranks' targets", ratio, "x",
            f"target <= 2: {_met(ratio <= 2)}"),
    ]


def _cold(args: list[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "autograder", "grade", str(REPO_ROOT / "solutions"), *args],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return time.perf_counter() - start


def rows() -> list[Row]:
    out = []
    for n in sorted(exercises()):
        out += _rows_of(n, _exercise(n))
    floor = sum(statistics.median(timed_launch(w, cli=True)[0] for _ in range(3)) for w in (2, 4))
    one, every = _cold(["--exercise", "1"]), _cold([])
    k = len(exercises())
    out += [
        Row("breakdown", "CLI floor: torchrun CLI 2-rank + 4-rank launch (medians of 3)", floor, "s"),
        Row("breakdown", "python -m autograder grade --exercise 1, a cold process / CLI floor", one / floor, "x",
            f"{one:.1f} s; target <= 1.0: {_met(one / floor <= 1.0)}"),
        Row("breakdown", f"python -m autograder grade, all {k} references, a cold process / CLI floor", every / floor,
            "x", f"{every:.1f} s; target <= {0.5 * k:g} (0.5 per exercise): {_met(every / floor <= 0.5 * k)}"),
    ]
    return out
