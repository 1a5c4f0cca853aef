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


def allreduce_on_device() -> dict:
    """All-reduce ``rank + 1`` on this rank's device (its GPU under NCCL); the sum comes back on the CPU."""
    dev = distlab.init_distributed()
    t = torch.tensor([float(dist.get_rank() + 1)], device=dev)
    dist.all_reduce(t)
    out = {"rank": dist.get_rank(), "backend": dist.get_backend(), "device": str(t.device), "sum": t.cpu()}
    distlab.shutdown()
    return out


def raise_on_rank1() -> None:
    distlab.init_distributed()
    if dist.get_rank() == 1:
        raise ValueError("rank one is unhappy")
    dist.barrier()


def _announce(path: str, pid: int) -> None:
    """Write "pid create_time" to ``path`` (atomically: a reader never sees half a line). With the
    creation time a test tells this process from a later one that reuses its pid."""
    import psutil

    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(f"{pid} {psutil.Process(pid).create_time()!r}")
    os.replace(tmp, path)


def hang(pid_file: str) -> None:
    """Every rank sleeps far past the launch timeout; rank 0 also starts a grandchild that does too.
    Each announces itself in ``<pid_file>.<rank>`` (the grandchild in ``<pid_file>.child``).

    (A rank stuck in a collective would instead fail at the process group's timeout, which the
    launcher sets below its own, naming that rank.)
    """
    distlab.init_distributed()
    if dist.get_rank() == 0:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        _announce(f"{pid_file}.child", child.pid)
    _announce(f"{pid_file}.{dist.get_rank()}", os.getpid())
    time.sleep(600)


def port_while_jobs_overlap(meeting_dir: str, jobs: int, timeout: float = 60.0) -> dict:
    """Return this job's rendezvous port once ``jobs`` jobs are all inside their process groups.

    Rank 0 of each job leaves a file in ``meeting_dir`` and waits (polling, bounded) for the other
    jobs' files; then the ranks of the job meet at a barrier. So all the jobs hold their ports at
    the same moment, and two equal ports would be a real collision, not a reuse after one job ended.
    """
    from pathlib import Path

    from distlab.launch import time_scale

    distlab.init_distributed()
    port = os.environ["MASTER_PORT"]
    if dist.get_rank() == 0:
        Path(meeting_dir, f"job-{os.getpid()}").write_text(port)
        timeout *= time_scale()  # a bound, scaled like the launch's own
        deadline = time.monotonic() + timeout
        while len(list(Path(meeting_dir).glob("job-*"))) < jobs:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the other jobs never joined within {timeout:g} s: they did not overlap")
            time.sleep(0.05)  # polling interval
    dist.barrier()
    out = {"rank": dist.get_rank(), "port": port}
    distlab.shutdown()
    return out


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
