"""Ending a torchrun job so that nothing of it survives.

torchrun starts every worker with ``start_new_session=True``, so neither a
SIGKILL of torchrun nor ``killpg`` of its process group reaches the workers:
they are orphaned, keep our pipes open, and ``communicate()`` hangs. We
therefore (1) snapshot torchrun's descendants before signalling anything,
(2) SIGTERM torchrun and every worker at once, (3) SIGKILL whatever is still
alive after a short grace period, and (4) sweep the whole process table for
the job's tag (an environment variable every process of the job inherits),
which also catches workers started after the snapshot (elastic restarts) and
anything a learner's code spawned.
"""
from __future__ import annotations

import os
import signal
import subprocess

import psutil

JOB_TAG_VAR = "DISTLAB_JOB_ID"


def tag_env(job_id: str, env: dict[str, str]) -> dict[str, str]:
    """``env`` with ``job_id`` added to its job tags (a job started inside another keeps both)."""
    tags = [t for t in env.get(JOB_TAG_VAR, "").split(":") if t]
    return {**env, JOB_TAG_VAR: ":".join([*tags, job_id])}


def tagged_processes(job_id: str) -> list[psutil.Process]:
    """Every live process whose environment carries ``job_id`` among its ``DISTLAB_JOB_ID`` tags."""
    found = []
    me = os.getpid()
    for proc in psutil.process_iter(["pid"]):
        if proc.pid == me:
            continue
        try:
            if job_id in proc.environ().get(JOB_TAG_VAR, "").split(":"):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
    return found


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def end_job(popen: subprocess.Popen, job_id: str, grace_s: float = 3.0) -> int:
    """End torchrun (``popen``) and every process of the job; return how many were signalled.

    Safe to call on a job that already finished: it then only sweeps.
    """
    try:
        root = psutil.Process(popen.pid)
        victims = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        victims = []
    victims += [p for p in tagged_processes(job_id) if p not in victims]
    victims = _alive(victims)
    for p in victims:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    _, still = psutil.wait_procs(victims, timeout=grace_s)
    # Anything that ignored SIGTERM, or was started while we waited, is killed outright.
    still = _alive(still + [p for p in tagged_processes(job_id) if p not in still])
    for p in still:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(still, timeout=grace_s)
    try:
        popen.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:  # pragma: no cover - torchrun itself was killed above
        pass
    return len(victims)
