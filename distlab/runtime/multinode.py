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
worker carries the job's tag; see :mod:`distlab.runtime.process`). Under NCCL the
agents share this machine's GPUs: each agent sees its own slice of them
(``CUDA_VISIBLE_DEVICES``), as each machine of a cluster sees its own.
"""
from __future__ import annotations

import os
import socket
import tempfile
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from distlab.runtime.distributed import pick_backend
from distlab.runtime.launch import RunResult, collect, job_env, run_torchrun, target_string, time_scale, write_spec
from distlab.runtime.process import Finished
from distlab.runtime.sandbox import learner_sandbox

ENV_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
            "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_RUN_ID")


@dataclass
class MultinodeResult(RunResult):
    """A :class:`~distlab.runtime.launch.RunResult` plus the rendezvous ``endpoint`` the agents met at and the
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
                       backend: str | None = None, stream: bool | Callable[[str], None] = False,
                       max_restarts: int = 0) -> MultinodeResult:
    """Run ``target`` under ``nnodes`` torchrun agents on this machine, rendezvous on 127.0.0.1.

    ``results`` are in global rank order; ``endpoint`` is the rendezvous address used (a free
    port). Agent 0 hosts the c10d store (``is_host=1``); on real machines torchrun infers that
    from the address. All "nodes" share this machine's GPUs, so NCCL needs one GPU per worker of
    the whole job, and each agent is shown only its own (``CUDA_VISIBLE_DEVICES``). Each rendezvous
    round gets a store of its own (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, as
    ``course/slurm/train.sbatch`` sets), so an elastic restart (``max_restarts``) rejoins one world
    even where the two agents count the restart differently (:func:`distlab.init_distributed`).
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
        program = ["--monitor-interval=0.1", "-m", "distlab.runtime.worker", str(spec)]
        env = {**job_env(outdir, backend, 0.75 * timeout), "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
        commands = command_lines(nnodes, nproc_per_node, endpoint, uuid.uuid4().hex, program, max_restarts)
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
