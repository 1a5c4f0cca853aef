"""The warm launcher's server: torch imported once, every launch forked from it.

A fresh rank spends about 2 CPU-s importing torch and 2-3 more importing
``torch._dynamo`` (DDP's constructor does) before any learner code runs; on a
2-core machine that is most of a grading. This server imports them once;
:mod:`distlab.runtime.warm` asks it for a launch, and the launch is a ``fork``:

    launching process (a grading subprocess, a notebook kernel, pytest)
      └ reaper.py                       (started by distlab.runtime.warm; ends the server's tree last)
          └ server: python -m distlab.runtime.forkserver SOCKET   (this module; imports, forks, nothing else)
              └ job root, one per launch (:func:`job_root`: a child subreaper, the server's user)
                  └ agent: torchrun's own engine (:mod:`distlab.runtime.agent`), as the learner in the sandbox
                      └ ranks, forked by the agent (torchrun's ``--start-method=fork``)

Why not multiprocessing's forkserver under ``elastic_launch`` in the launching
process: then torchrun's agent would run in the launching process (the grader,
root in the grading image) and unpickle what the ranks put on its queues, so a
learner's rank could run code in the grader. Here the agent runs inside the
job, as the learner, exactly where the torchrun CLI's agent runs.

The guarantees, each held by one function below:

* the server never runs torch code and never initialises CUDA: ranks forked
  from it may then use CUDA (a CUDA context does not survive a fork);
* it answers only its own user (``SO_PEERCRED``) on a socket in a ``0700``
  folder, and no process of a job inherits that socket or any other of its
  descriptors;
* each launch is contained like a CLI launch under :mod:`distlab.runtime.reaper`: its
  job root is a child subreaper that ends every descendant, however detached,
  when the agent exits or the launcher says stop;
* it exits when the process that started it does (end of file on its stdin).
"""
from __future__ import annotations

import importlib
import json
import os
import select
import signal
import socket
import struct
import sys

from distlab.runtime import reaper

# What a rank imports before the learner's first line: torch, DDP (which imports torch._dynamo),
# c10d and torchrun's engine, and the distlab modules every job runs.
PRELOAD = ("torch", "torch._dynamo", "torch.distributed", "torch.nn.parallel", "torch.distributed.run",
           "torch.distributed.elastic.multiprocessing", "distlab.runtime.agent", "distlab.runtime.worker",
           "distlab.runtime.distributed")
HEADER = struct.Struct("!I")
MAX_REQUEST = 16 << 20


def recv_request(conn: socket.socket) -> tuple[dict, list[int]]:
    """One request: a length-prefixed JSON object, and the descriptors sent with it (SCM_RIGHTS)."""
    data, fds, _, _ = socket.recv_fds(conn, 65536, 4)
    if len(data) < HEADER.size:
        raise ValueError("short request")
    (size,) = HEADER.unpack_from(data)
    if size > MAX_REQUEST:
        raise ValueError("request too large")
    data = data[HEADER.size:]
    while len(data) < size:
        more = conn.recv(size - len(data))
        if not more:
            raise ValueError("truncated request")
        data += more
    return json.loads(data), fds


def send_event(conn: socket.socket, **event) -> None:
    """A job root tells its launcher what happened: one JSON line."""
    try:
        conn.sendall(json.dumps(event).encode() + b"\n")
    except OSError:
        pass  # the launcher has gone; the job is ended all the same


def same_user(conn: socket.socket) -> bool:
    """Only processes of the server's own user may ask it for a launch."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _, uid, _ = struct.unpack("3i", creds)
    return uid == os.geteuid()


def _close_fds_except(keep: set[int]) -> None:
    """Close every descriptor above stderr but ``keep``: a job inherits none of the server's."""
    for fd in map(int, os.listdir("/proc/self/fd")):
        if fd > 2 and fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass


