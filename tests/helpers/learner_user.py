"""A real unprivileged learner user, and an interpreter and repo that user can read, for the root tests.

The grading image runs learners' code as the user ``student``; these tests
do the same outside Docker. They need root (to create the user and switch
to it) and are skipped with that reason otherwise. The user is dedicated to
the tests (``distlab-learner``): they end every process of it, which is only
safe for a user nobody else runs as.

A venv under a folder the user cannot enter (``/root``, pytest's
``/tmp/pytest-of-root``) is no use to it, so :func:`readable_install`
checks, and otherwise makes a copy the user can read: the repo's files, and
the venv hard-linked (no bytes copied) into a world-readable temp folder.
"""
from __future__ import annotations

import atexit
import functools
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

from distlab.runtime.process import reaper_command
from tests.helpers import REPO

LEARNER = "distlab-learner"


def learner_user() -> str:
    """The dedicated learner user, created if missing; skips the test when not root."""
    if os.geteuid() != 0:
        pytest.skip("needs root: switching to an unprivileged learner user is what the grading image does as root")
    try:
        pwd.getpwnam(LEARNER)
    except KeyError:
        if not shutil.which("useradd"):
            pytest.skip("useradd is not installed: cannot create the learner user")
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", LEARNER],
                       check=True, capture_output=True, timeout=60)
    return LEARNER


def as_learner(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    """Run ``cmd`` as the learner the way the grader does (through the reaper)."""
    return subprocess.run(reaper_command(cmd, user=LEARNER), capture_output=True, text=True, timeout=120,
                          **kwargs)


def _usable(python: str, repo: Path,
            modules: str = "torch, nbgrader, distlab.runtime.launch, autograder.grader.supervise") -> bool:
    probe = as_learner([python, "-c", f"import {modules}"], cwd="/", env={**os.environ, "PYTHONPATH": str(repo)})
    return probe.returncode == 0


def _base_interpreter(made: Path) -> str | None:
    """An interpreter of this Python the learner can run: the venv's base if readable, else a
    hard-linked copy of the base installation in ``made`` (its ``libpython`` found through
    ``LD_LIBRARY_PATH``, which ``RUNPATH`` yields to)."""
    base = Path(sys.base_prefix)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    candidate = base / "bin" / version
    if as_learner([str(candidate), "-c", "import json"], cwd="/").returncode == 0:
        return str(candidate)
    subprocess.run(["cp", "-al", str(base), str(made / "base")], check=True, timeout=600)
    os.environ["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(made / "base" / "lib"),
                                                                 os.environ.get("LD_LIBRARY_PATH")]))
    candidate = made / "base" / "bin" / version
    return str(candidate) if as_learner([str(candidate), "-c", "import json"], cwd="/").returncode == 0 else None


def _readable(path: Path) -> bool:
    return as_learner(["test", "-r", str(path), "-a", "-x", str(path)], cwd="/").returncode == 0


@functools.lru_cache(maxsize=1)
def readable_install() -> tuple[str, Path]:
    """``(python, repo)``: an interpreter and repo the learner can use (made once per test session,
    and removed when it ends).

    Otherwise: a venv made from this venv's base interpreter (or a hard-linked copy of it that the
    learner can run), seeing this venv's site-packages (hard-linked into a readable folder if they are not readable),
    with this venv's console scripts (nbgrader runs ``alembic`` from PATH), and the repo copied.
    """
    if _usable(sys.executable, REPO):
        return sys.executable, REPO
    made = world_readable_dir("distlab-readable-")
    atexit.register(shutil.rmtree, made, ignore_errors=True)
    base = _base_interpreter(made)
    if base is None:
        pytest.skip(f"no copy of {sys.base_prefix} that the learner user can run")
    subprocess.run([base, "-m", "venv", "--without-pip", str(made / "venv")], check=True, timeout=120)
    python = made / "venv" / "bin" / "python"
    site = Path(sysconfig_purelib())
    if not _readable(site):
        _share(site, made / "site-packages")
        site = made / "site-packages"
    target = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 capture_output=True, text=True, check=True).stdout.strip())
    (target / "distlab-tests.pth").write_text(f"{site}\n")
    _share(Path(sys.prefix, "share", "jupyter"), made / "venv" / "share" / "jupyter")  # nbconvert's templates
    for script in Path(sys.prefix, "bin").iterdir():
        head = script.read_bytes()[:200] if script.is_file() else b""
        shebang = head.startswith(b"#!") and b"python" in head.split(b"\n")[0]
        if shebang and not (made / "venv/bin" / script.name).exists():
            rest = script.read_text().split("\n", 1)[1]
            (made / "venv/bin" / script.name).write_text(f"#!{python}\n{rest}")
            (made / "venv/bin" / script.name).chmod(0o755)
    repo = REPO if _readable(REPO) else made / "repo"
    if repo != REPO:
        shutil.copytree(REPO, repo, ignore=shutil.ignore_patterns(".venv", ".git", "__pycache__", "*.ipynb"))
    if not _usable(str(python), repo):
        pytest.skip("cannot make an interpreter with this venv's packages that the learner user can run")
    return str(python), repo


def _share(source: Path, target: Path) -> None:
    """``target`` shows ``source``: a link where the learner can read it, else a hard-linked copy."""
    if not source.is_dir():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    if _readable(source):
        target.symlink_to(source)
    else:
        subprocess.run(["cp", "-al", str(source), str(target)], check=True, timeout=600)


def sysconfig_purelib() -> str:
    import sysconfig

    return sysconfig.get_paths()["purelib"]


def world_readable_dir(prefix: str) -> Path:
    """A new folder under the system's temp folder, which the learner user can enter and read."""
    d = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    d.chmod(0o755)
    return d


def learner_processes() -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["username", "status"]):
        if p.info["username"] == LEARNER and p.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(p)
    return found
