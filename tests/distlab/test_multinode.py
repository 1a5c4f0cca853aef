"""Launching: two torchrun agents on one machine form one world, name a failing rank and leave
nothing behind (one launch shows all three);
the Slurm batch script runs the torchrun command it promises."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import tempfile

import psutil
import pytest

from distlab import RankFailure
from distlab.runtime import warm
from distlab.runtime.multinode import multinode_torchrun

from tests.helpers import REPO

SBATCH = REPO / "course" / "slurm" / "train.sbatch"


def views_then_rank1_fails() -> int:
    """Every rank joins the world and shares its view (env vars, an all-reduce); then rank 1 raises
    with every rank's view in its message, so one launch shows both the world and the failure.
    (Rank 0 must not finish cleanly: its agent would then wait at torchrun's exit barrier for the
    failed agent, up to its 300 s default.)"""
    import json

    import psutil
    import torch
    import torch.distributed as dist

    import distlab
    from distlab.lab.launching import view

    dev = distlab.init_distributed()
    if dev.type == "cuda":
        torch.cuda.set_device(dev)  # all_gather_object's tensors go to the current device
    views = [None] * dist.get_world_size()
    # with its creation time, so the test tells this process from a later one reusing its pid
    dist.all_gather_object(views, {**view(dev), "created": psutil.Process().create_time()})
    if dist.get_rank() == 1:
        raise ValueError("rank 1 fails on purpose; views: " + json.dumps(views))
    dist.barrier()  # rank 0 waits for its dead peer, as training would: gloo/NCCL then fail it too
    distlab.shutdown()
    return os.getpid()


def _gone(pid: int, created: float) -> bool:
    try:
        p = psutil.Process(pid)
        return p.create_time() != created or p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.slow
def test_two_agents_form_one_world_a_failing_rank_is_named_and_nothing_is_left(
        tmp_path, monkeypatch, wait_for, leftover_processes):
    # The job's temporary folder goes in a temp dir of this test's own, so "it was removed" is
    # checked without seeing other suites' folders in the shared /tmp.
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(RankFailure) as info:
        multinode_torchrun(f"{__name__}:views_then_rank1_fails", nnodes=2, nproc_per_node=1, timeout=60)
    # the failure: rank 1 named, with its message (deterministic: rank 0 fails only after rank 1 has
    # gone, in the barrier, so rank 1's error is the first by construction)
    assert info.value.rank == 1 and "fails on purpose" in str(info.value)
    # the world that formed before it: two agents (nodes), one world of 2
    ranks = json.loads(info.value.exc_message.split("views: ", 1)[1].strip().splitlines()[0])
    assert [r["RANK"] for r in ranks] == ["0", "1"]
    assert {r["GROUP_RANK"] for r in ranks} == {"0", "1"}          # two nodes ...
    assert {r["LOCAL_WORLD_SIZE"] for r in ranks} == {"1"}
    assert {r["TORCHELASTIC_RUN_ID"] for r in ranks} != {""} and len({r["TORCHELASTIC_RUN_ID"] for r in ranks}) == 1
    assert all(r["world"] == 2 and r["rank_sum"] == 1 for r in ranks)  # ... one world: the all-reduce saw both
    # nothing left behind: the workers, the agents, the job's temporary folder
    assert wait_for(lambda: all(_gone(r["pid"], r["created"]) for r in ranks), timeout=10)  # kills are async
    assert {p.pid for p in psutil.Process().children(recursive=True)} - warm.server_pids() <= before
    # This session's processes only: other suites on the machine run their own distlab-mn- jobs.
    assert leftover_processes() == []
    assert list(tmp.iterdir()) == [], "the job's temporary folder was left behind"


def rank1_aborts_once(marker: str) -> dict:
    """Rank 1 of the first attempt dies in C++ (as a worker that aborts at start-up does); the next
    round must form one world again, on both agents."""
    from pathlib import Path

    import torch
    import torch.distributed as dist

    import distlab

    if os.environ["RANK"] == "1" and not Path(marker).exists():
        Path(marker).touch()
        os.abort()
    distlab.init_distributed()
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    distlab.shutdown()
    return {"sum": t.item(), "restart": os.environ["TORCHELASTIC_RESTART_COUNT"]}


@pytest.mark.slow
def test_two_agents_restart_into_one_world_after_a_worker_aborts(tmp_path):
    # Only the agent whose worker died counts the restart; with one store kept across rounds the two
    # nodes' workers then waited on different attempts' keys until the timeout (seen in CI: Slurm).
    run = multinode_torchrun(f"{__name__}:rank1_aborts_once", nnodes=2, nproc_per_node=1, timeout=90,
                             args=(str(tmp_path / "aborted"),), max_restarts=1)
    assert [r["sum"] for r in run.results] == [3.0, 3.0]
    assert "1" in {r["restart"] for r in run.results}  # it did restart: the abort was not skipped


def test_slurm_script_runs_srun_torchrun_with_the_head_node_rendezvous(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "srun.args"
    fakes = {
        "scontrol": 'test "$1 $2" = "show hostnames" && printf "gpu-node-07\\ngpu-node-08\\n"',
        "srun": f'printf "%s\\n" "$@" > {log}',
    }
    for name, body in fakes.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(stat.S_IRWXU)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "4242",
           "SLURM_JOB_NODELIST": "gpu-node-[07-08]", "SLURM_JOB_NUM_NODES": "2", "SLURM_GPUS_ON_NODE": "4",
           "SLURM_CPUS_PER_TASK": "16"}
    env.pop("OMP_NUM_THREADS", None)
    out = subprocess.run(["bash", str(SBATCH), "train.py", "--epochs", "3"], env=env, capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    argv = log.read_text().splitlines()
    # the node's 16 CPUs go to the step's task explicitly, and its 4 workers share them: 4 threads each
    assert argv[:3] == ["--cpus-per-task=16", "--kill-on-bad-exit=1", "torchrun"]
    assert "16 CPUs per node (4 threads per worker)" in out.stdout
    assert argv[3:] == ["--nnodes=2", "--nproc-per-node=4", "--rdzv-backend=c10d",
                        "--rdzv-endpoint=gpu-node-07:24242", "--rdzv-id=4242", "--max-restarts=3",
                        "train.py", "--epochs", "3"]
    # torchrun itself accepts these options (the names are checked against its parser).
    from torch.distributed.run import get_args_parser

    args = get_args_parser().parse_args(argv[3:])
    assert (args.nnodes, args.nproc_per_node, args.rdzv_endpoint, args.training_script_args) == \
        ("2", "4", "gpu-node-07:24242", ["--epochs", "3"])


def test_slurm_script_refuses_to_run_without_a_program(tmp_path):
    out = subprocess.run(["bash", str(SBATCH)], capture_output=True, text=True, timeout=30,
                         env={**os.environ, "SLURM_JOB_ID": "1"})
    assert out.returncode == 2 and "usage" in out.stderr
