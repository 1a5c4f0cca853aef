"""The class's JupyterHub with each learner's server as a Slurm job (``make hub SPAWNER=slurm``:
docker/hub/spawners/slurm.py, batchspawner's SlurmSpawner), on the two-node test cluster of the Slurm tier
(distlab/runtime/slurm_cluster.py: the host name and ``localhost``, on loopback).

One run: the cluster, then the hub started by ``make hub`` as in tests/tiers/test_hub.py, with the cluster's
SLURM_CONF in its environment; one learner logs in through the hub's login form over HTTP (no browser), which
starts their server. Asserted, each as a fact of the run:

* the server is a Slurm job: RUNNING, the learner's uid, in their home, on one of the cluster's two nodes;
  its ``jupyterhub-singleuser`` is a process of that job (its SLURM_JOB_ID) as the learner, umask 077;
* it answers through the hub's proxy, with the learner's login;
* the server's token, which the learner can read, sets nothing of the spawner but a starting server's port
  (batchspawner's own handler would set the commands the hub runs as root);
* the job asks for the hub's settings (the defaults of DISTLAB_HUB_SLURM_TIME, _CPUS and _MEMORY);
* stopping the server (the hub's API, as the learner) cancels the job and leaves no process of the learner;
* a second server, asked for with the learner's own time, CPUs and sbatch options for its job (the REST
  API's spawn options, which batchspawner would write into the batch script), is a job with the hub's;
* that server, still running when the hub stops, is cancelled by the hub; then no job is left, nor anything
  of the hub; and once the cluster is stopped, nothing at all.

Not tested here: a job that waits in the queue (the test cluster is idle), GPUs (the test nodes' are device
files), a hub and nodes on separate hosts.
Needs root, the hub installed (docker/hub/install.sh), slurm-wlm and munge: skipped with the reason without
them, failed instead under DISTLAB_REQUIRE_HUB=1 or DISTLAB_REQUIRE_SLURM=1.
"""
from __future__ import annotations

import json
import pwd
import subprocess
from pathlib import Path

import psutil
import pytest

from tests.helpers import hub as hubs
from tests.helpers import session_processes
from tests.helpers.hub_http import HubUser

pytestmark = [pytest.mark.slurm, pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(300)]
ALICE = hubs.LEARNERS[0]
MY_OPTIONS = {"runtime": "00:07:00", "nprocs": "9", "options": "--comment=mine"}  # batchspawner's names


def jobs_of(cluster, user: str) -> list[dict[str, str]]:
    """``user``'s jobs on the cluster, in any state, as ``scontrol show job`` gives each."""
    done = subprocess.run(["squeue", "-h", "-t", "all", "-u", user, "-o", "%i"], env=cluster.env(),
                          capture_output=True, text=True, timeout=30)
    return [cluster.job(job_id) for job_id in done.stdout.split()]


def active_jobs(cluster) -> list[str]:
    done = subprocess.run(["squeue", "-h", "-o", "%i %T %u"], env=cluster.env(), capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def processes_of(user: str) -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["username"]) if p.info["username"] == user]


def umask(pid: int) -> str:
    return next(line.split()[1] for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                if line.startswith("Umask:"))


