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


def late_rank_joins(late_s: float, timeout_s: float) -> dict:
    """Rank 1 comes to a group with a short timeout ``timeout_s`` (a grader's, to find a deadlock in seconds)
    ``late_s`` later than rank 0; then both all-reduce and both send and receive, under that timeout."""
    from datetime import timedelta

    if int(os.environ["RANK"]) == 1:
        time.sleep(late_s)  # the lateness under test, not a wait for another process
    distlab.init_distributed(timeout=timedelta(seconds=timeout_s))
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    got = torch.zeros(1)
    for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, t, 1 - dist.get_rank()),
                                        dist.P2POp(dist.irecv, got, 1 - dist.get_rank())]):
        work.wait()
    distlab.shutdown()
    return {"sum": t, "got": got}


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

    from distlab.runtime.launch import time_scale

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


def exits_quietly() -> None:
    """Rank 1 leaves with exit code 3 and no Python exception (os._exit); rank 0 then loses its connection."""
    distlab.init_distributed()
    if dist.get_rank() == 1:
        os._exit(3)
    dist.barrier()


def killed_then_raises() -> None:
    """Rank 1 kills itself on the first attempt (its peer then loses the connection); on the second, rank 0
    raises: the job's failure is the second attempt's."""
    distlab.init_distributed()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if attempt == 0:
        if dist.get_rank() == 1:
            os.kill(os.getpid(), 9)
        dist.barrier()
    if dist.get_rank() == 0:
        raise ValueError(f"attempt {attempt} went wrong")
    dist.barrier()


def return_unloadable():
    """Returns an object ``torch.load(weights_only=True)`` refuses."""
    import fractions

    return fractions.Fraction(1, 3)


_DAEMONIZER = (  # a fresh interpreter double-forks: forking a rank itself (torch's threads) can deadlock the child
    "import os, sys\n"
    "if os.fork() == 0:\n"
    "    os.setsid()\n"
    "    pid = os.fork()\n"
    "    if pid == 0:\n"
    "        os.execve(sys.executable, [sys.executable, '-c', 'import time; time.sleep(600)'], {})\n"
    "    open(os.path.join(sys.argv[1], f'daemon.{pid}'), 'w').close()\n"
    "    os._exit(0)\n"
    "os.wait()\n")


def leave_helpers(pid_dir: str) -> int:
    """Rank 0 leaves a detached helper holding the output pipe (a new session) and a real daemon
    (double fork, ``setsid``, ``execve`` with an empty environment, so no job tag); both write
    ``<pid_dir>/<kind>.<pid>``. Every rank then returns its rank at once."""
    distlab.init_distributed()
    rank = dist.get_rank()
    if rank == 0:
        helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
        open(os.path.join(pid_dir, f"helper.{helper.pid}"), "w").close()
        subprocess.run([sys.executable, "-c", _DAEMONIZER, pid_dir], check=True, env={})
    dist.barrier()
    distlab.shutdown()
    return rank


def killed_in_all_reduce() -> None:
    """Rank 1 dies by SIGKILL while rank 0 waits for it in an all-reduce."""
    distlab.init_distributed()
    if dist.get_rank() == 1:
        os.kill(os.getpid(), 9)
    dist.all_reduce(torch.ones(1))


TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                 "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS")


def torchrun_view() -> dict:
    """What a rank sees of its launcher: torchrun's variables (names, and the values that are not
    a port or an id), how many threads, whether it may use CUDA after the fork, and its signal handlers
    (a fork of the agent inherited torch elastic's Python handler, which a rank blocked in C++ outlives)."""
    import signal

    env = {k: v for k, v in os.environ.items() if k in TORCHRUN_VARS or k.startswith("TORCHELASTIC_")}
    for volatile in ("MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE"):
        env[volatile] = "set" if env.get(volatile) else ""
    bad_fork = bool(getattr(torch.cuda, "_is_in_bad_fork", lambda: False)())
    handlers = {sig.name: getattr(signal.getsignal(sig), "__name__", str(signal.getsignal(sig)))
                for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)}
    return {"env": env, "threads": torch.get_num_threads(), "cuda_bad_fork": bad_fork, "signals": handlers}


def sandbox_view(server_pid: int, server_socket: str) -> dict:
    """What a rank in the learner sandbox can do to its launcher: its user, privileges, limits, and
    whether it can signal the warm server or reach its socket."""
    import ctypes
    import resource
    import socket

    status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line)
    pdeathsig = ctypes.c_int()
    ctypes.CDLL(None).prctl(2, ctypes.byref(pdeathsig), 0, 0, 0)  # PR_GET_PDEATHSIG
    out = {"uid": os.getuid(), "euid": os.geteuid(), "no_new_privs": status["NoNewPrivs"].strip(),
           "nproc": resource.getrlimit(resource.RLIMIT_NPROC)[0], "pdeathsig": pdeathsig.value,
           "sees_server_var": "DISTLAB_FORKSERVER" in os.environ}
    try:
        os.kill(server_pid, 0)
        out["signal_server"] = "allowed"
    except PermissionError:
        out["signal_server"] = "refused"
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(server_socket)
        out["connect_server"] = "allowed"
    except OSError as exc:
        out["connect_server"] = type(exc).__name__
    return out


