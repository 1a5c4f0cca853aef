"""Launching beyond ``--standalone``: several torchrun agents forming one job, and ``mp.spawn``.

On a cluster every machine runs one torchrun *agent*; the agents meet at a
rendezvous (c10d: a TCP store hosted by one of them) and agree on the world:
which agent is node 0, 1, ..., and the global rank of every worker. Here two
agents run on one machine with the rendezvous on ``127.0.0.1``, which is
exactly what two machines do with the first machine's address instead::

    torchrun --nnodes=2 --nproc-per-node=1 --rdzv-backend=c10d \\
             --rdzv-endpoint=127.0.0.1:PORT --rdzv-id=JOB train.py   # run twice

:func:`multinode_torchrun` starts the agents, returns each rank's result like
:func:`distlab.torchrun`, and with the same guarantees: a free port, a
wall-clock timeout, and no process of the job left behind (every agent and
worker carries the job's tag; see :mod:`distlab.process`). Under NCCL the
agents share this machine's GPUs: each agent sees its own slice of them
(``CUDA_VISIBLE_DEVICES``), as each machine of a cluster sees its own.
"""
from __future__ import annotations

import os
import socket
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Callable

import torch

from .distributed import pick_backend
from .launch import RunResult, collect, job_env, run_torchrun, target_string, time_scale, write_spec
from .process import Finished
from .sandbox import learner_sandbox

ENV_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
            "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_RUN_ID")


@dataclass
class MultinodeResult(RunResult):
    """A :class:`~distlab.launch.RunResult` plus the rendezvous ``endpoint`` the agents met at and the
    torchrun ``commands`` they ran (as a person would type them; the same on every node)."""

    endpoint: str = ""
    commands: list[list[str]] = field(default_factory=list, repr=False)


def _gpu_slices(nnodes: int, nproc_per_node: int) -> list[str]:
    """``CUDA_VISIBLE_DEVICES`` for each agent: node ``n`` gets the ``n``-th block of this machine's GPUs."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [i.strip() for i in visible.split(",") if i.strip()] if visible else \
        [str(i) for i in range(torch.cuda.device_count())]
    return [",".join(ids[n * nproc_per_node:(n + 1) * nproc_per_node]) for n in range(nnodes)]


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now (the OS picks it; the store binds it moments later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def command_lines(nnodes: int, nproc_per_node: int, endpoint: str, rdzv_id: str, program: list[str],
                  max_restarts: int = 0) -> list[list[str]]:
    """The torchrun command line each of ``nnodes`` machines runs (identical on every machine)."""
    cmd = ["torchrun", f"--nnodes={nnodes}", f"--nproc-per-node={nproc_per_node}",
           "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", f"--rdzv-id={rdzv_id}",
           f"--max-restarts={max_restarts}", *program]
    return [list(cmd) for _ in range(nnodes)]


def multinode_torchrun(target: str | Callable, nnodes: int = 2, nproc_per_node: int = 1, *,
                       args: tuple = (), kwargs: dict | None = None, timeout: float = 60.0,
                       backend: str | None = None, stream: bool | Callable[[str], None] = False) -> MultinodeResult:
    """Run ``target`` under ``nnodes`` torchrun agents on this machine, rendezvous on 127.0.0.1.

    ``results`` are in global rank order; ``endpoint`` is the rendezvous address used (a free
    port). Agent 0 hosts the c10d store (``is_host=1``); on real machines torchrun infers that
    from the address. All "nodes" share this machine's GPUs, so NCCL needs one GPU per worker of
    the whole job, and each agent is shown only its own (``CUDA_VISIBLE_DEVICES``).
    """
    nprocs = nnodes * nproc_per_node
    backend = backend or pick_backend(nprocs)
    timeout *= time_scale()
    endpoint = f"127.0.0.1:{free_port()}"
    gpus = _gpu_slices(nnodes, nproc_per_node) if backend == "nccl" else [None] * nnodes
    callback = print if stream is True else (stream or None)
    with tempfile.TemporaryDirectory(prefix="distlab-mn-") as tmp:
        outdir = Path(tmp)
        spec = write_spec(outdir, target_string(target), args=args, kwargs=kwargs)
        program = ["--monitor-interval=0.1", "-m", "distlab.worker", str(spec)]
        env = job_env(outdir, backend, 0.75 * timeout)
        commands = command_lines(nnodes, nproc_per_node, endpoint, uuid.uuid4().hex, program)
        sandbox = learner_sandbox(outdir)
        lock = threading.Lock()
        lines: list[str] = []

        def on_line(line: str) -> None:
            with lock:
                lines.append(line)
                if callback:
                    callback(line)

        def agent(node: int) -> Finished:
            options = [*commands[node][1:-len(program)], program[0],
                       f"--rdzv-conf=is_host={int(node == 0)},join_timeout={int(timeout)}"]
            node_env = env if gpus[node] is None else {**env, "CUDA_VISIBLE_DEVICES": gpus[node]}
            return run_torchrun(options, spec, timeout=timeout, env=node_env, on_line=on_line, **sandbox)

        with ThreadPoolExecutor(nnodes) as pool:
            agents = list(pool.map(agent, range(nnodes)))
        # One job: it timed out if any agent did, and failed with the first agent that failed.
        failed = next((a for a in agents if a.timed_out), None) or \
            next((a for a in agents if a.returncode), agents[0])
        finished = Finished(failed.returncode, failed.timed_out, lines, max(a.wall_s for a in agents))
        run = collect(outdir, nprocs, backend, finished, timeout)
    return MultinodeResult(run.results, run.output, run.wall_s, nprocs, backend, run.lines,
                           endpoint=endpoint, commands=commands)


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

    With ``probe`` (keyword arguments of :func:`distlab.bandwidth.scaling_probe`) the same job
    also measures what the scaling model needs, under ``"probe"``: a second job would spend
    seconds starting processes to measure milliseconds of work.
    """
    from .distributed import init_distributed, shutdown

    out = view(init_distributed())
    if probe is not None:
        from .bandwidth import scaling_probe

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

    from .distributed import init_distributed, shutdown

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
