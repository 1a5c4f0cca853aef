"""How a torchrun job failed: the exceptions a launch raises, and the root cause read from what the job left.

:func:`failure` names the root cause of a job that exited non-zero: a rank a signal killed before one that
raised (its peers then fail with "connection reset"), else the earliest exception by time, of the job's last
attempt only (a job ``--max-restarts`` restarted fails, if it does, for what its last attempt tripped on). It
reads the ranks' ``error-<rank>-<attempt>.json`` (:mod:`distlab.runtime.worker`), the warm agents'
``exits-<pid>-<attempt>-<n>.json`` (:func:`distlab.runtime.agent.record_exits`) and torchrun's own summary.
:class:`MachineTooSlow` is not a :class:`LaunchError`: no check scores it as the code's failure.
"""
from __future__ import annotations

import json
import re
import signal
from pathlib import Path

from distlab.runtime.process import TIME_SCALE_VAR


class LaunchError(RuntimeError):
    """A torchrun job did not complete; ``output`` holds everything it printed."""

    def __init__(self, message: str, output: str = ""):
        super().__init__(message)
        self.output = output


class RankFailure(LaunchError):
    """A rank raised: ``rank``, ``exc_type``, ``exc_message`` and ``traceback`` say which and why."""

    def __init__(self, rank: int, exc_type: str, exc_message: str, tb: str, output: str = ""):
        first = exc_message.strip().splitlines()[0] if exc_message.strip() else ""
        super().__init__(f"rank {rank} failed: {exc_type}: {first}".rstrip(": "), output)
        self.rank, self.exc_type, self.exc_message, self.traceback = rank, exc_type, exc_message, tb
        self.env_changed: dict = {}  # torchrun's variables the rank had set again: {name: [was, now]}


class RankKilled(LaunchError):
    """A rank died by a signal without raising a Python exception (gloo's SIGABRT, the OOM killer): ``rank``,
    ``signal``."""

    def __init__(self, rank: int, signum: int, output: str = ""):
        super().__init__(f"rank {rank} was killed by signal {signum} ({_signal_name(signum)}) "
                         "without raising a Python exception", output)
        self.rank, self.signal = rank, signum


class RankExited(RankKilled):
    """A rank ended with a non-zero exit code and no error recorded (``os._exit(3)``): the root cause, as a
    signal's death is (its peers then fail with "connection reset")."""

    def __init__(self, rank: int, code: int, output: str = ""):
        LaunchError.__init__(self, f"rank {rank} exited with code {code} without raising a Python exception "
                             "(os._exit ends a process so)", output)
        self.rank, self.signal, self.code = rank, None, code


class LaunchTimeout(LaunchError):
    """The job ran past its time limit and was ended; ``unfinished`` lists ranks that never returned, ``where``
    where each rank was then (``heartbeat.Watch.report``: "rank 0 is at ex03_amp.py:104 (...)"; "": unknown)."""

    def __init__(self, timeout: float, unfinished: list[int], output: str = "", where: str = ""):
        who = f"; ranks {unfinished} never finished" if unfinished else ""
        at = f": {where}" if where else (" (a hang in a collective?)" if unfinished else "")
        super().__init__(f"job ran past its {timeout:g} s limit and was ended{who}{at}", output)
        self.unfinished, self.where = unfinished, where


class LaunchHang(LaunchTimeout):
    """Every rank stopped advancing while one or more waited in a collective: ended early, and named."""

    def __init__(self, after_s: float, where: str, output: str = "", collective: bool = True):
        LaunchError.__init__(self, f"the job hung: no rank advanced for {after_s:.0f} s, and it was ended: {where}",
                             output)
        # collective: some rank waited in a collective (else ranks waited for others that stayed in their code)
        self.unfinished, self.where, self.collective = [], where, collective


class MachineTooSlow(RuntimeError):
    """The ranks were still advancing when the launch ran out of time, even extended: the machine's
    problem, not the code's. Not a :class:`LaunchError`, so no check scores it as the code's failure."""

    def __init__(self, limit_s: float, over_s: float):
        super().__init__(
            f"this machine was too slow for this launch: its ranks were still advancing {over_s:.0f} s past "
            f"its {limit_s:g} s limit (grade again with {TIME_SCALE_VAR}=2)")
        self.limit_s, self.over_s = limit_s, over_s


