"""The grading image's sandbox, outside Docker: learners' code as an unprivileged user, with limits.

Needs root (skipped otherwise, with that reason). The whole flow through
``docker/grade.sh`` is in tests/tiers/test_grading_image.py; these are its parts.
"""
from __future__ import annotations

import os
import pwd
import resource
import shutil
import subprocess

import pytest

from distlab.runtime.process import kill_user_processes, run_contained
from distlab.runtime.sandbox import learner_rlimits
from tests.helpers.learner_user import (LEARNER, learner_processes, learner_user, readable_install,
                                world_readable_dir)

pytestmark = [pytest.mark.timeout(300), pytest.mark.root]


@pytest.fixture(scope="module")
def user():
    name = learner_user()
    yield name
    kill_user_processes(name)


@pytest.fixture(scope="module")
def install(user):
    return readable_install()


def test_commands_run_as_the_learner_with_no_new_privileges_and_limits(user):
    probe = "id -u; grep NoNewPrivs /proc/self/status | tr -d ' \\t'; ulimit -u; ulimit -c; ulimit -n"
    done = run_contained(["bash", "-c", probe], timeout=60, user=user, rlimits={
        resource.RLIMIT_NPROC: 300, resource.RLIMIT_CORE: 0, resource.RLIMIT_NOFILE: 1000})
    assert done.returncode == 0 and not done.timed_out, done.lines
    assert done.lines == [str(pwd.getpwnam(user).pw_uid), "NoNewPrivs:1", "300", "0", "1000"]


def test_the_default_limits_cap_processes_files_memory_and_core_files(monkeypatch):
    monkeypatch.setenv("DISTLAB_STUDENT_MAX_PROCS", "123")
    monkeypatch.delenv("DISTLAB_STUDENT_MAX_MEMORY", raising=False)
    limits = learner_rlimits()
    assert limits[resource.RLIMIT_NPROC] == 123 and limits[resource.RLIMIT_CORE] == 0
    assert limits[resource.RLIMIT_NOFILE] == 4096
    if not os.path.exists("/dev/nvidia0"):  # with CUDA the container's memory limit is the bound
        assert limits[resource.RLIMIT_AS] >= 4 << 30


FORK_BOMB = """
import os, time
root, start = os.getpid(), time.time()
while time.time() < start + 60:
    if os.getpid() == root and time.time() > start + 2:
        break  # the job's own process ends; its descendants fork on
    try:
        os.fork()
    except OSError:
        time.sleep(0.01)
"""


def test_a_fork_bomb_stops_at_the_process_limit_and_is_ended_with_its_job(user, install, wait_for):
    done = run_contained([install[0], "-c", FORK_BOMB], timeout=120, user=user,
                         rlimits={resource.RLIMIT_NPROC: 64})
    assert not done.timed_out, "the bomb's own process ends after 2 s: the job must end then"
    assert any("ended" in line and "process(es) the job left running" in line for line in done.lines)
    assert wait_for(lambda: learner_processes() == [], timeout=10)


def test_a_memory_bomb_fails_at_the_address_space_limit(user, install):
    bomb = "x = []\nwhile True:\n    x.append(b'x' * (64 << 20))\n"
    done = run_contained([install[0], "-c", bomb], timeout=120, user=user,
                         rlimits={resource.RLIMIT_AS: 1 << 30})
    assert done.returncode == 1 and any("MemoryError" in line for line in done.lines), done.lines[-5:]


def test_endless_output_is_kept_bounded(user, install):
    spew = "import sys\nline = 'x' * 1023 + '\\n'\nfor _ in range(1 << 16):\n    sys.stdout.write(line)\n"
    done = run_contained([install[0], "-c", spew], timeout=300, user=user)
    assert done.returncode == 0 and len(done.lines) <= 10_001
    assert done.lines[2000].startswith("[... ") and done.lines[2000].endswith(" lines not kept ...]")


def test_every_process_of_the_learner_can_be_ended(user, wait_for):
    entry = pwd.getpwnam(user)
    escaped = subprocess.Popen(["setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}",
                                "--clear-groups", "sleep", "600"], start_new_session=True)
    kill_user_processes(user)
    assert escaped.wait(timeout=30) == -9
    assert wait_for(lambda: learner_processes() == [], timeout=10)


def test_graded_ranks_run_as_the_learner_and_the_report_is_out_of_their_reach(install, tmp_path, wait_for):
    """The CLI as root with the sandbox: the ranks import the learner's file as the learner user."""
    python, repo = install
    shared = world_readable_dir("distlab-sandbox-")
    try:
        text = (repo / "solutions" / "ex07_pipeline.py").read_text()  # one launch of 2 ranks
        spy = (f"\nimport os as _os\nopen({str(shared / 'uid' / 'rank')!r} + _os.environ['RANK'], 'w')"
               ".write(str(_os.getuid()))\nraise RuntimeError('spied')\n")
        (shared / "uid").mkdir(mode=0o777)
        (shared / "uid").chmod(0o1777)  # a drop box the learner can write to
        (shared / "sub").mkdir()
        (shared / "sub" / "ex07_pipeline.py").write_text(text.replace("\nimport torch\n", "\nimport torch\n" + spy, 1))
        os.chmod(shared / "sub", 0o755)
        done = subprocess.run([python, "-m", "autograder", "grade", str(shared / "sub"), "-e", "7", "--json",
                               str(tmp_path / "r.json")], cwd=repo, capture_output=True, text=True, timeout=240,
                              env={**os.environ, "DISTLAB_STUDENT_USER": LEARNER, "PYTHONPATH": str(repo)})
        assert done.returncode == 1, done.stderr
        assert "RuntimeError: spied" in done.stdout
        uids = {p.name: p.read_text() for p in (shared / "uid").iterdir()}
        assert uids and set(uids.values()) == {str(pwd.getpwnam(LEARNER).pw_uid)}, uids
        assert wait_for(lambda: learner_processes() == [], timeout=10)
    finally:
        shutil.rmtree(shared, ignore_errors=True)
