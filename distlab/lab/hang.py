"""Hangs made on purpose, and the tools that say where each rank is stuck.

A collective completes only when every rank of the group calls it, with
matching arguments, in the same order. A rank that skips one (a branch taken
on some ranks only) or calls two in another order leaves its peers waiting,
silently, until the process group's timeout (gloo: 30 minutes by default,
NCCL: 10). Three tools find the culprit (PyTorch's "Distributed debugging"
documentation; NCCL's flight recorder is the GPU counterpart):

* ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` wraps the process group so that before
  every collective the ranks compare fingerprints (operation, shapes, dtypes)
  and raise "Detected mismatch between collectives on ranks" instead of
  hanging (:func:`mismatched_order`, launched by :func:`detail_report`);
* ``dist.monitored_barrier(wait_all_ranks=True)`` (gloo) waits for every rank
  with a timeout and names the ranks that never came (:func:`skipped_collective`);
* a stack dump of every rank: ``faulthandler.register(SIGUSR1)`` makes a rank
  write every thread's Python stack when signalled (nothing to install), and
  ``py-spy dump --pid`` reads it from outside, if py-spy may ptrace the rank
  (:class:`StackDumper`, used by :func:`stuck_job`).

Every launch is bounded: the collectives' timeout is short, and the job's.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from distlab.runtime.failures import LaunchError
from distlab.runtime.launch import time_scale, torchrun

ANSI = re.compile(r"\x1b\[[0-9;]*m")  # py-spy colours its output when a kernel's environment asks for colour
BLOCKING = re.compile(r"^\[rank(\d+)\] blocking in (\S+): pid (\d+)$")
BARRIER = re.compile(r"^\[rank(\d+)\] monitored_barrier raised: (.*)$")
ERROR = re.compile(r"^\[rank(\d+)\] (?:[\w.]+\.)?(\w*(?:Error|Exception)): (.*)$")


def mismatched_order(timeout_s: float = 10.0) -> None:
    """Runs on every rank: both ranks reduce two metrics, in a different order (a dict built in
    another order on each rank). Without DETAIL gloo hangs until ``timeout_s``; with it, both raise."""
    import torch
    import torch.distributed as dist

    from distlab.runtime.distributed import init_distributed

    init_distributed(timeout=timedelta(seconds=timeout_s * time_scale()))
    metrics = {"loss": torch.ones(1), "per_class_correct": torch.ones(10)}
    order = list(metrics) if dist.get_rank() == 0 else list(reversed(metrics))
    for name in order:
        dist.all_reduce(metrics[name])


def skipped_collective(stack_dir: str, barrier_timeout_s: float) -> None:
    """Runs on every rank: rank 0 skips an all-reduce that rank 1 enters (rank 0 had no samples left,
    say) and goes on to ``monitored_barrier``, which names rank 1 after ``barrier_timeout_s``. Each
    rank first arms ``faulthandler`` to write its stacks to ``stack_dir/rank{r}.txt`` on SIGUSR1,
    then announces the collective it is about to block in, with its pid."""
    import faulthandler

    import torch
    import torch.distributed as dist

    from distlab.runtime.distributed import init_distributed

    init_distributed()
    rank = dist.get_rank()
    dump = open(Path(stack_dir) / f"rank{rank}.txt", "w")  # kept open: faulthandler writes to its fd
    faulthandler.register(signal.SIGUSR1, file=dump, all_threads=True)
    if rank != 0:
        print(f"blocking in all_reduce: pid {os.getpid()}", flush=True)
        dist.all_reduce(torch.ones(4))  # rank 0 never comes
    print(f"blocking in monitored_barrier: pid {os.getpid()}", flush=True)
    try:
        dist.monitored_barrier(timeout=timedelta(seconds=barrier_timeout_s), wait_all_ranks=True)
    except RuntimeError as exc:
        # Said at once: gloo closes the connections as it gives up, so rank 1 fails next, and the
        # launcher then ends this rank, perhaps before its traceback is printed.
        print(f"monitored_barrier raised: {exc}", flush=True)
        raise


def rank_errors(output: str) -> dict[int, str]:
    """The exception each rank printed (its last one), from a job's output: ``{rank: "Type: message"}``."""
    found = {}
    for line in output.splitlines():
        m = ERROR.match(line)
        if m:
            found[int(m[1])] = f"{m[2]}: {m[3]}"
    return found


