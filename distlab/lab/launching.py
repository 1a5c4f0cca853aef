"""Notebook 06's rank programs: what each rank sees of the job torchrun made, ``mp.spawn`` done by
hand for comparison, and a worker that crashes once for torchrun's elastic restart.

The launching itself is :mod:`distlab.runtime.multinode` and :mod:`distlab.runtime.launch`; these
are only what runs inside the ranks (and :func:`whoami` also measures, with
:func:`distlab.lab.bandwidth.scaling_probe`, so it lives above the runtime).
"""
from __future__ import annotations

import os
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch

from distlab.runtime.multinode import ENV_VARS, free_port


def view(dev: torch.device) -> dict:
    """This rank's view of the initialised job: torchrun's environment variables, and an all-reduce
    (on ``dev``, so it works under gloo and NCCL) proving every rank is in one world."""
    import torch.distributed as dist

    total = torch.tensor([float(dist.get_rank())], dtype=torch.float32, device=dev)
    dist.all_reduce(total)
    return {**{k: os.environ.get(k, "") for k in ENV_VARS}, "pid": os.getpid(), "rank_sum": int(total.item()),
            "world": dist.get_world_size(), "device": str(dev)}


def whoami(probe: dict | None = None) -> dict:
    """Join the job, return :func:`view`, leave: a rank's view of the job.

    With ``probe`` (keyword arguments of :func:`distlab.lab.bandwidth.scaling_probe`) the same job
    also measures what the scaling model needs, under ``"probe"``: a second job would spend
    seconds starting processes to measure milliseconds of work.
    """
    from distlab.runtime.distributed import init_distributed, shutdown

    out = view(init_distributed())
    if probe is not None:
        from distlab.lab.bandwidth import scaling_probe

        out["probe"] = scaling_probe(**probe)  # joins the same process group
    shutdown()
    return out


def _spawned(local_rank: int, world: int, port: int, outdir: str) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=local_rank, world_size=world, timeout=timedelta(seconds=30))
    t = torch.tensor([float(local_rank)])
    dist.all_reduce(t)
    env = {k: os.environ.get(k, "") for k in ENV_VARS}
    Path(outdir, f"{local_rank}.txt").write_text(repr({"rank": local_rank, "rank_sum": t.item(), **env}))
    dist.destroy_process_group()


def spawn_demo(nprocs: int = 2, timeout: float = 60.0) -> list[str]:
    """The ``torch.multiprocessing.spawn`` way: this process starts the workers itself, picks the
    port, sets the environment, and must handle a hang or a failure on its own."""
    import torch.multiprocessing as mp

    port = free_port()
    with tempfile.TemporaryDirectory(prefix="distlab-spawn-") as tmp:
        ctx = mp.start_processes(_spawned, args=(nprocs, port, tmp), nprocs=nprocs, join=False,
                                 start_method="spawn")
        deadline = time.monotonic() + timeout
        try:
            while not ctx.join(timeout=0.2):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"mp.spawn workers still running after {timeout:g} s")
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
                p.join(timeout=5)
        return [Path(tmp, f"{r}.txt").read_text() for r in range(nprocs)]


def flaky_worker() -> dict:
    """Elastic-restart demo: rank 1 dies in the first attempt; torchrun then restarts *every*
    worker (new processes, attempt 1), which rejoin the process group and finish."""
    import torch.distributed as dist

    from distlab.runtime.distributed import init_distributed, shutdown

    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    init_distributed()
    rank = dist.get_rank()
    print(f"attempt {attempt}: rank {rank} is process {os.getpid()}", flush=True)
    dist.barrier()
    if attempt == 0 and rank == 1:
        os._exit(3)  # a crash: no exception, no clean-up, like a lost machine or an OOM kill
    dist.barrier()
    shutdown()
    return {"rank": rank, "attempt": attempt, "pid": os.getpid()}
