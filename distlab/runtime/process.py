"""The one way distlab starts a job that may run a learner's code, and ends it.

:func:`run_contained` starts a command under :mod:`distlab.runtime.reaper` (a child
subreaper that ends every descendant when the command exits, and, in the
grading image, runs the command as the unprivileged learner user), streams its
output line by line, enforces a wall-clock limit, and returns when the job
is over with nothing of it left running:

* the output is read on a thread, so a process that keeps the pipe open (a
  learner's background helper, started with ``start_new_session=True``)
  cannot hold the caller: once the reaper has exited, what is still in the
  pipe is drained for ``grace_s`` and then the pipe is abandoned;
* what is kept of the output is bounded (:class:`Lines`), so a job that
  prints a gigabyte costs a few megabytes;
* as a last pass, every process still carrying the job's tag (an environment
  variable every process of the job inherits unless it clears it) is killed.
"""
from __future__ import annotations

import collections
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import psutil

JOB_TAG_VAR = "DISTLAB_JOB_ID"
REAPER = Path(__file__).resolve().parent / "reaper.py"
MAX_LINE = 16_384  # characters: a longer line arrives in pieces


def tag_env(job_id: str, env: dict[str, str]) -> dict[str, str]:
    """``env`` with ``job_id`` added to its job tags (a job started inside another keeps both)."""
    tags = [t for t in env.get(JOB_TAG_VAR, "").split(":") if t]
    return {**env, JOB_TAG_VAR: ":".join([*tags, job_id])}


def environ_of(proc: psutil.Process) -> dict[str, str]:
    """``proc``'s environment, read whole from ``/proc`` where there is one: ``psutil.Process.environ`` stops at
    the first empty entry, and a process that rewrites its title over its arguments (slurmstepd's
    "[8751.batch]", ``setproctitle``) leaves zeros at the start of its environment, so it would read as empty
    and escape a sweep by variable. Elsewhere (macOS) psutil's reading."""
    try:
        raw = Path(f"/proc/{proc.pid}/environ").read_bytes()
    except FileNotFoundError:
        return proc.environ()
    return dict(e.split("=", 1) for e in raw.decode(errors="replace").split("\0") if "=" in e)


def tagged_processes(job_id: str) -> list[psutil.Process]:
    """Every live process whose environment carries ``job_id`` among its ``DISTLAB_JOB_ID`` tags."""
    found = []
    me = os.getpid()
    for proc in psutil.process_iter(["pid"]):
        if proc.pid == me:
            continue
        try:
            if job_id in environ_of(proc).get(JOB_TAG_VAR, "").split(":"):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
    return found


def kill_tagged(job_id: str) -> int:
    """SIGKILL every process tagged ``job_id`` (the last pass after the reaper); return how many."""
    procs = tagged_processes(job_id)
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=2)
    return len(procs)


TIME_SCALE_VAR = "DISTLAB_TIME_SCALE"


CALIBRATION = Path(os.environ.get("DISTLAB_CALIBRATION") or
                   Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "distlab" / "time_scale.json")


def time_scale() -> float:
    """What multiplies every launch timeout and grading limit: ``DISTLAB_TIME_SCALE`` if set, else
    what ``make selftest`` measured on this machine (:func:`calibrate`), else 1."""
    try:
        if TIME_SCALE_VAR in os.environ:
            return max(float(os.environ[TIME_SCALE_VAR]), 0.1)
        return max(float(json.loads(CALIBRATION.read_text())["time_scale"]), 1.0)
    except (ValueError, OSError, KeyError, TypeError):
        return 1.0


@dataclass(frozen=True)
class Budget:
    """A time limit that carries its unit: ``nominal_s`` seconds as written for a 2-core laptop, times this
    machine's ``scale`` (:func:`time_scale`, read once where the limit is first read, then handed down with
    the budget, and to child processes as ``DISTLAB_TIME_SCALE``); :attr:`limit_s` is what the clock allows.
    """

    nominal_s: float
    scale: float

    @classmethod
    def read(cls, nominal_s: float) -> Budget:
        """``nominal_s`` at this machine's scale: the one place a process reads the scale for a limit."""
        return cls(nominal_s, time_scale())

    @property
    def limit_s(self) -> float:
        return self.nominal_s * self.scale

    def scaled(self, nominal_s: float) -> float:
        """Another duration at this budget's scale (a grace period, a hang's patience), in clock seconds."""
        return nominal_s * self.scale

    def share(self, fraction: float, *, reserve_s: float = 0.0, plus_s: float = 0.0) -> Budget:
        """``fraction`` of what is left after ``reserve_s``, plus ``plus_s`` (nominal seconds), at the same scale."""
        return Budget((self.nominal_s - reserve_s) * fraction + plus_s, self.scale)

    def env(self) -> dict[str, str]:
        """What hands the scale down to a child process, so that it reads the same one."""
        return {TIME_SCALE_VAR: repr(self.scale)}