def failure(outdir: Path, returncode: int, nprocs: int, done: set[int], output: str) -> LaunchError:
    """Name the root cause of the job's last attempt: a rank that died without a Python exception (a signal, the
    OOM killer) comes first, since its peers then fail with "connection reset"; otherwise the earliest
    exception by time. An earlier attempt's failures are not it: a job restarted by ``--max-restarts`` after a
    kill fails, if it does, for what its last attempt tripped on."""
    errors, last = _attempts(outdir)
    errors = [e for e in errors if e["attempt"] == last]
    # torchrun's failure summary has "rank : N (local_rank: N)" then "exitcode : -9 (pid: …)".
    # Its "Root Cause" is whichever exit it noticed first, which can be a peer's "connection
    # reset"; a rank killed by a signal other than the SIGTERM torchrun sends peers is the cause.
    # A positive code with no error record is a rank that left by itself (os._exit): as silent as a signal.
    died = {int(r): int(c) for r, c in [*_EXIT_RE.findall(output), *_recorded_exits(outdir, last)]
            if int(c) != 0 and int(c) != -signal.SIGTERM}
    silent = sorted(r for r in died if r not in {e["rank"] for e in errors})
    if silent:
        # a signal's death first, then an exit, then SIGPIPE: a write to the socket of a peer that had gone (CI run B:
        # rank 1's os._exit(3) was blamed on rank 0, killed by the SIGPIPE of its next send to rank 1)
        r = min(silent, key=lambda r: (died[r] == -signal.SIGPIPE, died[r] > 0, r))
        return RankKilled(r, -died[r], output) if died[r] < 0 else RankExited(r, died[r], output)
    if errors:
        first = min(errors, key=lambda r: r["time"])
        # When several ranks fail the same way (an import error, say), name the lowest, not a race winner.
        e = min((r for r in errors if (r["type"], r["message"]) == (first["type"], first["message"])),
                key=lambda r: r["rank"])
        failure = RankFailure(e["rank"], e["type"], e["message"], e["traceback"], output)
        failure.env_changed = e.get("env_changed") or {}
        return failure
    missing = sorted(set(range(nprocs)) - done)
    tail = "\n".join(output.splitlines()[-5:])
    return LaunchError(
        f"torchrun exited with code {returncode}; ranks {missing} returned nothing. "
        f"Last lines:\n{tail}", output)


def _attempts(outdir: Path) -> tuple[list[dict], int]:
    """Every rank's recorded exception (``error-<rank>-<attempt>.json``, with its ``attempt``), and the job's
    last attempt: the latest the agent closed (:func:`_exit_files`), else the latest with an exception."""
    errors = []
    for p in outdir.glob("error-*.json"):
        try:
            errors.append({**json.loads(p.read_text()), "attempt": int(p.stem.rsplit("-", 1)[1])})
        except (OSError, ValueError, IndexError, TypeError):
            continue
    closed = [attempt for _, attempt in _exit_files(outdir)]
    last = max(closed) if closed else max((e["attempt"] for e in errors), default=0)
    return errors, last


def _exit_files(outdir: Path) -> list[tuple[Path, int]]:
    """The agents' ``exits-<pid>-<attempt>-<n>.json`` files, each with its torchrun attempt."""
    found = []
    for p in outdir.glob("exits-*.json"):
        try:
            found.append((p, int(p.stem.split("-")[2])))
        except (ValueError, IndexError):
            continue
    return found


def _recorded_exits(outdir: Path, attempt: int) -> list[tuple[str, int]]:
    """(rank, exit code) pairs of the job's attempt ``attempt``, as a warm launch's agent wrote them
    (:func:`distlab.runtime.agent.record_exits`)."""
    pairs = []
    for p, n in _exit_files(outdir):
        try:
            pairs += [(r, int(c)) for r, c in json.loads(p.read_text()).items()] if n == attempt else []
        except (OSError, ValueError):
            continue
    return pairs


_EXIT_RE = re.compile(r"rank\s*:\s*(\d+)[^\n]*\n\s*exitcode\s*:\s*(-?\d+)")


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return "unknown"
