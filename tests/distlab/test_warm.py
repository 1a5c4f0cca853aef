"""The warm launcher (distlab.runtime.warm): torchrun's engine with its ranks forked from one server per process.

What it promises beyond the launcher's own tests (test_launch.py, which run through it): every
launch is contained on its own, not only every grading, and the server is the one thing that
outlives a launch; a launch that crashed does not disturb the next; the ranks see what the
torchrun CLI's ranks see; where the warm path cannot be used, the CLI is, and the launcher says
so once; in the sandbox the ranks are the learner's and cannot reach the server.
"""
from __future__ import annotations

import json
import os
import subprocess
import signal
import sys

import psutil
import pytest

from distlab import LaunchError, torchrun
from distlab.runtime import costs, warm
from tests.helpers import REPO
from tests.helpers.targets import ranks


def _pids(folder) -> list[int]:
    return [int(p.name.split(".")[1]) for p in folder.iterdir()]


def _alive(pids: list[int]) -> list[int]:
    return [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def test_each_launch_ends_everything_it_started_but_the_server(tmp_path, wait_for):
    run = torchrun(ranks.allreduce_rank, 2, timeout=120)  # the server is up
    server = warm.server_pids()
    assert len(server) == 2 and run.results[1]["sum"].item() == 3  # the reaper and the server
    folder = tmp_path / "pids"
    folder.mkdir()
    run = torchrun(ranks.leave_helpers, 2, args=(str(folder),), timeout=120)
    assert run.results == [0, 1]
    left = _pids(folder)
    assert {p.split(".")[0] for p in os.listdir(folder)} == {"helper", "daemon"}
    # The helper held the output pipe and the daemon had no job tag: the job root's sweep ended both
    # before the launch returned (a SIGKILLed process may take a moment to be reaped).
    assert wait_for(lambda: _alive(left) == [], timeout=10), _alive(left)
    assert warm.server_pids() == server and all(psutil.pid_exists(p) for p in server)


def test_a_rank_killed_in_a_collective_does_not_disturb_the_next_launch():
    with pytest.raises(LaunchError, match=r"rank 1 was killed by signal 9 \(SIGKILL\)"):
        torchrun(ranks.killed_in_all_reduce, 2, timeout=120)
    server = warm.server_pids()
    run = torchrun(ranks.allreduce_rank, 4, timeout=120)
    assert [r["sum"].item() for r in run.results] == [10.0] * 4
    assert warm.server_pids() == server


_COMPARE = f"""
import json, sys
sys.path.insert(0, {str(REPO)!r})
from distlab import torchrun, warm
from tests.helpers.targets import ranks
warm_view = torchrun(ranks.torchrun_view, 2, timeout=120).results
path = warm.path_in_use()
import os
os.environ["DISTLAB_LAUNCH"] = "cli"
cli_view = [torchrun(ranks.torchrun_view, 2, timeout=120).results for _ in range(2)][0]
print(json.dumps({{"path": path, "warm": warm_view, "cli": cli_view, "then": warm.path_in_use()}}))
"""


@pytest.mark.slow
def test_the_ranks_see_what_the_torchrun_clis_ranks_see_and_the_fallback_is_announced_once():
    done = subprocess.run([sys.executable, "-c", _COMPARE], capture_output=True, text=True, timeout=600,
                          cwd=REPO, env={k: v for k, v in os.environ.items() if k != warm.SERVER_VAR})
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert (seen["path"], seen["then"]) == ("warm", "cli")
    # the same variables and values, thread count, signal handlers, and no CUDA fork poison
    assert seen["warm"] == seen["cli"]
    assert seen["warm"][0]["signals"]["SIGTERM"] == str(signal.SIG_DFL)
    assert seen["warm"][1]["env"]["RANK"] == "1" and seen["warm"][1]["env"]["MASTER_PORT"] == "set"
    assert done.stderr.count("distlab: launching with the torchrun CLI (DISTLAB_LAUNCH=cli)") == 1


_SANDBOXED = """
import json, os, sys
sys.path.insert(0, os.getcwd())
from distlab import torchrun, warm
from tests.helpers.targets import ranks
server = warm.get()
os.environ["DISTLAB_STUDENT_USER"] = sys.argv[1]
run = torchrun(ranks.sandbox_view, 2, args=(server.pid, server.path), timeout=120)
print(json.dumps({"views": run.results, "server_uid": os.stat(f"/proc/{server.pid}").st_uid}))
"""


@pytest.mark.root
def test_in_the_sandbox_each_rank_is_the_learner_and_cannot_reach_the_server():
    import pwd

    from tests.helpers.learner_user import learner_user, readable_install

    user = learner_user()
    python, repo = readable_install()
    done = subprocess.run([python, "-c", _SANDBOXED, user], capture_output=True, text=True, timeout=300, cwd=repo,
                          env={**{k: v for k, v in os.environ.items() if k != warm.SERVER_VAR},
                               "PYTHONPATH": str(repo)})
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["server_uid"] == 0  # the server stays root; each job's agent and ranks become the learner
    for view in seen["views"]:
        assert view["uid"] == view["euid"] == pwd.getpwnam(user).pw_uid
        assert view["no_new_privs"] == "1" and view["pdeathsig"] == 9
        assert view["nproc"] == int(os.environ.get("DISTLAB_STUDENT_MAX_PROCS", 512))
        assert view["signal_server"] == "refused" and view["connect_server"] == "PermissionError"
        assert view["sees_server_var"] is False


def test_a_job_that_changes_a_start_up_setting_is_launched_cold_and_one_that_changes_the_library_path_warm():
    torchrun(ranks.allreduce_rank, 1, timeout=120)
    server = warm.get()
    env = dict(server.env)
    assert server.serves({**env, "LD_LIBRARY_PATH": "/opt/elsewhere"})  # the fork keeps its loaded libraries
    assert not server.serves({**env, "TORCH_CPP_LOG_LEVEL": "INFO"})  # read once, when torch loads


def test_a_module_runs_forked_from_the_server_with_its_arguments_environment_and_exit_status(tmp_path):
    """``warm.run_module`` (the grader's grading process): ``python -m`` as a fork of the warm server."""
    env = {**os.environ, "DISTLAB_TEST_VAR": "seen", "PYTHONPATH": str(REPO)}
    done = warm.run_module("tests.helpers.targets.module_job", ["view", "x"], timeout=60, env=env, cwd=tmp_path)
    assert done.returncode == 0 and not done.timed_out, done.lines
    view = json.loads(done.lines[-1])
    assert view == {"warm": True, "argv": ["view", "x"], "cwd": str(tmp_path), "var": "seen"}
    assert done.cpu_s is not None  # the job root counted its processes' CPU
    exited = warm.run_module("tests.helpers.targets.module_job", ["exit", "3"], timeout=60, env=env, cwd=REPO)
    assert exited.returncode == 3
    raised = warm.run_module("tests.helpers.targets.module_job", ["raise"], timeout=60, env=env, cwd=REPO)
    assert raised.returncode == 1 and "ValueError: the module raised" in "\n".join(raised.lines)
    with warm.cli_launches():  # where there can be no server: a new interpreter, the same contract
        cold = warm.run_module("tests.helpers.targets.module_job", ["view", "x"], timeout=120, env=env, cwd=tmp_path)
    assert cold.returncode == 0 and json.loads(cold.lines[-1]) == {**view, "warm": False}


def test_a_module_past_its_limit_is_ended_with_everything_it_started(tmp_path, wait_for):
    pidfile = tmp_path / "pids"
    warm.get()
    server = warm.server_pids()
    done = warm.run_module("tests.helpers.targets.module_job", ["hang", str(pidfile)], timeout=60, env=dict(os.environ),
                           cwd=REPO, should_stop=lambda elapsed: pidfile.exists() and bool(pidfile.read_text()))
    assert done.timed_out
    pids = [int(p) for p in pidfile.read_text().split()]
    # the module and the child it detached, which ignores SIGTERM: the job root's sweep ended both
    assert len(pids) == 2 and wait_for(lambda: _alive(pids) == [], timeout=10), _alive(pids)
    assert warm.server_pids() == server


def test_a_launch_records_what_it_cost_and_a_rank_cannot_break_the_record(tmp_path):
    before = len(costs.LAUNCHES)
    torchrun(ranks.allreduce_rank, 2, timeout=120)
    (cost,) = costs.LAUNCHES[before:]
    assert cost.world == 2 and len(cost.rank_wall_s) == len(cost.rank_cpu_s) == len(cost.rank_started) == 2
    assert cost.cpu_s is not None  # the warm path's job root counted the agent's and the ranks' CPU
    # what a learner's rank may leave in place of its cost file: no record, and no error
    for rank, junk in enumerate(['{"wall_s": "x"}', "[" * 100_000]):
        (tmp_path / f"cost-{rank}.json").write_text(junk)
    assert costs.record(tmp_path, 3, 1.0, None).rank_wall_s == []