def calibrate(scale: float, why: str) -> Path:
    """Record ``scale`` as this machine's time scale (the self-test does, from the references' own
    cost here): later gradings without ``DISTLAB_TIME_SCALE`` use it."""
    CALIBRATION.parent.mkdir(parents=True, exist_ok=True)
    CALIBRATION.write_text(json.dumps({"time_scale": round(scale, 2), "why": why}))
    return CALIBRATION


PROGRESS_VAR = "DISTLAB_PROGRESS_FILE"


def note_progress(path: str | None) -> None:
    """Count one more advance of a job in ``path`` (a grading's progress file), if there is one."""
    if not path:
        return
    try:
        count = int(Path(path).read_text() or 0) if os.path.exists(path) else 0
        tmp = f"{path}.tmp"
        Path(tmp).write_text(str(count + 1))
        os.replace(tmp, path)
    except (OSError, ValueError):
        pass


def past_limit(elapsed: float, since_advance: float, timeout: float, recent_s: float, extend: float) -> str | None:
    """Slow is not wrong: ``None`` while a job may go on (within ``timeout``, or advanced in the last
    ``recent_s`` and within ``extend`` times it); else ``"slow"`` (still advancing at the bound: the
    machine's problem) or ``"timeout"`` (it stopped advancing: the code's)."""
    if elapsed <= timeout:
        return None
    advancing = since_advance < recent_s
    if advancing and elapsed < extend * timeout:
        return None
    return "slow" if advancing else "timeout"


@dataclass
class ProgressLimit:
    """``should_stop`` for :func:`run_contained`: ``timeout``, extended (up to ``extend`` times) while
    the count in ``path`` grows (:func:`note_progress`, written by the launches inside the job).

    Slow is not wrong: ``advancing`` says, once it has stopped the job, whether the job was still
    advancing then (the machine's problem) or had stopped advancing (the code's).
    """

    path: str
    timeout: float
    extend: float = 3.0
    recent_s: float = 5.0
    advancing: bool = False
    _count: str = ""
    _at: float | None = None

    def __call__(self, elapsed: float) -> bool:
        now = time.monotonic()
        try:
            count = Path(self.path).read_text()
        except OSError:
            count = ""
        if count != self._count or self._at is None:  # a job that has just started is advancing
            self._count, self._at = count, now
        verdict = past_limit(elapsed, now - self._at, self.timeout, self.recent_s, self.extend)
        self.advancing = verdict == "slow"
        return verdict is not None


@dataclass
class Lines:
    """A job's output lines, bounded: the first ``head`` and the last ``tail`` are kept."""

    head: int = 2_000
    tail: int = 8_000
    kept: list[str] = field(default_factory=list)
    last: collections.deque = field(default_factory=collections.deque)
    dropped: int = 0

    def add(self, line: str) -> None:
        if len(self.kept) < self.head:
            self.kept.append(line)
            return
        self.last.append(line)
        if len(self.last) > self.tail:
            self.last.popleft()
            self.dropped += 1

    def all(self) -> list[str]:
        gap = [f"[... {self.dropped} lines not kept ...]"] if self.dropped else []
        return [*self.kept, *gap, *self.last]


@dataclass
class Finished:
    """How a contained job ended: ``returncode`` (the command's; 128+N if signal N ended it)."""

    returncode: int | None
    timed_out: bool
    lines: list[str]
    wall_s: float
    cpu_s: float | None = None  # the job's processes' CPU seconds, where the path can tell (a warm job's root)


