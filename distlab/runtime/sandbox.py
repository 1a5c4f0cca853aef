"""Who runs a learner's code, and under which limits.

Two situations, told apart by one setting:

* **A learner grading their own work** (a laptop, JupyterLab): everything runs
  as that learner. Grading is a self-check; the process tree is still
  contained (:mod:`distlab.runtime.reaper`), but nothing is hidden from a user who
  owns every process.
* **The grading image** (``docker/grade.sh``, or any grader run as root with
  ``DISTLAB_STUDENT_USER`` set): every process that executes a learner's code
  (the torchrun ranks, the notebook kernel) runs as that unprivileged user,
  with no new privileges and the rlimits of :func:`learner_rlimits`, under a
  reaper that stays root, so the learner can neither escape nor kill it. The
  verdict is computed, and the report written, by a root process that never
  imported the learner's code, in a directory the learner user cannot read.
"""
from __future__ import annotations

import functools
import os
import pwd
import resource
import subprocess
import sys

STUDENT_USER_VAR = "DISTLAB_STUDENT_USER"
MAX_PROCS_VAR = "DISTLAB_STUDENT_MAX_PROCS"
MAX_FILES_VAR = "DISTLAB_STUDENT_MAX_FILES"
MAX_MEMORY_VAR = "DISTLAB_STUDENT_MAX_MEMORY"
PREFLIGHT_VAR = "DISTLAB_SANDBOX_CHECKED"


class SandboxError(RuntimeError):
    """The sandbox was asked for but cannot be set up (one line says why)."""


def learner_user() -> str | None:
    """The user learners' code runs as, or None to run it as ourselves.

    Set when this process is root and ``DISTLAB_STUDENT_USER`` names a user
    (the grading image sets ``student``). A non-root process cannot switch
    users, so there the variable is ignored: the learner grades as themselves.
    """
    name = os.environ.get(STUDENT_USER_VAR, "").strip()
    if not name or os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise SandboxError(f"{STUDENT_USER_VAR}={name}: no such user (the grader image creates 'student')") \
            from None
    if entry.pw_uid == 0:
        raise SandboxError(f"{STUDENT_USER_VAR}={name} is root: learners' code needs an unprivileged user")
    return name


def _int_env(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        raise SandboxError(f"{name}={os.environ[name]!r} is not a whole number") from None


def _default_memory() -> int | None:
    """Address space per learner process: a quarter of the machine's memory, at least 4 GiB.

    None where CUDA may be used: the CUDA driver reserves far more address space
    than it ever touches, so RLIMIT_AS would break it; there the container's
    memory limit (``docker/compose.yaml``) is the bound.
    """
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) != "" and os.path.exists("/dev/nvidia0"):
        return None
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return max(4 << 30, total // 4)


def learner_rlimits() -> dict[int, int]:
    """The rlimits every learner process gets in the sandbox: ``{resource: soft=hard limit}``.

    RLIMIT_NPROC counts every process of the learner user (a fork bomb stops
    there); RLIMIT_CORE 0 (no core files of a crashed rank fill the disk);
    RLIMIT_NOFILE; RLIMIT_AS per process (see :func:`_default_memory`).
    """
    limits = {
        resource.RLIMIT_NPROC: _int_env(MAX_PROCS_VAR, 512),
        resource.RLIMIT_NOFILE: _int_env(MAX_FILES_VAR, 4096),
        resource.RLIMIT_CORE: 0,
    }
    memory = _int_env(MAX_MEMORY_VAR, 0) or _default_memory()
    if memory:
        limits[resource.RLIMIT_AS] = memory
    return limits


def status() -> dict:
    """What a self-test reports: are we root, and is the learner sandbox active (as which user)?"""
    try:
        user, problem = learner_user(), None
    except SandboxError as exc:
        user, problem = None, str(exc)
    return {"root": os.geteuid() == 0, "learner_user": user, "sandboxed": user is not None,
            "problem": problem}


SCRATCH_VAR = "DISTLAB_SCRATCH"


def hand_over(path: str | os.PathLike, user: str) -> None:
    """Give the tree at ``path`` to ``user`` (symbolic links are changed, never followed)."""
    entry = pwd.getpwnam(user)
    os.chown(path, entry.pw_uid, entry.pw_gid, follow_symlinks=False)
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            try:
                os.chown(os.path.join(root, name), entry.pw_uid, entry.pw_gid, follow_symlinks=False)
            except FileNotFoundError:  # a file the job removed meanwhile
                pass


@functools.lru_cache(maxsize=None)
def preflight(python: str = sys.executable) -> None:
    """In the sandbox, check once that the learner user can run ``python`` with this repo.

    A venv or checkout under a folder the learner cannot enter (``/root``) would otherwise make
    every rank fail to start, and every exercise score 0 with a puzzling launch error.
    """
    user = learner_user()
    if user is None or os.environ.get(PREFLIGHT_VAR) == f"{user}:{python}":
        return  # not sandboxed, or checked already by the process that started this one
    from distlab.runtime.importing import with_repo_on_path
    from distlab.runtime.process import reaper_command

    done = subprocess.run(reaper_command([python, "-c", "import torch, distlab.runtime.launch"], user=user),
                          env={**os.environ, "PYTHONPATH": with_repo_on_path(os.environ)}, cwd="/",
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise SandboxError(f"the learner user '{user}' cannot run {python} with this checkout ({why}): "
                           "use an interpreter and a checkout it can read (the grading image's /opt/venv "
                           "and /opt/distlab)")
    os.environ[PREFLIGHT_VAR] = f"{user}:{python}"  # the grading subprocesses inherit it


def learner_sandbox(job_dir: str | os.PathLike) -> dict:
    """What :func:`distlab.runtime.process.run_contained` needs to run a job as the learner user: ``{}`` outside
    the sandbox; else ``user`` and ``rlimits``, after handing the learner the job's directory and the
    grading scratch directory (``DISTLAB_SCRATCH``: where the grader's temporary folders for the ranks
    live; the reports are elsewhere)."""
    user = learner_user()
    if user is None:
        return {}
    preflight()
    hand_over(job_dir, user)
    scratch = os.environ.get(SCRATCH_VAR)
    if scratch and os.path.isdir(scratch):
        hand_over(scratch, user)
    return {"user": user, "rlimits": learner_rlimits()}
