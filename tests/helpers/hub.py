"""The class's JupyterHub (docker/hub/) as a test runs it: the project's own scripts, with a folder, users and
ports of the test's own, torn down whatever happens (tests/tiers/test_hub.py says what is tested).

What a test needs that the machine must already have: root (PAM, users, servers as those users), and the
hub installed by ``docker/hub/install.sh`` for this checkout's pins (.ci/prepare-tiers.sh runs it; the first
time takes minutes, so a test does not). Without either the test skips with the reason, and fails instead
under ``DISTLAB_REQUIRE_HUB=1``. The test re-runs install.sh, which then only copies the code afresh, so it
serves this checkout.

Users: ``dlhub-alice`` and ``dlhub-bob`` (learners) and ``dlhub-teacher`` (the instructor), with the
passwords add-users.sh makes and prints; removed, homes included, when the test ends, and first, if a
killed run left them.
Everything else lives under one folder in /tmp (the course, the exchange, the hub's state), removed at
the end. Ports: free ones, chosen when the hub starts (the proxy cannot take port 0 itself).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from distlab.runtime.launch import time_scale
from tests.helpers import REPO

HUB = REPO / "docker" / "hub"
PREFIX = Path(os.environ.get("DISTLAB_HUB_PREFIX", "/opt/distlab-hub"))
LEARNERS = ("dlhub-alice", "dlhub-bob")
INSTRUCTOR = "dlhub-teacher"
USERS = (*LEARNERS, INSTRUCTOR)
MAX_KB = 1000  # the submission size limit the tests run with (kB of 1000 bytes)


def missing() -> str | None:
    """Why the hub cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root: PAM, local users, and each learner's server as that user"
    for tool in ("useradd", "userdel", "runuser", "node", "npm"):
        if shutil.which(tool) is None:
            return f"{tool} is missing"
    digest = subprocess.run(f"cat {REPO / 'requirements.txt'} {HUB / 'requirements.txt'} | cksum", shell=True,
                            capture_output=True, text=True, check=True).stdout.split()[0]
    if not (PREFIX / "venv" / f".installed-{digest}").exists():
        return f"no hub installed in {PREFIX} for these pins: run docker/hub/install.sh (.ci/prepare-tiers.sh does)"
    if not (PREFIX / "node/node_modules/.bin/configurable-http-proxy").exists():
        return f"no configurable-http-proxy in {PREFIX}/node: run docker/hub/install.sh"
    return None


def require() -> None:
    why = missing()
    if why:
        if os.environ.get("DISTLAB_REQUIRE_HUB") == "1":
            pytest.fail(f"DISTLAB_REQUIRE_HUB=1 but the hub cannot run here: {why}")
        pytest.skip(why)


