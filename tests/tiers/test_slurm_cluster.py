"""course/slurm/train.sbatch, unmodified, on a real two-node Slurm cluster on this host.

distlab/runtime/slurm_cluster.py starts munged, slurmctld and one slurmd per node (the host
name and ``localhost``, both on loopback), each node claiming 16 CPUs and 4 GPUs
(device nodes made with mknod: no GPU runs, and none is used: the ranks run gloo on
the CPU). ``sbatch`` submits the script as a learner would, with
tests/helpers/targets/slurm_train.py as train.py; the script's ``srun torchrun`` then starts
one agent per node, 4 workers each, which meet at the c10d rendezvous on the first
node.

Pass: the job COMPLETED with exit code 0; the 8 ranks saw one world (WORLD_SIZE 8,
ranks 0-7, the job id as the rendezvous id, one MASTER_ADDR:MASTER_PORT), 4 workers on
each of the 2 nodes with the script's 4 threads each, and the all-reduce's sum 36; the
script announced the rendezvous on the first node at 20000 + job id; the daemons
listened on loopback only; nothing of the job was left running, and nothing of the
cluster once it was stopped.

Needs root and Debian's slurm-wlm and munge (``.ci/run`` installs them); skipped with
the reason without them, unless ``DISTLAB_REQUIRE_SLURM=1`` (CI), where that fails.
What a laptop cannot show stays for a real cluster: GPUs (``--gpus-per-node`` is
granted but no device exists), NCCL, cgroup confinement, more than one host.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import psutil
import pytest

from tests.helpers import REPO, session_processes

pytestmark = [pytest.mark.slurm, pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(300)]
SBATCH = REPO / "course" / "slurm" / "train.sbatch"
TRAIN = REPO / "tests" / "helpers" / "targets" / "slurm_train.py"


def listening(pid: int) -> list[str]:
    return [c.laddr.ip for c in psutil.Process(pid).net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]


def test_the_batch_script_runs_two_nodes_of_four_workers_in_one_world(cluster, tmp_path, wait_for,
                                                                      leftover_processes):
    ports = {name: listening(pid) for name, pid in cluster.pids().items()}
    assert ports.pop("munged") == [], ports  # munged: a Unix socket only
    # slurmctld and each slurmd on their own port, on loopback, none on every address
    assert sorted(ports) == sorted(["slurmctld", *(f"slurmd-{n}" for n in cluster.names)]), ports
    assert all(ips and all(ip.startswith("127.") for ip in ips) for ips in ports.values()), ports
    out = tmp_path / "ranks"
    out.mkdir()
    # torchrun and the project's interpreter first on PATH, as for a learner with the venv activated
    env = cluster.env(PATH=f"{Path(sys.executable).parent}{os.pathsep}{cluster.env()['PATH']}")
    env.pop("OMP_NUM_THREADS", None)  # the script's own share per worker
    env.pop("NPROC_PER_NODE", None)
    env.pop("RDZV_PORT", None)
    job_id = cluster.sbatch(str(SBATCH), str(TRAIN), str(out), cwd=tmp_path, env=env)
    job = cluster.wait(job_id, timeout=180)
    log = tmp_path / f"distlab-train-{job_id}.out"  # the script's --output=%x-%j.out
    text = log.read_text() if log.exists() else "(no output file)"
    assert (job.get("JobState"), job.get("ExitCode")) == ("COMPLETED", "0:0"), f"{job}\n{text}\n{cluster.logs()}"

    head = cluster.hostnames(job["NodeList"])[0]  # as the script finds its first node
    assert f"job {job_id}: 2 nodes x 4 workers, 16 CPUs per node (4 threads per worker), " \
           f"rendezvous {head}:{20000 + int(job_id) % 20000}" in text, text
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(8)]
    assert sorted(p.name for p in out.iterdir()) == [f"rank{r}.json" for r in range(8)], text
    for r, seen in enumerate(ranks):
        assert (seen["RANK"], seen["WORLD_SIZE"], seen["world"], seen["LOCAL_WORLD_SIZE"]) == (str(r), "8", 8, "4")
        assert (seen["sum"], seen["backend"], seen["OMP_NUM_THREADS"]) == (36.0, "gloo", "4"), seen
        assert seen["TORCHELASTIC_RUN_ID"] == seen["SLURM_JOB_ID"] == job_id, seen
    # one rendezvous: one master for all 8, one group rank per node, 4 local ranks on each
    assert len({(s["MASTER_ADDR"], s["MASTER_PORT"]) for s in ranks}) == 1, ranks
    by_node: dict[str, list] = {}
    for s in ranks:
        by_node.setdefault(s["SLURMD_NODENAME"], []).append((s["GROUP_RANK"], s["LOCAL_RANK"], s["SLURM_PROCID"]))
    assert sorted(by_node) == sorted(cluster.names), by_node
    assert sorted({g for v in by_node.values() for g, _, _ in v}) == ["0", "1"], by_node
    for node, seen in by_node.items():
        assert len({g for g, _, _ in seen}) == 1 and len({p for _, _, p in seen}) == 1, (node, seen)
        assert sorted(lr for _, lr, _ in seen) == ["0", "1", "2", "3"], (node, seen)

    # nothing of the job is left: only the cluster's own daemons (the ranks carry this session's marker)
    daemons = set(cluster.pids().values())
    assert wait_for(lambda: {p.pid for p in session_processes()} <= daemons, timeout=30), \
        [(p.pid, p.name()) for p in session_processes() if p.pid not in daemons]
    cluster.stop()
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in daemons)
    assert leftover_processes() == []


def test_a_job_still_running_when_the_cluster_stops_is_ended_with_it(cluster, tmp_path, wait_for,
                                                                       leftover_processes):
    """A test that fails before its job ends stops the cluster with the job running: its slurmstepds are daemons
    of their own (their parent is init, not slurmd) and outlive their slurmd, and their title hides the cluster's
    SLURM_CONF from psutil's reading of their environment; the cluster ends them and what runs under them."""
    (tmp_path / "job.sh").write_text("#!/bin/bash\n#SBATCH --nodes=2\nsrun sleep 600\n")
    job_id = cluster.sbatch(str(tmp_path / "job.sh"), cwd=tmp_path, env=cluster.env())
    def sleeping() -> list:  # srun runs the task by its full path
        return [p for p in psutil.process_iter(["cmdline"])
                if len(cmd := p.info["cmdline"] or []) == 2 and Path(cmd[0]).name == "sleep" and cmd[1] == "600"]

    assert wait_for(lambda: len(sleeping()) == 2, timeout=60), cluster.job(job_id)  # one task on each node
    cluster.stop()
    assert leftover_processes() == []
