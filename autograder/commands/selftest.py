"""``python -m autograder selftest``: does this machine grade correctly?

The one command an instructor runs on a new GPU box, or in the grading image,
before grading a class. It grades every reference solution (``solutions/``,
full marks expected) and every stub (made afresh from them, 0 expected: never the
work in ``exercises/``) exactly as a learner's file is graded
(:func:`autograder.grader.supervise.grade_one`: one subprocess
per exercise under its time limit), launches a tiny probe at W=1, 2 and 4 that
all-reduces on each rank's device (under NCCL that is the GPU check), and
reports the versions, the sandbox and the time of each grading against its
limit. Anything unexpected is a *surprise*: one line each, and exit status 1.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import distlab
from distlab.runtime import warm
from distlab.runtime.process import TIME_SCALE_VAR, Budget, calibrate, time_scale
from distlab.runtime.sandbox import status as sandbox_status

from ..grader.registry import Exercise, exercises
from ..grader.stubs import differing, generate
from ..grader.supervise import REPO_ROOT, grade_one

SOLUTIONS_DIR = REPO_ROOT / "solutions"
STUBS_DIR = REPO_ROOT / "exercises"
PROBE_WORLDS = (1, 2, 4)
PROBE_TIMEOUT_S = 90.0
SLOW_SHARE = 0.8  # a solution that fails after this share of its time limit may just have run out of time


def probe() -> dict:
    """Runs on every rank of a probe job: join the group, all-reduce a one, say what was used.

    The all-reduce is what makes the probe more than a print: under NCCL it runs
    on the GPU, so a broken driver, NCCL or device assignment fails here, in a
    few seconds, rather than as a puzzling zero in some exercise.
    """
    import torch
    import torch.distributed as dist

    dev = distlab.init_distributed()
    try:
        total = torch.ones(1, device=dev)
        dist.all_reduce(total)
        gpu = torch.cuda.get_device_name(dev) if dev.type == "cuda" else None
        return {"rank": distlab.rank(), "world_size": distlab.world_size(), "backend": distlab.backend(),
                "device": str(distlab.device()), "sum": float(total.item()), "gpu": gpu}
    finally:
        distlab.shutdown()


def run_probe(world: int, timeout: float = PROBE_TIMEOUT_S) -> dict:
    """Launch :func:`probe` on ``world`` ranks; ``error`` is None when every rank agreed.

    Launched with :func:`distlab.torchrun` like every graded job, so the probe
    goes through the same launcher, backend choice and (in the image) sandbox.
    """
    out = {"world_size": world, "backend": None, "devices": [], "gpus": [], "seconds": None, "error": None}
    start = time.monotonic()
    try:
        ranks = distlab.torchrun(probe, nprocs=world, timeout=timeout).results
    except Exception as exc:  # noqa: BLE001 - whatever stops the probe (launch, sandbox set-up) is the finding
        first = (str(exc).splitlines() or [""])[0]
        out["error"] = first if isinstance(exc, distlab.LaunchError) else f"{type(exc).__name__}: {first}".rstrip(": ")
        return out
    finally:
        out["seconds"] = round(time.monotonic() - start, 2)
    out.update(backend=ranks[0]["backend"], devices=[r["device"] for r in ranks],
               gpus=sorted({r["gpu"] for r in ranks if r["gpu"]}))
    if {r["backend"] for r in ranks} != {ranks[0]["backend"]}:
        out["error"] = f"ranks disagree on the backend: {[r['backend'] for r in ranks]}"
    elif any(r["world_size"] != world or r["sum"] != world for r in ranks):
        out["error"] = f"all-reduce of ones gave {[r['sum'] for r in ranks]}, expected {world} on every rank"
    return out


def run_probes(worlds: tuple[int, ...] = PROBE_WORLDS) -> list[dict]:
    """All probes at once: a launch's fixed cost is mostly waiting (rendezvous, start-up), so
    three together take about as long as one, and they share nothing (each gets its own port)."""
    with ThreadPoolExecutor(max_workers=len(worlds)) as pool:
        return list(pool.map(run_probe, worlds))


def environment() -> dict:
    """Versions and hardware, without creating a CUDA context in this (the grading) process:
    the gradings that follow then see the GPU as a learner's grading would."""
    import torch

    cuda = torch.cuda.is_available()
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if cuda else None
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "nccl": nccl, "cuda_available": cuda,
            "gpu_count": torch.cuda.device_count() if cuda else 0,
            "gpu_device_node": os.path.exists("/dev/nvidia0"),
            "python": platform.python_version(), "time_scale": time_scale()}


def timed_grade(ex: Exercise, directory: Path, kind: str) -> dict:
    """Grade one file the way a learner's is graded, and time it against its (scaled) limit."""
    start = time.monotonic()
    report = grade_one(ex, directory)
    seconds = round(time.monotonic() - start, 2)
    print(f"selftest: {kind} {ex.number} {ex.name}: {report.score:g}/{report.max_score:g} in {seconds:g} s",
          file=sys.stderr, flush=True)
    return {"exercise": ex.number, "name": ex.name, "score": report.score, "max_score": report.max_score,
            "seconds": seconds, "limit_s": round(Budget.read(ex.time_limit).limit_s, 2),
            "feedback": report.feedback}