def poll(condition, timeout: float = 30.0, interval: float = 0.1):
    """``condition()`` until truthy or ``timeout`` s (times ``DISTLAB_TIME_SCALE``); its last value (rule 4 of
    tests/conftest.py: a bounded poll, not a sleep; for module-scoped fixtures, which cannot take ``wait_for``)."""
    deadline = time.monotonic() + timeout * time_scale()
    while True:
        value = condition()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, headers: dict | None = None) -> tuple[int, bytes]:
    """``(status, body)`` of a GET (any status; 0 when nothing answers)."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (urllib.error.URLError, OSError):
        return 0, b""


@dataclass
class Hub:
    root: Path
    env: dict
    passwords: dict
    log: Path
    process: subprocess.Popen | None = None
    base: str = ""
    timings: dict = field(default_factory=dict)

    @property
    def course(self) -> Path:
        return Path(self.env["DISTLAB_HUB_COURSE"])

    @property
    def exchange(self) -> Path:
        return Path(self.env["DISTLAB_EXCHANGE"]) / "distlab"

    def script(self, name: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        """Run docker/hub/NAME as an administrator would (root), with this hub's settings; it must succeed."""
        done = subprocess.run([str(HUB / name), *args], env=self.env, capture_output=True, text=True,
                              timeout=timeout * time_scale(), stdin=subprocess.DEVNULL)
        assert done.returncode == 0, f"docker/hub/{name} {' '.join(args)}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        return done

    def make(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
        """``make ARGS`` in the repository, as the README's "Running a class" runs it; it must succeed."""
        done = subprocess.run(["make", "--no-print-directory", *args], cwd=REPO, env=self.env, capture_output=True,
                              text=True, timeout=timeout * time_scale(), stdin=subprocess.DEVNULL)
        assert done.returncode == 0, f"make {' '.join(args)}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        return done

    def as_user(self, user: str, command: str) -> subprocess.CompletedProcess:
        """``sh -c COMMAND`` as ``user``, as the learner's terminal would run it (the attempts of the tests)."""
        return subprocess.run(["runuser", "-u", user, "--", "env", "-i", "PATH=/usr/bin:/bin", "sh", "-c", command],
                              capture_output=True, text=True, timeout=60, cwd="/", stdin=subprocess.DEVNULL)

    def server_pid(self, user: str) -> int:
        import psutil

        for p in psutil.process_iter(["username", "cmdline"]):
            if p.info["username"] == user and any("jupyterhub-singleuser" in a for a in p.info["cmdline"] or []):
                return p.pid
        raise AssertionError(f"no server of {user} is running")

    def server_token(self, user: str) -> str:
        """The API token the hub gave ``user``'s server (what any code of that user's can read)."""
        environ = Path(f"/proc/{self.server_pid(user)}/environ").read_bytes().split(b"\0")
        return next(e.split(b"=", 1)[1].decode() for e in environ if e.startswith(b"JUPYTERHUB_API_TOKEN="))

    def submissions(self, user: str) -> list[Path]:
        """``user``'s entries in inbound, oldest first by their (sealed) time."""
        inbound = self.exchange / "inbound"
        return sorted((p for p in inbound.iterdir() if p.name.startswith(f"{user}+")),
                      key=lambda p: p.name.split("+")[2]) if inbound.is_dir() else []

    def gradebook(self, assignment: str) -> dict[str, dict]:
        """``{learner: {"score", "timestamp", "late_s"}}`` from the course's gradebook, as nbgrader reads it."""
        from nbgrader.api import Gradebook

        with Gradebook(f"sqlite:///{self.course / 'gradebook.db'}", "distlab") as gb:
            subs = {learner: gb.find_submission(assignment, learner) for learner in LEARNERS}
            return {learner: {"score": s.score, "timestamp": s.timestamp, "late_s": s.total_seconds_late}
                    for learner, s in subs.items()}

    def sealed(self, user: str, count: int) -> bool:
        teacher = _uid(INSTRUCTOR)
        found = self.submissions(user)
        return len(found) == count and all(p.stat().st_uid == teacher for p in found)


def _uid(name: str) -> int:
    import pwd

    return pwd.getpwnam(name).pw_uid


def remove_users() -> None:
    """The test's users, their processes and their homes (a run killed halfway leaves them)."""
    import psutil

    for user in USERS:
        for p in psutil.process_iter(["username"]):
            if p.info["username"] == user:
                with contextlib.suppress(psutil.Error):
                    p.kill()
        subprocess.run(["userdel", "--remove", "--force", user], capture_output=True, timeout=60)


@contextlib.contextmanager
def class_hub(spawner: str = "local", env_extra: dict | None = None):
    """The README's "Running a class", with the test's users, folders and ports: ``make hub SPAWNER=spawner``
    (install, which copies this checkout's code, then serve; ``env_extra`` added to its environment),
    ``docker/hub/add-users.sh`` for the instructor and the learners, ``make hub-class STEP=release EX=1``;
    yield a :class:`Hub`; stop the hub and remove everything."""
    remove_users()
    root = Path(tempfile.mkdtemp(prefix="distlab-hub-", dir="/tmp"))
    root.chmod(0o755)  # the instructor and the learners reach the course and the exchange below it
    port = str(free_port())
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    env.update({"DISTLAB_HUB_API_PORT": str(free_port()), "DISTLAB_HUB_PROXY_API_PORT": str(free_port()),
                "DISTLAB_HUB_PREFIX": str(PREFIX), "DISTLAB_HUB_STATE": str(root / "state"),
                "DISTLAB_HUB_COURSE": str(root / "course"), "DISTLAB_EXCHANGE": str(root / "exchange"),
                "DISTLAB_HUB_MAX_SUBMISSION_KB": str(MAX_KB), **(env_extra or {})})
    hub = Hub(root=root, env=env, passwords={}, log=root / "hub.log")
    try:
        with hub.log.open("w") as out:
            command = ["make", "--no-print-directory", "hub", f"HUB_PORT={port}", "HUB_IP=127.0.0.1",
                       f"SPAWNER={spawner}"]
            hub.process = subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                           stdin=subprocess.DEVNULL, start_new_session=True)
        hub.base = f"http://127.0.0.1:{port}"
        up = poll(lambda: hub.process.poll() is not None or get(f"{hub.base}/hub/api")[0] == 200, timeout=120)
        assert up and hub.process.poll() is None, f"make hub did not start the hub:\n{log_tail(hub.log)}"
        for args in (["--instructor", INSTRUCTOR], list(LEARNERS)):
            printed = hub.script("add-users.sh", *args).stdout  # "NAME PASSWORD" for each new user
            hub.passwords.update(line.split(" ", 1) for line in printed.splitlines())
        assert sorted(hub.passwords) == sorted(USERS), hub.passwords.keys()
        hub.make("hub-class", "STEP=release", "EX=1")
        yield hub
    finally:
        stop(hub)
        remove_users()
        shutil.rmtree(root, ignore_errors=True)


def stop(hub: Hub) -> None:
    """SIGTERM to JupyterHub (its pid file): it stops the learners' servers, the sealer and the proxy, and exits,
    and ``make hub`` with it. (Not to make's process group: a second SIGTERM would cut the hub's cleanup short.)"""
    if hub.process is None or hub.process.poll() is not None:
        return
    pid_file = Path(hub.env["DISTLAB_HUB_STATE"]) / "jupyterhub.pid"
    with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
        os.kill(int(pid_file.read_text()), signal.SIGTERM)
    try:
        hub.process.wait(timeout=60 * time_scale())
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(hub.process.pid, signal.SIGKILL)
        hub.process.wait()


def log_tail(log: Path, lines: int = 60) -> str:
    text = log.read_text(errors="replace") if log.exists() else "(no log)"
    return "\n".join(text.splitlines()[-lines:])
