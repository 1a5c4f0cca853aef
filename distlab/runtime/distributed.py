"""Process-group set-up shared by notebooks, solutions and the grader.

The backend is chosen in one place: NCCL when CUDA is present and there is a
GPU for every local rank, gloo on the CPU otherwise. The launcher decides it
once and hands it to every rank in ``DISTLAB_BACKEND`` so all ranks agree.
"""
from __future__ import annotations

import atexit
import os
from datetime import timedelta

import torch
import torch.distributed as dist

BACKEND_VAR = "DISTLAB_BACKEND"
TIMEOUT_VAR = "DISTLAB_PG_TIMEOUT"


def pick_backend(nprocs_per_node: int = 1) -> str:
    """``"nccl"`` if CUDA is available with at least one GPU per local rank, else ``"gloo"``."""
    if torch.cuda.is_available() and torch.cuda.device_count() >= nprocs_per_node:
        return "nccl"
    return "gloo"


def backend() -> str:
    """The backend this job uses (set by the launcher; otherwise chosen from the hardware)."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return os.environ.get(BACKEND_VAR) or pick_backend(local)


def device() -> torch.device:
    """This rank's device: ``cuda:LOCAL_RANK`` under NCCL, the CPU under gloo."""
    if backend() == "nccl":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def default_timeout() -> timedelta:
    """Collective timeout: short (the launcher's limit), not the 10-30 minute defaults."""
    return timedelta(seconds=float(os.environ.get(TIMEOUT_VAR, "120")))


def init_distributed(timeout: timedelta | None = None) -> torch.device:
    """Join the job torchrun started and return this rank's device.

    Each torchrun restart attempt gets its own store prefix. With gloo in
    torch 2.13 an elastic restart otherwise fails to reconnect: the new
    workers read the previous attempt's addresses from the shared store
    (``connectFullMesh`` to stale peers). Keying the prefix on
    ``TORCHELASTIC_RESTART_COUNT`` keeps attempts apart. Across nodes the
    agents may count restarts differently, so a multi-node job gives every
    round a store of its own instead (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``).
    """
    if dist.is_initialized():
        return device()
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    timeout = timeout or default_timeout()
    # Under torchrun the agent hosts the store; workers only connect to it.
    agent_hosts_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    # The agent's store outlives the attempts, so each attempt keys its own. A store rank 0 hosts is
    # new every round (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, as course/slurm/train.sbatch sets): there
    # the key must not be the restart count, which the agents of two nodes can count differently.
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") if agent_hosts_store else "0"
    # Joining gets the default time at least: a short ``timeout`` is for the collectives (a grader's deadlock
    # found in seconds), and on a loaded machine a connection to the store can take longer than that.
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world_size,
        is_master=(rank == 0 and not agent_hosts_store),
        timeout=max(timeout, default_timeout()),
    )
    store = dist.PrefixStore(f"distlab/attempt{attempt}", store)
    if timeout < default_timeout():
        _arrive(store, rank, world_size)
    dev = device()
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    dist.init_process_group(
        backend(), store=store, rank=rank, world_size=world_size, timeout=timeout,
        device_id=dev if dev.type == "cuda" else None,
    )
    return dev


def _arrive(store: dist.Store, rank: int, world_size: int) -> None:
    """Wait, under the store's own (default) timeout, until every rank has come to join. gloo connects each pair
    under the group's timeout, which also bounds how late the last rank may arrive: with a short one (a grader's
    deadlock found in seconds) a rank a few seconds behind the others (its import, a loaded machine) would make
    a timeout of the join. gloo's sends and receives keep the timeout the group is made with (``_set_pg_timeout``
    reaches its collectives only), so the group is still made with the short one, once every rank is here."""
    store.set(f"arrived/{rank}", "1")
    store.wait([f"arrived/{r}" for r in range(world_size)])


# The process groups this process has left, kept until it exits (see :func:`shutdown`).
_ENDED_GROUPS: list = []


@atexit.register
def _free_ended_groups() -> None:
    """Free the groups :func:`shutdown` kept, at exit but while the interpreter is whole: each through its own
    binding (which releases the GIL before joining gloo's threads), not in the interpreter's teardown, where a
    group still alive reached C++'s static destructors with its threads running and the process aborted
    ("terminate called without an active exception", after the job's work was done: seen once in the Slurm
    tier's two-node job, whose torchrun then restarted the workers)."""
    _ENDED_GROUPS.clear()


def shutdown() -> None:
    """Leave the process group if one is open (safe to call twice); the group itself lives on until
    the process exits, so no DDP model built on it can end it.

    ``destroy_process_group`` drops torch's own references to the group, and a
    ``DistributedDataParallel`` still alive (the caller's local, freed when it returns) then holds
    the last one, in its ``Reducer``. Freeing that ``Reducer`` runs ``ProcessGroupGloo``'s
    destructor, which joins gloo's worker threads, with the GIL held (pytorch#56297: the
    ``Reducer``'s binding does not release it); a worker still finishing the last collective
    needs the GIL to free its Python tensor, and the rank hangs there for good (notebook 02's
    sweep, about 1 launch in 10 on a loaded machine). Kept here, the group is freed by nobody
    before the process exits, and a group freed then goes through its own binding, which
    releases the GIL first. The cost is a few idle threads per group left, in a notebook's kernel.
    """
    if dist.is_initialized():
        _ENDED_GROUPS.extend([dist.group.WORLD, *dist.distributed_c10d._world.pg_map])  # subgroups too
        dist.destroy_process_group()


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0"))


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else int(os.environ.get("WORLD_SIZE", "1"))
