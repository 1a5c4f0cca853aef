"""Warm launches: torchrun's agent and ranks forked from a server that imported torch once.

:func:`run` runs ``torchrun ARGV`` with :mod:`distlab.runtime.worker` as the
program (or, :func:`run_module`, ``python -m MODULE``), through the process's :class:`ForkServer` (see
:mod:`distlab.runtime.forkserver` for the process tree and its guarantees) and returns
the same :class:`~distlab.runtime.process.Finished` as the torchrun CLI's path under
:func:`~distlab.runtime.process.run_contained`: the output streamed line by line, the
wall-clock limit, and nothing of the job left when it returns.

The server lives as long as the process that started it: a grading
subprocess, a notebook kernel, a pytest session. A process started by one that
has a server (the grader's per-exercise grading processes, themselves forked from it by
:func:`run_module`) uses its parent's, named by ``DISTLAB_FORKSERVER``. Where no
server can run (``DISTLAB_LAUNCH=cli``, a platform without ``fork`` or ``pidfd_open``, a server
that failed to start) the launcher uses the torchrun CLI, and says so once.
"""
from __future__ import annotations

import atexit
import json
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import Callable

from distlab.runtime.forkserver import HEADER
from distlab.runtime.importing import REPO_ROOT, with_repo_on_path
from distlab.runtime.process import (JOB_TAG_VAR, Finished, follow, kill_tagged, reaper_command, run_contained, tag_env,
                                    time_scale)

SERVER_VAR = "DISTLAB_FORKSERVER"
LAUNCH_VAR = "DISTLAB_LAUNCH"
START_TIMEOUT = 300.0  # seconds for the server to import torch, on a loaded machine
# Read once, when an interpreter or torch starts, and not read again by distlab.runtime.agent: a job that sets
# one of these differently from the server's environment is launched with the CLI.
STARTUP_VARS = ("TORCH_CPP_LOG_LEVEL", "TORCH_LOGS", "PYTHONHASHSEED", "PYTHONMALLOC", "PYTHONWARNINGS",
                "PYTHONDEVMODE", "PYTHONFAULTHANDLER", "LD_PRELOAD", "PYTORCH_NVML_BASED_CUDA_CHECK")
# (LD_LIBRARY_PATH is not among them: a fork keeps the libraries already loaded, and what the job
# starts or loads later sees the job's value, as it would.)


class ServerUnavailable(RuntimeError):
    """No warm server here; the message says why (one line)."""