def detail_report(timeout: float = 60.0) -> dict:
    """Launch :func:`mismatched_order` on 2 ranks with ``TORCH_DISTRIBUTED_DEBUG=DETAIL``: returns
    ``{"error": the launcher's one line, "reports": {rank: that rank's mismatch report}}``.

    Both ranks detect the mismatch, but the first to fail makes torchrun end the other, which may
    then die of the SIGTERM before it raises: only the ranks whose error is the mismatch report."""
    try:
        torchrun(mismatched_order, 2, timeout=timeout, env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    except LaunchError as exc:
        reports = {rank: text for rank, text in rank_errors(exc.output).items()
                   if "Detected mismatch between collectives" in text}
        return {"error": str(exc), "reports": reports}
    raise AssertionError("the mismatched collectives completed: DETAIL did not catch them")


def py_spy() -> str | None:
    """The py-spy executable beside this Python (a pip install puts it there) or on PATH."""
    here = Path(sys.executable).with_name("py-spy")
    return str(here) if here.exists() else shutil.which("py-spy")


def _main_stack(text: str, marker: str) -> str | None:
    """The last faulthandler dump's block (one thread's frames) that contains ``marker``."""
    blocks = re.split(r"\n(?=(?:Current thread|Thread) 0x)", text)
    mine = [b.strip() for b in blocks if marker in b]
    return mine[-1] if mine else None


class StackDumper:
    """An ``on_line`` callback for :func:`distlab.torchrun`: once every rank has announced the
    collective it blocks in, dump each rank's stack with faulthandler (SIGUSR1, read back from its
    file; signalled again until the innermost frame is inside ``torch.distributed``: the
    announcement comes just before the call) and with ``py-spy dump`` where py-spy can attach."""

    def __init__(self, nprocs: int, stack_dir: Path, within: float = 10.0):
        self.nprocs, self.stack_dir, self.within = nprocs, Path(stack_dir), within
        self.pids: dict[int, int] = {}
        self.created: dict[int, float | None] = {}
        self.blocked_in: dict[int, str] = {}
        self.faulthandler: dict[int, str] = {}
        self.py_spy: dict[int, str] = {}

    def __call__(self, line: str) -> None:
        m = BLOCKING.match(line)
        if m:
            self.blocked_in[int(m[1])], self.pids[int(m[1])] = m[2], int(m[3])
            self.created[int(m[1])] = _created(int(m[3]))  # pid and creation time: pids are reused
            if len(self.pids) == self.nprocs and not self.faulthandler:
                for rank, pid in sorted(self.pids.items()):
                    self.faulthandler[rank] = self._faulthandler(rank, pid)
                    self.py_spy[rank] = self._py_spy(pid)

    def _faulthandler(self, rank: int, pid: int) -> str:
        path = self.stack_dir / f"rank{rank}.txt"
        deadline = time.monotonic() + self.within * time_scale()
        stack = None
        while time.monotonic() < deadline:
            if _created(pid) != self.created[rank]:  # the rank has exited (its pid may be reused)
                break
            try:
                os.kill(pid, signal.SIGUSR1)
            except OSError as exc:  # gone already, or another user's process
                return f"(could not signal rank {rank}: {exc})"
            time.sleep(0.05)  # the polling interval: the handler writes within microseconds
            stack = _main_stack(path.read_text(), "skipped_collective")
            if stack and "distributed_c10d.py" in (stack.splitlines() + ["", ""])[1]:
                break
        return stack or f"(rank {rank} wrote no stack to {path.name})"

    def _py_spy(self, pid: int) -> str:
        exe = py_spy()
        if exe is None:
            return "(py-spy is not installed: pip install py-spy)"
        try:
            proc = subprocess.run([exe, "dump", "--pid", str(pid)], capture_output=True, text=True,
                                  timeout=30 * time_scale())
        except subprocess.TimeoutExpired:
            return "(py-spy did not answer in time)"
        if proc.returncode != 0:
            return f"(py-spy could not attach: {ANSI.sub('', proc.stderr).strip()})"
        return ANSI.sub("", proc.stdout).strip()


def stuck_job(barrier_timeout_s: float = 3.0, timeout: float = 60.0) -> dict:
    """Launch :func:`skipped_collective` on 2 ranks, dump both ranks' stacks while they are stuck,
    and let rank 0's monitored barrier end the job. Returns the launcher's error line (whichever
    rank's error came first: rank 0's, or rank 1's lost connection), every rank's own error
    (``rank_errors``), what the monitored barrier raised on rank 0, where each rank said it
    blocked, the two kinds of stack dump, and the ranks' processes still running (none)."""
    barrier_timeout_s *= time_scale()
    with tempfile.TemporaryDirectory(prefix="distlab-stacks-") as tmp:
        dumper = StackDumper(2, Path(tmp))
        try:
            torchrun(skipped_collective, 2, args=(tmp, barrier_timeout_s), timeout=timeout, stream=dumper)
        except LaunchError as exc:
            said = {int(m[1]): m[2] for m in map(BARRIER.match, exc.output.splitlines()) if m}
            return {"error": str(exc), "errors": rank_errors(exc.output), "monitored_barrier": said,
                    "blocked_in": dumper.blocked_in,
                    "faulthandler": dumper.faulthandler, "py_spy": dumper.py_spy,
                    "left_running": _alive(dumper.pids, dumper.created)}
    raise AssertionError("the job with a skipped collective completed")


def _created(pid: int) -> float | None:
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        return None


def _alive(pids: dict[int, int], created: dict[int, float | None]) -> list[int]:
    """The ranks' processes still running (the same pid *and* creation time, not a zombie)."""
    import psutil

    alive = []
    for rank, pid in pids.items():
        try:
            proc = psutil.Process(pid)
            if proc.create_time() == created.get(rank) and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            continue
    return alive


def short_report(message: str) -> str:
    """A DETAIL mismatch report without the tensors' ``TensorOptions(...)`` (device, layout, flags),
    one clause a line: what this rank runs, what the peer runs, how they differ."""
    text = re.sub(r", TensorDeviceTypes=TensorOptions\(.*?\(nullopt\)\)", "", message)
    text = re.sub(r" {2,}", " ", text)  # the report pads its clauses with runs of spaces
    return text.replace(", but Rank", ",\n  but Rank").replace(".Collectives differ", ".\n  Collectives differ")


# Exercise 9's job (notebook 09): data-parallel steps whose local batches keep some samples only, and
# at some steps none (rank 1 at step 1; every rank at step 4). The data, not the answer: the grader
# builds every rank's batches from here, and so does the notebook's demonstration of the hang.
KEEP_D, KEEP_H, KEEP_C, KEEP_B, KEEP_STEPS = 8, 16, 4, 6, 6   # features, hidden, classes, local batch, steps
EMPTY_STEPS = {0: (4,), 1: (1, 4)}   # rank -> the steps at which it keeps no sample
_SEED = 9


def small_classifier():
    """The job's model, with the same initial weights in every process."""
    import torch
    from torch import nn

    with torch.random.fork_rng():
        torch.manual_seed(_SEED)
        return nn.Sequential(nn.Linear(KEEP_D, KEEP_H), nn.Tanh(), nn.Linear(KEEP_H, KEEP_C))


def masked_batch(rank: int, step: int):
    """Rank ``rank``'s batch at ``step``: ``x`` (B x D), ``y`` (B classes), ``keep`` (B booleans: which
    samples count, as padding or an ignored label would not), all False at :data:`EMPTY_STEPS`."""
    import torch

    gen = torch.Generator().manual_seed(1000 * _SEED + 10 * step + rank)
    x, y = torch.randn(KEEP_B, KEEP_D, generator=gen), torch.randint(0, KEEP_C, (KEEP_B,), generator=gen)
    keep = torch.rand(KEEP_B, generator=gen) > 0.4
    keep[0] = step not in EMPTY_STEPS.get(rank, ())   # one sample at least, except where this rank has none
    if not keep[0]:
        keep[:] = False
    return x, y, keep


def masked_job(path: str) -> None:
    """Runs on every rank: ``train_broken`` (or ``train``) of the exercise file at ``path`` on this rank's
    batches (:func:`masked_batch`), printing each step it takes, as a learner's print would."""
    import runpy

    import torch.distributed as dist

    from distlab.runtime.distributed import init_distributed

    init_distributed(timeout=timedelta(seconds=2 * time_scale()))  # the collectives give up soon
    rank, train = dist.get_rank(), runpy.run_path(path)["train_broken"]

    def batches():
        for step in range(KEEP_STEPS):
            x, y, keep = masked_batch(rank, step)
            print(f"step {step}: {int(keep.sum())} samples to keep", flush=True)
            yield x, y, keep

    train(small_classifier(), batches(), lr=0.5)
    print("returned from train", flush=True)