def reaper_command(cmd: list[str], *, user: str | None = None, rlimits: dict[int, int] | None = None,
                   kill_user: bool = False, grace_s: float = 1.0) -> list[str]:
    """``cmd`` wrapped in the reaper (see :mod:`distlab.runtime.reaper` for the options)."""
    from distlab.runtime.reaper import RLIMITS

    names = {v: k for k, v in RLIMITS.items()}
    opts = ["--grace", str(grace_s)] + (["--user", user] if user else []) + (["--kill-user"] if kill_user else [])
    for res, value in (rlimits or {}).items():
        opts += ["--rlimit", f"{names[res]}={value}"]
    return [sys.executable, "-I", "-S", str(REAPER), *opts, "--", *cmd]


def _read(stream, out: queue.Queue) -> None:
    """Reader thread: decoded lines (long ones in pieces) into ``out``, then None at end of file."""
    for raw in iter(lambda: stream.readline(MAX_LINE), b""):
        out.put(raw.decode("utf-8", "replace").rstrip("\n"))
    out.put(None)


def run_contained(cmd: list[str], *, timeout: float, env: dict[str, str] | None = None,
                  cwd: str | os.PathLike | None = None, on_line: Callable[[str], None] | None = None,
                  user: str | None = None, rlimits: dict[int, int] | None = None,
                  grace_s: float = 1.0, should_stop: Callable[[float], bool] | None = None) -> Finished:
    """Run ``cmd`` contained (see the module docstring) for at most ``timeout`` seconds.

    ``on_line`` receives each output line (stdout and stderr together) in the
    calling thread as it arrives, so a notebook shows them in the running cell.
    ``user``/``rlimits``: run the command as that user under those limits (root only).
    ``should_stop(elapsed_s)``, if given, decides instead of ``timeout`` when the job is ended
    (a limit that extends while the job advances: :class:`distlab.runtime.launch.Supervision`).
    """
    should_stop = should_stop or (lambda elapsed: elapsed > timeout)
    job_id = uuid.uuid4().hex
    start = time.monotonic()
    proc = subprocess.Popen(
        reaper_command(cmd, user=user, rlimits=rlimits, grace_s=grace_s),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        env=tag_env(job_id, dict(os.environ if env is None else env)), cwd=cwd, start_new_session=True)
    try:
        # SIGTERM: the reaper ends the whole tree, then exits.
        timed_out, lines = follow(proc.stdout, should_stop=should_stop, start=start, on_line=on_line,
                                  grace_s=grace_s, exited=lambda: proc.poll() is not None,
                                  stop=lambda: proc.send_signal(signal.SIGTERM))
    finally:
        _end(proc, grace_s)
        kill_tagged(job_id)
    return Finished(proc.returncode, timed_out, lines, time.monotonic() - start)


def follow(stream, *, should_stop: Callable[[float], bool], start: float, on_line: Callable[[str], None] | None,
           grace_s: float, exited: Callable[[], bool], stop: Callable[[], None]) -> tuple[bool, list[str]]:
    """Read a job's output ``stream`` until the job has ``exited()`` and its pipe is drained, calling
    ``stop()`` once if ``should_stop(seconds since start)`` says so first; return (stopped, the lines kept).

    The pipe is read on a thread, so a process that keeps it open after the job has exited (a
    learner's detached helper) holds the caller for ``grace_s`` at most.
    """
    lines, pipe = Lines(), queue.Queue()
    threading.Thread(target=_read, args=(stream, pipe), daemon=True).start()
    timed_out, drain_until = False, None
    while True:
        now = time.monotonic()
        if not timed_out and drain_until is None and should_stop(now - start):
            timed_out = True
            stop()
        if drain_until is None and exited():
            drain_until = now + grace_s
        if drain_until is not None and now > drain_until:
            break  # only escaped processes still hold the pipe: stop listening to them
        try:
            line = pipe.get(timeout=0.05)
        except queue.Empty:
            continue
        if line is None:
            break
        lines.add(line)
        if on_line:
            on_line(line)
    return timed_out, lines.all()


def _end(proc: subprocess.Popen, grace_s: float) -> None:
    """Make sure the reaper has exited (it sweeps its tree on SIGTERM); SIGKILL it as a last resort."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s + 5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def kill_user_processes(user: str) -> None:
    """End every process of ``user`` (root only): for paths where learners' code ran outside our tree."""
    subprocess.run(reaper_command(["true"], user=user, kill_user=True), check=False, timeout=60,
                   stdin=subprocess.DEVNULL)
