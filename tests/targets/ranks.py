"""Small rank programs the launcher tests run under torchrun."""
import os
import subprocess
import sys
import time

import torch
import torch.distributed as dist

import distlab


def allreduce_rank() -> dict:
    distlab.init_distributed()
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    print(f"sum is {t.item():g}")
    out = {"rank": dist.get_rank(), "world": dist.get_world_size(), "sum": t,
           "backend": dist.get_backend(), "port": os.environ["MASTER_PORT"]}
    distlab.shutdown()
    return out


def raise_on_rank1() -> None:
    distlab.init_distributed()
    if dist.get_rank() == 1:
        raise ValueError("rank one is unhappy")
    dist.barrier()


def hang(pid_file: str) -> None:
    """Every rank sleeps far past the launch timeout; rank 0 also starts a grandchild that does too.

    (A rank stuck in a collective would instead fail at the process group's timeout, which the
    launcher sets below its own, naming that rank.)
    """
    distlab.init_distributed()
    with open(f"{pid_file}.{dist.get_rank()}", "w") as f:
        f.write(str(os.getpid()))
    if dist.get_rank() == 0:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        with open(f"{pid_file}.child", "w") as f:
            f.write(str(child.pid))
    time.sleep(600)


def sigkill_first_attempt() -> int:
    """Rank 1 kills itself on the first attempt; with --max-restarts the job still finishes."""
    distlab.init_distributed()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if attempt == 0 and dist.get_rank() == 1:
        os.kill(os.getpid(), 9)
    dist.barrier()
    return attempt


def return_unloadable():
    """Returns an object ``torch.load(weights_only=True)`` refuses."""
    import fractions

    return fractions.Fraction(1, 3)
