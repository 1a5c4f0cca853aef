"""Launch Python code under torchrun from a notebook, a test or the grader.

    >>> from distlab import torchrun
    >>> run = torchrun("distlab.lab.examples:ddp_barrier", nprocs=2, timeout=60)
    >>> run.results          # what each rank returned, in rank order

* Rendezvous is ``--standalone`` (c10d on ``localhost:0``): the OS picks a
  free port, so any number of launches can run at once without colliding.
* Every launch has a wall-clock ``timeout``; whatever happens (success,
  exception, hang, timeout, Ctrl-C) no process of the job survives the call
  (see :mod:`distlab.runtime.process`).
* A failure raises :class:`RankFailure` naming the rank that failed first and
  its exception, not torchrun's ``ChildFailedError`` wall of text.
* Results come back as Python objects through ``torch.save``/``torch.load``
  with ``weights_only=True``: tensors, numbers, strings, lists and dicts. The
  launching process never unpickles arbitrary objects a rank produced, so a
  learner's code cannot run code in the grader by returning a crafted object.
"""
from __future__ import annotations

import os
import pickle
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from distlab.runtime.distributed import BACKEND_VAR, TIMEOUT_VAR, pick_backend
from distlab.runtime.importing import REPO_ROOT, with_repo_on_path
from distlab.runtime.process import (PROGRESS_VAR, TIME_SCALE_VAR, Budget, Finished,  # noqa: F401 (re-exported)
                                     note_progress, past_limit, run_contained, time_scale)
from distlab.runtime import costs, heartbeat
from distlab.runtime.failures import (LaunchError, LaunchHang, LaunchTimeout, MachineTooSlow,  # noqa: F401
                                      RankFailure, RankKilled, failure)
from distlab.runtime import warm
from distlab.runtime.sandbox import learner_sandbox


@dataclass
class Supervision:
    """When to end a launch: at its limit, unless the ranks still advance (then up to ``extend`` times
    the limit); or as soon as it hangs (:meth:`distlab.runtime.heartbeat.Watch.hung` for ``hang_after_s``).

    ``verdict`` says why it was ended: ``"timeout"`` (the code stopped advancing), ``"hang"``, or
    ``"slow"`` (still advancing at the bound: the machine's problem). ``progress_file``, if set
    (``DISTLAB_PROGRESS_FILE``, by the grader), counts the advances seen, for the grading's own limit.
    """

    watch: "heartbeat.Watch"
    timeout: float
    extend: float = 3.0
    hang_after_s: float = 10.0
    recent_s: float = 5.0
    verdict: str | None = None
    stalled_s: float = 0.0  # how long no rank had advanced when the job was found hung
    progress_file: str | None = field(default_factory=lambda: os.environ.get(PROGRESS_VAR))
    _seen: float | None = None

    def __call__(self, elapsed: float) -> bool:
        now = time.monotonic()
        self.watch.poll(now)
        last = self.watch.last_advance()
        if last is not None and last != self._seen:
            self._seen = last
            note_progress(self.progress_file)
        last = last if last is not None else now - elapsed  # a job that has just started is advancing
        if self.watch.hung(now, self.hang_after_s):
            self.verdict, self.stalled_s = "hang", now - last
            return True
        self.verdict = past_limit(elapsed, now - last, self.timeout, self.recent_s, self.extend)
        return self.verdict is not None


@dataclass
class RunResult:
    """What a finished job gives back."""

    results: list[Any]
    output: str
    wall_s: float
    nprocs: int
    backend: str
    lines: list[str] = field(default_factory=list, repr=False)

    def rank_lines(self, rank: int) -> list[str]:
        """The lines rank ``rank`` printed, without their ``[rankN]`` prefix."""
        tag = f"[rank{rank}] "
        return [ln[len(tag):] for ln in self.lines if ln.startswith(tag)]


def target_string(target: str | Callable) -> str:
    if isinstance(target, str):
        return target
    module = getattr(target, "__module__", None)
    if module in (None, "__main__") or "<locals>" in target.__qualname__:
        raise ValueError(
            f"{target!r} is not importable by the workers: define it in a module "
            "(or pass 'path/to/file.py:function'), or use the %%torchrun cell magic"
        )
    return f"{module}:{target.__qualname__}"


def _print_line(line: str) -> None:
    print(line, flush=True)