class ForkServer:
    """One :mod:`distlab.runtime.forkserver` process, started under the reaper, and the socket it listens on."""

    def __init__(self, path: str, proc: subprocess.Popen | None = None, folder: str | None = None,
                 env: dict[str, str] | None = None):
        self.path, self.proc, self.folder = path, proc, folder
        self.env = os.environ if env is None else env  # what the server's interpreter started with
        self.pid = None

    def serves(self, env: dict[str, str]) -> bool:
        """Whether a job with environment ``env`` sees the same start-up settings as the server had."""
        return all(env.get(k) == self.env.get(k) for k in STARTUP_VARS)

    @classmethod
    def start(cls) -> "ForkServer":
        folder = tempfile.mkdtemp(prefix="distlab-forkserver-", dir=_TMP)  # 0700: only our user reaches the socket
        path = os.path.join(folder, "socket")
        env = {k: v for k, v in os.environ.items() if k not in (SERVER_VAR, JOB_TAG_VAR)}
        env.update(PYTHONPATH=with_repo_on_path(env), OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"))
        proc = subprocess.Popen(reaper_command([sys.executable, "-m", "distlab.runtime.forkserver", path]),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=REPO_ROOT,
                                start_new_session=True)
        server = cls(path, proc, folder, env)
        ready, _, _ = select.select([proc.stdout], [], [], START_TIMEOUT * time_scale())
        line = proc.stdout.readline().decode(errors="replace").split() if ready else []
        if line[:1] != ["ready"]:
            server.close()
            raise ServerUnavailable("the warm launch server did not start" +
                                    (f" (exit code {proc.returncode})" if proc.poll() is not None else ""))
        server.pid = int(line[1])
        return server

    def close(self) -> None:
        """End the server (its stdin closes; the reaper ends what is left) and remove its folder."""
        if self.proc is not None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
            self.proc = None
        if self.folder:
            shutil.rmtree(self.folder, ignore_errors=True)

    def pids(self) -> set[int]:
        """The server's processes (the reaper and the server), which outlive every launch."""
        return {p for p in (self.pid, self.proc.pid if self.proc else None) if p}

    def connect(self, request: dict, out_fd: int) -> socket.socket:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(self.path)
            body = json.dumps(request).encode()
            socket.send_fds(conn, [HEADER.pack(len(body)) + body[:60000]], [out_fd])
            conn.sendall(body[60000:])
        except OSError as exc:
            conn.close()
            raise ServerUnavailable(f"the warm launch server does not answer ({exc})") from None
        return conn


class _Events:
    """The job root's JSON lines on the connection: ``started``, then ``exit`` with the code."""

    def __init__(self, conn: socket.socket):
        self.conn, self.buffer, self.code, self.gone = conn, b"", None, False
        self.cpu_s: float | None = None

    def exited(self) -> bool:
        while not self.gone and select.select([self.conn], [], [], 0)[0]:
            try:
                data = self.conn.recv(4096)
            except OSError:  # the job root was killed: no report will come
                data = b""
            if not data:
                self.gone = True
            self.buffer += data
            *events, self.buffer = self.buffer.split(b"\n")
            for event in map(json.loads, events):
                if event.get("event") == "exit":
                    self.code, self.cpu_s = event["code"], event.get("cpu_s")
                elif event.get("event") == "refused":
                    self.gone = True
        return self.code is not None or self.gone

    def stop(self) -> None:
        try:
            self.conn.sendall(b"stop\n")
        except OSError:
            pass

    def wait(self, timeout: float) -> None:
        """Until the job root has reported and is gone (the server closes our connection once it has
        collected the job root), at most ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.exited()
            if self.gone:
                return
            select.select([self.conn], [], [], 0.05)


def run(request: dict, cold: list[str], *, timeout: float, env: dict[str, str],
        cwd: str | os.PathLike | None = None, on_line: Callable[[str], None] | None = None,
        user: str | None = None, rlimits: dict[int, int] | None = None, grace_s: float = 1.0,
        should_stop: Callable[[float], bool] | None = None) -> Finished:
    """The job ``request`` names (``argv`` and ``spec``: torchrun's agent; ``module`` and ``args``: ``python -m``)
    forked from the warm server where this process can have one serving ``env``; otherwise ``cold``, the same
    job as a new interpreter under :func:`~distlab.runtime.process.run_contained`. Contained either way, at most
    ``timeout`` s (or until ``should_stop(elapsed_s)``), as ``user`` under ``rlimits`` where given (root)."""
    if available(env):
        try:
            return _job({**request, "user": user, "rlimits": {str(k): v for k, v in (rlimits or {}).items()}},
                        timeout=timeout, env=env, cwd=cwd, on_line=on_line, grace_s=grace_s, should_stop=should_stop)
        except ServerUnavailable as exc:
            forget(str(exc))
    return run_contained(cold, timeout=timeout, env=env, cwd=cwd, on_line=on_line, user=user, rlimits=rlimits,
                         grace_s=grace_s, should_stop=should_stop)


def run_module(module: str, args: list[str], **kwargs) -> Finished:
    """``python -m MODULE ARGS`` as :func:`run` runs a job (torch already imported where it is forked: it starts
    in milliseconds), as this process's user. For the grader's own processes, which never run a learner's code."""
    return run({"module": module, "args": list(args)}, [sys.executable, "-m", module, *args], **kwargs)


def _job(request: dict, *, timeout: float, env: dict[str, str], cwd: str | os.PathLike | None,
         on_line: Callable[[str], None] | None, grace_s: float,
         should_stop: Callable[[float], bool] | None = None) -> Finished:
    """One job of the server (``request`` says what its first process runs), its output followed, its end awaited."""
    should_stop = should_stop or (lambda elapsed: elapsed > timeout)
    server = get()
    job_id = uuid.uuid4().hex
    request = {**request, "env": tag_env(job_id, dict(env)), "cwd": str(cwd or os.getcwd()), "grace_s": grace_s}
    read_fd, write_fd = os.pipe()
    start = time.monotonic()
    try:
        conn = server.connect(request, write_fd)
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    events = _Events(conn)
    with conn, os.fdopen(read_fd, "rb") as stream:
        try:
            timed_out, lines = follow(stream, should_stop=should_stop, start=start, on_line=on_line,
                                      grace_s=grace_s, exited=events.exited, stop=events.stop)
            events.wait(grace_s + 30)  # the job root sweeps, then reports
        finally:
            if events.code is None:
                events.stop()
            kill_tagged(job_id)
    code = events.code if events.code is not None else 1
    return Finished(code, timed_out, lines, time.monotonic() - start, events.cpu_s)


_TMP = tempfile.gettempdir()  # the server outlives a job's or a test's temp folder
_lock = threading.Lock()
_server: ForkServer | None = None
_failed: str | None = None  # why the server could not start here: not tried again
_announced = False


def _announce(why: str) -> None:
    global _announced
    if not _announced:
        _announced = True
        print(f"distlab: launching with the torchrun CLI ({why})", file=sys.stderr, flush=True)


def _identity() -> list[str]:
    """What a server's forks carry over: the interpreter, the checkout, the user."""
    return [sys.executable, str(REPO_ROOT), str(os.geteuid())]


def _inherited() -> str | None:
    """The socket of the parent's server (``DISTLAB_FORKSERVER``), if it forks what this process would
    run: the same interpreter, checkout and user (a grader run from another venv starts its own)."""
    path, *identity = os.environ.get(SERVER_VAR, "").split(os.pathsep)
    return path if path and identity == _identity() and os.path.exists(path) else None


def get() -> ForkServer:
    """This process's server: the parent's (``DISTLAB_FORKSERVER``), or one started now."""
    global _server, _failed
    with _lock:
        if _failed:
            raise ServerUnavailable(_failed)
        if _server is None:
            inherited = _inherited()
            if inherited:
                _server = ForkServer(inherited)
            else:
                try:
                    _server = ForkServer.start()
                except (ServerUnavailable, OSError) as exc:
                    _failed = str(exc)
                    raise ServerUnavailable(_failed) from None
                os.environ[SERVER_VAR] = os.pathsep.join([_server.path, *_identity()])
                atexit.register(shutdown)
        return _server


def shutdown() -> None:
    """End the server this process started (at exit; also for tests)."""
    global _server
    with _lock:
        if _server is not None and _server.proc is not None:
            _server.close()
            if os.environ.get(SERVER_VAR, "").split(os.pathsep)[0] == _server.path:
                del os.environ[SERVER_VAR]
        _server = None


def available(env: dict[str, str] | None = None) -> bool:
    """Whether launches here (of a job with environment ``env``) go through the warm server; if not,
    say why once (the CLI path)."""
    if os.environ.get(LAUNCH_VAR, "").lower() == "cli":
        _announce(f"{LAUNCH_VAR}=cli")
        return False
    if not hasattr(os, "fork") or not hasattr(os, "pidfd_open") or not sys.platform.startswith("linux"):
        _announce("warm launches need Linux's fork and pidfd_open")
        return False
    try:
        server = get()
    except (ServerUnavailable, OSError) as exc:
        _announce(str(exc))
        return False
    return env is None or server.serves(env)


def path_in_use() -> str:
    """``"warm"`` or ``"cli"``: what :func:`distlab.torchrun` uses in this process (the self-test says it)."""
    return "warm" if available() else "cli"


def forget(why: str) -> None:
    """A server that stopped answering: launch with the CLI from now on, and say so once."""
    global _server, _failed
    with _lock:
        _server, _failed = None, why
    _announce(why)


def server_pids() -> set[int]:
    """The processes of the server this process started (none if it has none): they outlive launches."""
    with _lock:
        return _server.pids() if _server is not None and _server.proc is not None else set()


class cli_launches:
    """``with warm.cli_launches():`` launches in this block use the torchrun CLI (for side-by-side
    measurements of both paths in one run)."""

    def __enter__(self):
        self.before = os.environ.get(LAUNCH_VAR)
        os.environ[LAUNCH_VAR] = "cli"

    def __exit__(self, *exc):
        if self.before is None:
            os.environ.pop(LAUNCH_VAR, None)
        else:
            os.environ[LAUNCH_VAR] = self.before


def server_cpu_s() -> float:
    """CPU seconds spent so far by this process's server and every job it has forked and collected."""
    import psutil

    with _lock:
        pid = _server.pid if _server is not None and _server.proc is not None else None
    if pid is None:
        return 0.0
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system + t.children_user + t.children_system