def _wait_agent(conn: socket.socket, agent: int) -> tuple[int, float]:
    """Until the agent exits (its status) or the launcher says stop or goes away (SIGTERM's code)."""
    pidfd = os.pidfd_open(agent)
    while True:
        ready, _, _ = select.select([conn, pidfd], [], [])
        if pidfd in ready:
            _, status = os.waitpid(agent, 0)
            return os.waitstatus_to_exitcode(status), None
        if conn in ready and conn.recv(64) in (b"", b"stop\n", b"stop"):
            return -signal.SIGTERM, 0.2


def job_root(conn: socket.socket, out_fd: int, request: dict) -> int:
    """One launch, in the server's forked child: start the agent, wait, end what is left, report.

    Like :func:`distlab.runtime.reaper.main`: a child subreaper (a rank that double-forks and
    ``setsid``\\ s is re-parented here, not to init), the agent as the learner when the
    request names one, and on exit or stop a sweep of every descendant.
    """
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.dup2(out_fd, 1)
    os.dup2(out_fd, 2)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    _close_fds_except({conn.fileno()})
    reaper.prctl(reaper.PR_SET_CHILD_SUBREAPER, 1)
    agent = os.fork()
    if agent == 0:  # pragma: no cover - the agent's process
        conn.close()
        code = 1
        try:
            from distlab.runtime import agent as job

            code = job.run_module(request) if "module" in request else job.run(request)
        finally:
            os._exit(code)
    send_event(conn, event="started", pid=agent)
    code, grace = _wait_agent(conn, agent)
    left = reaper.sweep(grace if grace is not None else float(request.get("grace_s", 1.0)))
    if left:
        os.write(2, f"distlab: ended {len(left)} process(es) the job left running: "
                    f"{', '.join(sorted(set(left)))}\n".encode())
    times = os.times()  # the agent's and every rank's CPU time: they were all waited for, here or below
    send_event(conn, event="exit", code=code if code >= 0 else 128 - code,
               cpu_s=round(times.children_user + times.children_system, 3))
    return 0


def _fork_job(listener: socket.socket, conn: socket.socket) -> int | None:
    """Receive one request and fork its job root (its pid); a bad request only closes its connection."""
    try:
        if not same_user(conn):
            return None
        request, fds = recv_request(conn)
        if len(fds) != 1:
            raise ValueError("a request sends exactly one descriptor, the output pipe")
    except (OSError, ValueError) as exc:
        send_event(conn, event="refused", why=str(exc))
        return None
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the job root
        code = 1
        try:
            listener.close()
            code = job_root(conn, fds[0], request)
        finally:
            os._exit(code)
    os.close(fds[0])
    return pid


def _reap(jobs: dict[int, socket.socket]) -> None:
    """Collect ended job roots, then close their connections: the launcher's end of file means the
    job root is gone, not only finished."""
    for pid in reaper.reap():
        conn = jobs.pop(pid, None)
        if conn is not None:
            conn.close()


def serve(path: str) -> None:
    """Import :data:`PRELOAD`, say ``ready``, then fork a job root per connection until stdin closes."""
    for name in PRELOAD:
        importlib.import_module(name)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(128)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)  # SIGCHLD wakes the select below: job roots are reaped at once
    signal.signal(signal.SIGCHLD, lambda *_: None)
    jobs: dict[int, socket.socket] = {}
    print(f"ready {os.getpid()}", flush=True)
    while True:
        ready, _, _ = select.select([listener, sys.stdin, wake_r], [], [])
        if wake_r in ready:
            os.read(wake_r, 4096)
        _reap(jobs)
        if sys.stdin in ready and not os.read(sys.stdin.fileno(), 64):
            break  # the launching process has gone
        if listener in ready:
            conn, _ = listener.accept()
            pid = _fork_job(listener, conn)
            if pid is None:
                conn.close()
            else:
                jobs[pid] = conn
    listener.close()
    os.unlink(path)
    # The job roots stop their jobs on end of file from their launchers; the reaper above us ends
    # whatever is left when we exit.


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in a notebook interrupts the cell, not us
    serve(sys.argv[1])