def stub_workers(count: int, sandboxed: bool) -> int:
    """How many stub gradings run at once.

    Stubs fail within seconds of their ranks starting, so most of their time is
    start-up (imports, rendezvous): running a few at once saves minutes on a
    GPU box. Each grading holds up to ~6 processes importing torch, hence one
    per 4 cores (one at a time on a small machine). In the learner sandbox all
    gradings share one learner user, its process limit and its clean-up, so
    there they run one after the other.
    """
    if sandboxed:
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(count, cores // 4))


def grade_all(known: list[Exercise], workers: int, stubs_dir: Path) -> tuple[list[dict], list[dict]]:
    """Solutions one at a time (their timings and any throughput checks must not share the
    machine), then the stubs in ``stubs_dir`` ``workers`` at a time; each grading is its own subprocess."""
    solutions = [timed_grade(ex, SOLUTIONS_DIR, "solution") for ex in known]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        stubs = list(pool.map(lambda ex: timed_grade(ex, stubs_dir, "stub"), known))
    return solutions, stubs


def fresh_stubs(folder: Path, exercises_dir: Path = STUBS_DIR) -> str:
    """Write the stubs ``solutions/`` makes into ``folder`` (the self-test grades those, never a learner's
    work in ``exercises/``); one line if ``exercises_dir`` holds something else, else ``""``."""
    stubs = generate(SOLUTIONS_DIR, folder)
    for path, text in stubs.items():
        path.write_text(text)
    edited = [p.name for p in differing(stubs, exercises_dir)]
    if not edited:
        return ""
    return (f"{exercises_dir} is not the released stubs ({', '.join(edited)} differ): the self-test graded fresh "
            "stubs from solutions/; `make stubs` (or `git checkout exercises/`) restores them, losing the edits")


BUDGET_SHARE = 0.4  # a reference grading should take at most this share of its limit on the grading machine


def calibrate_budgets(solutions: list[dict]) -> dict:
    """Budgets from the references' own cost on this machine: if a reference used more than
    :data:`BUDGET_SHARE` of its limit, record the time scale that brings it back to that share, so
    gradings here (without ``DISTLAB_TIME_SCALE``) get limits sized to this machine."""
    if TIME_SCALE_VAR in os.environ or not solutions:
        return {"time_scale": time_scale(), "source": TIME_SCALE_VAR if TIME_SCALE_VAR in os.environ else "default"}
    worst = max(solutions, key=lambda s: s["seconds"] / s["limit_s"])
    needed = time_scale() * worst["seconds"] / (BUDGET_SHARE * worst["limit_s"])
    if needed <= 1.0:
        calibrate(1.0, "the references fit their limits here")
        return {"time_scale": 1.0, "source": "measured"}
    why = f"reference {worst['exercise']} took {worst['seconds']:.0f} of its {worst['limit_s']:g} s limit"
    return {"time_scale": round(needed, 2), "source": "measured", "file": str(calibrate(needed, why)), "why": why}


def surprises(doc: dict) -> list[str]:
    """One line per thing an instructor must look at before grading a class on this machine."""
    out = []
    if doc["sandbox"].get("problem"):
        out.append(f"sandbox: {doc['sandbox']['problem']}")
    env = doc["environment"]
    if env.get("gpu_device_node") and not env.get("cuda_available"):
        out.append("GPU: /dev/nvidia0 exists but torch cannot use CUDA (driver or CUDA build mismatch?): "
                   "everything would be graded on the CPU")
    out += [f"probe W={p['world_size']}: {p['error']}" for p in doc["probes"] if p["error"]]
    for s in doc["solutions"]:
        if s["score"] < s["max_score"] - 1e-9:
            first = next((ln[5:] for ln in s["feedback"].splitlines() if ln.startswith("FAIL ")), "")
            near = s["seconds"] >= SLOW_SHARE * s["limit_s"]
            out.append(f"solution {s['exercise']} {s['name']}: {s['score']:g}/{s['max_score']:g}, "
                       f"expected full marks: {first}".rstrip(": ")
                       + (f" (it took {s['seconds']:.0f} of its {s['limit_s']:g} s: a slow or busy machine? "
                          f"{TIME_SCALE_VAR}=2 allows twice as long)" if near else ""))
    for s in doc["stubs"]:
        if s["score"] > 0:
            earned = [ln[3:].split(":")[0].strip() for ln in s["feedback"].splitlines() if ln.startswith("ok ")]
            out.append(f"stub {s['exercise']} {s['name']}: {s['score']:g}/{s['max_score']:g}, expected 0 "
                       f"(points for unimplemented code: {'; '.join(earned)})")
        elif s["seconds"] >= s["limit_s"]:
            out.append(f"stub {s['exercise']} {s['name']}: ran into its {s['limit_s']:g} s limit "
                       "instead of failing at once (a hang in the grader?)")
    return out


def _rows_table(rows: list[tuple]) -> list[str]:
    """Left-aligned columns with a rule under the header row."""
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    return lines[:1] + ["  ".join("-" * w for w in widths)] + lines[1:]


def _timing(s: dict | None) -> str:
    """``seconds/limit s (share)``: how close to its limit a grading came on this machine."""
    return f"{s['seconds']:.0f}/{s['limit_s']:g} s ({100 * s['seconds'] / s['limit_s']:.0f}%)" if s else "-"


def render(doc: dict) -> str:
    """The report as text: environment, sandbox, probes, then one row per exercise."""
    env, box = doc["environment"], doc["sandbox"]
    lines = [f"torch {env['torch']}  CUDA {env['cuda'] or '-'}  NCCL {env['nccl'] or '-'}  "
             f"GPUs {env['gpu_count']}  python {env['python']}  time scale {env['time_scale']:g}",
             f"root: {'yes' if box['root'] else 'no'}  learner sandbox: "
             + (f"on (user {box['learner_user']})" if box["sandboxed"] else "off")
             + ("  (learners' code runs as root here: the grading image sets DISTLAB_STUDENT_USER)"
                if box["root"] and not box["sandboxed"] else ""),
             "launches: " + ("warm (torchrun's engine, ranks forked from a server that imported torch once)"
                             if doc.get("launch") == "warm" else "the torchrun CLI (no warm server here)"), ""]
    probes = [("probe", "backend", "devices", "time", "result")]
    probes += [(f"W={p['world_size']}", p["backend"] or "-", ", ".join(sorted(set(p["devices"]))) or "-",
                f"{p['seconds']:.1f} s", "ok" if not p["error"] else "FAIL") for p in doc["probes"]]
    gpus = sorted({g for p in doc["probes"] for g in p["gpus"]})
    lines += _rows_table(probes) + ([f"GPU: {', '.join(gpus)}"] if gpus else []) + [""]
    stubs = {s["exercise"]: s for s in doc["stubs"]}
    rows = [("exercise", "solution", "time/limit", "stub", "time/limit")]
    for s in doc["solutions"]:
        t = stubs.get(s["exercise"])
        rows.append((f"{s['exercise']} {s['name']}", f"{s['score']:g}/{s['max_score']:g}", _timing(s),
                     f"{t['score']:g}/{t['max_score']:g}" if t else "-", _timing(t)))
    lines += _rows_table(rows)
    lines += ["", f"stubs (made afresh from solutions/) graded {doc['stub_workers']} at a time; self-test took "
                  f"{doc['seconds']:.0f} s"] + ([doc["exercises_note"]] if doc.get("exercises_note") else [])
    cal = doc.get("calibration") or {}
    if cal.get("source") == "measured":
        lines.append(f"time scale for gradings on this machine: {cal['time_scale']:g}, from the references' own "
                     f"cost here" + (f" ({cal['why']}; recorded in {cal['file']})" if cal.get("why") else ""))
    found = doc["surprises"]
    lines += [f"SURPRISE: {s}" for s in found] or ["no surprises: this machine grades as expected"]
    return "\n".join(lines)


def finish(doc: dict, json_path: str | None = None) -> int:
    """Add the verdict, print the report, write the JSON: exit status 0 only without surprises."""
    doc["surprises"] = surprises(doc)
    doc["ok"] = not doc["surprises"]
    print(render(doc))
    if json_path:
        Path(json_path).write_text(json.dumps(doc, indent=2))
    return 0 if doc["ok"] else 1


def run(only: list[int] | None = None, json_path: str | None = None) -> int:
    """The self-test: probes first (a broken launcher or GPU shows in seconds), then the gradings."""
    start = time.monotonic()
    known = [ex for n, ex in exercises().items() if only is None or n in only]
    doc = {"environment": environment(), "sandbox": sandbox_status(), "launch": warm.path_in_use()}
    doc["probes"] = run_probes()
    doc["stub_workers"] = stub_workers(len(known), doc["sandbox"]["sandboxed"])
    with tempfile.TemporaryDirectory(prefix="selftest-stubs-") as fresh:
        doc["exercises_note"] = fresh_stubs(Path(fresh))
        doc["solutions"], doc["stubs"] = grade_all(known, doc["stub_workers"], Path(fresh))
    doc["calibration"] = calibrate_budgets(doc["solutions"])
    doc["seconds"] = round(time.monotonic() - start, 1)
    return finish(doc, json_path)


def add_parsers(commands: argparse._SubParsersAction) -> None:
    """``selftest``, as a subcommand of ``python -m autograder``."""
    p = commands.add_parser("selftest", help="check this machine: every solution full marks, every stub 0",
                            description="Grade every reference solution (full marks expected) and every stub (0 "
                                        "expected) as a learner's file is graded, and launch a probe at 1, 2 "
                                        "and 4 ranks: each surprise is one line, and the exit status 1.")
    p.add_argument("--exercise", "-e", type=int, action="append", metavar="N", help="only exercise N (repeatable)")
    p.add_argument("--json", metavar="FILE", help="also write the self-test's findings as JSON")
    p.set_defaults(run=lambda args: run(args.exercise, args.json))