def test_a_learners_server_is_a_slurm_job_of_theirs(request, tmp_path, wait_for, leftover_processes):
    hubs.require()
    cluster = request.getfixturevalue("cluster")  # after the hub's check: no cluster is started for a skip
    daemons = set(cluster.pids().values())
    with hubs.class_hub(spawner="slurm", env_extra={"SLURM_CONF": cluster.env()["SLURM_CONF"]}) as hub:
        alice = HubUser(hub.base, ALICE, hub.passwords[ALICE])
        learner = pwd.getpwnam(ALICE)
        alice.log_in()
        assert alice.wait_ready(timeout=120), f"{alice.server()}\n{hubs.log_tail(hub.log)}\n{cluster.logs()}"

        # the server is a Slurm job of the learner's, running on one of the two nodes
        (job,) = jobs_of(cluster, ALICE)
        assert job["JobState"] == "RUNNING", job
        assert job["UserId"] == f"{ALICE}({learner.pw_uid})", job
        assert job["NodeList"] in cluster.names, (job["NodeList"], cluster.names)
        assert job["WorkDir"] == learner.pw_dir, job
        # with the hub's settings (their defaults: DISTLAB_HUB_SLURM_TIME, _CPUS, _MEMORY)
        assert (job["TimeLimit"], job["CPUs/Task"], job["MinMemoryNode"]) == ("04:00:00", "4", "3G"), job
        # its jupyterhub-singleuser is a process of that job, as the learner, with umask 077
        server = psutil.Process(hub.server_pid(ALICE))
        environ = Path(f"/proc/{server.pid}/environ").read_bytes().split(b"\0")
        assert f"SLURM_JOB_ID={job['JobId']}".encode() in environ, server.cmdline()
        assert (server.uids().real, server.uids().effective) == (learner.pw_uid, learner.pw_uid)
        assert umask(server.pid) == "0077"
        assert server.cwd() == learner.pw_dir

        # it answers through the hub's proxy, with the learner's login
        status = alice.get("api/status")
        assert status.status_code == 200, (status.status_code, status.text[:500])

        # the server's token (the learner can read it) sets nothing but a starting server's port: not the
        # commands the hub runs as root when the server stops (batchspawner's own handler would set them)
        token, owned = hub.server_token(ALICE), tmp_path / "owned"
        for body in ({"exec_prefix": f"touch {owned};"}, {"job_id": f"1; touch {owned}"}, {"port": 4242}):
            sent = alice.http.post(f"{hub.base}/hub/api/batchspawner", data=json.dumps(body), timeout=60,
                                   headers={"Authorization": f"token {token}"})
            assert sent.status_code == 400, (body, sent.status_code, sent.text[:300])

        # stopping the server (as the learner) cancels the job, and nothing of the learner's is left
        assert alice.stop_server() in (202, 204)
        ended = wait_for(lambda: cluster.job(job["JobId"])["JobState"] in ("CANCELLED", "COMPLETED"), timeout=60)
        assert ended, cluster.job(job["JobId"])
        assert not owned.exists()
        assert wait_for(lambda: not processes_of(ALICE), timeout=30), [p.cmdline() for p in processes_of(ALICE)]
        assert alice.server() == {}

        # a second server, asked for with the learner's own options for its job (the REST API's body), which
        # the hub drops: the job asks for the hub's settings
        sent = alice.http.post(f"{hub.base}/hub/api/users/{ALICE}/server", data=json.dumps(MY_OPTIONS), timeout=120,
                               headers={"X-XSRFToken": alice.http.cookies.get("_xsrf", path="/hub/")})
        assert sent.status_code in (201, 202), (sent.status_code, sent.text[:300])
        assert alice.wait_ready(timeout=120), f"{alice.server()}\n{hubs.log_tail(hub.log)}"
        (second,) = [j for j in jobs_of(cluster, ALICE) if j["JobState"] == "RUNNING"]
        assert (second["TimeLimit"], second["CPUs/Task"], second.get("Comment")) == ("04:00:00", "4", None), second
        # still running when the hub stops: the hub cancels its job too (cleanup_servers)

    # the hub stopped: it cancelled the job (had it not, the removal of the user would have killed it: FAILED)
    assert cluster.job(second["JobId"])["JobState"] == "CANCELLED", cluster.job(second["JobId"])
    # no job is left (pending, running or ending), and of this session only the cluster's daemons
    assert wait_for(lambda: active_jobs(cluster) == [], timeout=30), active_jobs(cluster)
    assert wait_for(lambda: {p.pid for p in session_processes()} <= daemons, timeout=30), \
        [(p.pid, p.cmdline()) for p in session_processes() if p.pid not in daemons]
    cluster.stop()
    assert leftover_processes() == []