def barrier_while_rank1_sleeps(seconds: float = 600) -> None:
    """Rank 0 waits in a barrier that rank 1 never reaches: it sleeps (a hang at the learner's line)."""
    distlab.init_distributed()
    if dist.get_rank() == 1:
        time.sleep(seconds)
    dist.barrier()


def slow_steps(steps: int, step_s: float) -> int:
    """``steps`` optimizer steps, each ``step_s`` long: slow, and advancing all the way."""
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        model(torch.ones(1, 2)).sum().backward()
        opt.step()
        time.sleep(step_s)
    return steps


def spin() -> None:
    """A loop that keeps a core busy and gets nowhere."""
    while True:
        pass


def tutorial_master_port() -> None:
    """The tutorials' habit inside a torchrun job: a fixed MASTER_PORT, then init_process_group."""
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "localhost", "12355"
    from datetime import timedelta

    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    dist.barrier()


def tutorial_to_rank() -> None:
    """The tutorials' habit on a machine without GPUs: ``tensor.to(rank)``."""
    distlab.init_distributed()
    torch.ones(1).to(dist.get_rank())


def threads_when_ddp_outlives_shutdown() -> dict:
    """This rank's native threads after ``distlab.shutdown()`` and after a DDP model (with a Python comm
    hook, as notebook 02's sweep) built on the group is freed: equal unless freeing it ended the group."""
    import gc

    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    def threads() -> int:
        return len(os.listdir("/proc/self/task"))

    distlab.init_distributed()
    ddp = DDP(torch.nn.Linear(4, 4))
    ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    for _ in range(2):
        ddp(torch.ones(2, 4)).sum().backward()
    distlab.shutdown()
    after_shutdown = threads()
    del ddp
    gc.collect()
    return {"after_shutdown": after_shutdown, "after_ddp_freed": threads()}


def _sleep_on_rank1_at_step(step: int, seconds: float, at: int = 1) -> None:
    if step == at and dist.get_rank() == 1:
        time.sleep(seconds)


def ddp_step_while_rank1_sleeps(seconds: float = 600, at: int = 2) -> None:
    """Rank 1 sleeps before step ``at``. At step 1 rank 0 waits in DDP's broadcast before the forward (its
    buckets are rebuilt after the first step); at step 2, in DDP's all-reduce of the gradients during the
    backward, which the reducer issues from C++, with no Python collective on the stack."""
    distlab.init_distributed()
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
    for step in range(4):
        _sleep_on_rank1_at_step(step, seconds, at)
        model(torch.ones(3, 4)).sum().backward()


class _SlowBackward(torch.autograd.Function):
    """The identity, whose backward takes ``seconds`` on every rank once: a slow backward, not a hang."""

    @staticmethod
    def forward(ctx, x, seconds):
        ctx.seconds = seconds
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        time.sleep(ctx.seconds)
        return grad, None


class _Slow(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.seconds = 0.0

    def forward(self, x):
        return _SlowBackward.apply(x, self.seconds)


def ddp_with_a_slow_backward(seconds: float) -> int:
    """A DDP model whose second backward takes ``seconds`` on both ranks, between its two layers' gradients."""
    distlab.init_distributed()
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(4, 4), _Slow(), torch.nn.Linear(4, 2)))
    for step in range(3):
        model.module[1].seconds = seconds if step == 1 else 0.0
        model(torch.ones(3, 4)).sum().backward()
    return step


def fsdp_step_while_rank1_sleeps(seconds: float = 600, where: str = "forward") -> None:
    """FSDP2 (``fully_shard``): rank 1 sleeps before its second forward, or between its second forward and
    backward; either way rank 0 waits in FSDP's all-gather of the parameters (the backward gathers them again)."""
    from torch.distributed.fsdp import fully_shard

    distlab.init_distributed()
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    for step in range(3):
        if where == "forward":
            _sleep_on_rank1_at_step(step, seconds)
        loss = model(torch.ones(3, 4)).sum()
        if where == "backward":
            _sleep_on_rank1_at_step(step, seconds)
        loss.backward()


def pipeline_while_rank1_sleeps(seconds: float = 600) -> None:
    """``torch.distributed.pipelining``'s GPipe schedule on 2 stages: rank 1 (the last stage) sleeps before
    its second step; rank 0 waits in the schedule's send/receive."""
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    distlab.init_distributed()
    rank = dist.get_rank()
    torch.manual_seed(0)
    stage = PipelineStage(torch.nn.Linear(4, 4), rank, 2, torch.device("cpu"))
    schedule = ScheduleGPipe(stage, n_microbatches=2, loss_fn=lambda out, target: out.sum())
    for step in range(3):
        _sleep_on_rank1_at_step(step, seconds)
        if rank == 0:
            schedule.step(torch.ones(4, 4))
        else:
            schedule.step(target=torch.ones(4, 4))