def torchrun(
    target: str | Callable,
    nprocs: int = 2,
    *,
    args: tuple = (),
    kwargs: dict | None = None,
    timeout: float | Budget = 120.0,
    backend: str | None = None,
    max_restarts: int = 0,
    stream: bool | Callable[[str], None] = False,
    env: dict[str, str] | None = None,
    argv: list[str] | None = None,
    cwd: str | os.PathLike | None = None,
    hang_after_s: float = 10.0,
) -> RunResult:
    """Run ``target`` on ``nprocs`` ranks under torchrun and return each rank's result.

    ``target`` is a module-level function, ``"pkg.mod:function"``,
    ``"path/file.py:function"`` or a script ``"path/file.py"`` (run as
    ``__main__`` with ``argv``; its result is its global ``result``, if any).
    ``stream=True`` prints rank-prefixed lines live (a callable receives them
    instead). ``timeout``: nominal seconds, multiplied here by this machine's
    scale (:func:`time_scale`), or a :class:`Budget` a caller already read (the
    grader's: its scale is used, not read again). The same scale multiplies
    ``hang_after_s`` (how long no rank may advance while one waits in a
    collective before the job is ended as a hang: shorter only for a job known
    to block, such as a test's) and is handed to the ranks.
    """
    target_s = target_string(target)
    budget = timeout if isinstance(timeout, Budget) else Budget.read(timeout)
    timeout, scale = budget.limit_s, budget.scale
    backend = backend or pick_backend(nprocs)
    callback = _print_line if stream is True else (stream or None)
    with tempfile.TemporaryDirectory(prefix="distlab-") as tmp:
        outdir = Path(tmp)
        spec = write_spec(outdir, target_s, args=args, kwargs=kwargs, argv=argv)
        # The agent sees a rank's exit at its next poll: every launch waits for one, every restart again. At
        # torchrun's 0.1 s that was 0.05 s a launch and 0.2 s a restart; a poll costs the agent microseconds.
        torchrun_argv = ["--standalone", f"--nproc-per-node={nprocs}", f"--max-restarts={max_restarts}",
                         "--monitor-interval=0.02"]
        supervision = Supervision(heartbeat.Watch(outdir, nprocs), timeout, hang_after_s=hang_after_s * scale,
                                  recent_s=5 * scale)
        # Collectives time out (and gloo names the peer that never came) before the job does.
        finished = run_torchrun(torchrun_argv, spec, timeout=timeout, cwd=cwd, on_line=callback,
                                env=job_env(outdir, backend, 0.75 * timeout, {**(env or {}), **budget.env()}),
                                should_stop=supervision,
                                **learner_sandbox(outdir))
        costs.record(outdir, nprocs, finished.wall_s, finished.cpu_s)
        run = collect(outdir, nprocs, backend, finished, timeout, supervision)
        note_progress(supervision.progress_file)  # a launch that finished is progress too
        return run


def run_torchrun(torchrun_argv: list[str], spec: Path, *, timeout: float, env: dict[str, str],
                 cwd: str | os.PathLike | None = None, on_line: Callable[[str], None] | None = None,
                 user: str | None = None, rlimits: dict[int, int] | None = None,
                 should_stop: Callable[[float], bool] | None = None) -> Finished:
    """``torchrun TORCHRUN_ARGV -m distlab.runtime.worker SPEC``, contained, at most ``timeout`` s.

    Warm (:mod:`distlab.runtime.warm`: the agent and ranks forked from a server that imported torch once)
    where this process can have a server; otherwise the torchrun CLI under :func:`run_contained`.
    Both give the same ranks the same environment and the same :class:`Finished`.
    """
    cmd = [sys.executable, "-m", "torch.distributed.run", *torchrun_argv, "-m", "distlab.runtime.worker", str(spec)]
    return warm.run({"argv": list(torchrun_argv), "spec": str(spec)}, cmd, timeout=timeout, env=env, cwd=cwd,
                    on_line=on_line, user=user, rlimits=rlimits, should_stop=should_stop)


def write_spec(outdir: Path, target: str, *, args: tuple = (), kwargs: dict | None = None,
               argv: list[str] | None = None) -> Path:
    """Write the job spec :mod:`distlab.runtime.worker` reads on every rank; return its path."""
    spec = {
        "kind": "script" if target.endswith(".py") else "function", "target": target,
        "args": tuple(args), "kwargs": dict(kwargs or {}), "argv": list(argv or []), "outdir": str(outdir),
        "sys_path": [str(REPO_ROOT), os.getcwd()],
    }
    path = outdir / "spec.pkl"
    path.write_bytes(pickle.dumps(spec))
    return path


def job_env(outdir: Path, backend: str, collective_timeout: float,
            extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a job's processes: the backend, the collectives' time limit, the repo on the
    path, and a temp folder inside the job's own (torchrun's logs, the ranks' temp files), which goes
    with the job."""
    (outdir / "tmp").mkdir(exist_ok=True)
    env = {**os.environ, "TMPDIR": str(outdir / "tmp"), **(extra or {})}
    env.pop(warm.SERVER_VAR, None)  # a rank never learns where the warm server is
    env.pop(PROGRESS_VAR, None)  # nor where the grader counts its progress
    env.pop(costs.ACCOUNT_VAR, None)  # nor where it writes its account
    env.update({
        BACKEND_VAR: backend, TIMEOUT_VAR: str(max(5, int(collective_timeout))), "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": with_repo_on_path(env),
    })
    # torchrun sets 1 anyway when unset, and prints a banner about it; say it ourselves.
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def collect(outdir: Path, nprocs: int, backend: str, finished: Finished, timeout: float,
            supervision: Supervision | None = None) -> RunResult:
    """Every rank's result from ``outdir``, or the exception that names what went wrong."""
    output = "\n".join(finished.lines)
    done = {int(p.stem.split("-")[1]) for p in outdir.glob("result-*.pt")}
    verdict = supervision.verdict if supervision else None
    if finished.timed_out and verdict == "hang":  # the ranks that returned their result are nowhere
        unfinished = sorted(set(range(nprocs)) - done)
        raise LaunchHang(supervision.stalled_s, supervision.watch.report(unfinished), output,
                         collective=supervision.watch.in_collective())
    if finished.timed_out and verdict == "slow":
        raise MachineTooSlow(timeout, finished.wall_s - timeout)
    if finished.timed_out:
        unfinished = sorted(set(range(nprocs)) - done)
        raise LaunchTimeout(timeout, unfinished, output, supervision.watch.report(unfinished) if supervision else "")
    if finished.returncode != 0 or len(done) < nprocs:
        raise failure(outdir, finished.returncode, nprocs, done, output)
    results = [torch.load(outdir / f"result-{r}.pt", weights_only=True) for r in range(nprocs)]
    return RunResult(results, output, finished.wall_s, nprocs, backend, finished.lines)
