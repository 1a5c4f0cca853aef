"""Checkpointing: DCP save and load time, size per rank, and time from a crash to training again.

Exercise 5's model and optimizer (reference solution's ``build``: a sharded
ResidualMLP with Adam) at W=2. Save = ``dcp.save`` into the staging
directory + barrier + atomic commit; load = ``dcp.load`` + ``set_state_dict``.
Each is timed 5 times after a warm-up, the slowest rank's time taken
(``distlab.measure.timing.slowest_rank``: ``all_reduce(MAX)`` on the rank's device),
the median reported. Crash to resume: rank 1 SIGKILLs itself after step 4 of the reference solution's ``train`` under
``torchrun --max-restarts=1``; the time runs from just before the kill to the
end of the first step of the restarted attempt (process start, imports,
rendezvous, load, one step). Timings on a shared CPU and local disk are this
machine's; on a cluster, storage bandwidth dominates.
"""
from __future__ import annotations

import json
import os
import signal
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

import distlab
from benchmarks import Row
from distlab.measure.timing import slowest_rank, synchronize


def save_load(root: str) -> dict:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from distlab.checkpoint import commit, final_path, prune, size_bytes, staging_path
    from solutions.ex05_checkpoint import build

    dev = distlab.init_distributed()
    model, opt, _ = build(10, seed=0)  # on this rank's device
    opt.zero_grad()
    model(torch.randn(16, 64, device=dev)).sum().backward()
    opt.step()
    saves, loads = [], []
    for i in range(6):
        dist.barrier()
        t = time.perf_counter()
        msd, osd = get_state_dict(model, opt)
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=staging_path(root, i))
        dist.barrier()
        if dist.get_rank() == 0:
            commit(root, i)
            prune(root, keep=1)
        dist.barrier()
        saves.append(slowest_rank(time.perf_counter() - t, dev))
        t = time.perf_counter()
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd}
        dcp.load(state, checkpoint_id=final_path(root, i))
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        synchronize(dev)
        loads.append(slowest_rank(time.perf_counter() - t, dev))
    sizes = size_bytes(final_path(root, 5)) if dist.get_rank() == 0 else {}
    distlab.shutdown()
    return {"save": statistics.median(saves[1:]), "load": statistics.median(loads[1:]), "sizes": sizes}


def crash_and_resume(root: str, stamps: str) -> None:
    from distlab.data import synthetic_classification
    from solutions.ex05_checkpoint import train

    distlab.init_distributed()
    rank, attempt = dist.get_rank(), int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    def on_step(step, optimizer):
        if rank != 1:
            return
        if attempt == 0 and step == 4:
            Path(stamps, "killed").write_text(json.dumps(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        if attempt == 1 and not Path(stamps, "resumed").exists():
            Path(stamps, "resumed").write_text(json.dumps(time.time()))

    train(root, synthetic_classification(256, 64, 10), steps=6, save_every=3, keep=2, seed=0, on_step=on_step)
    distlab.shutdown()


def rows() -> list[Row]:
    with tempfile.TemporaryDirectory(prefix="bench-ckpt-") as tmp:
        res = distlab.torchrun(save_load, 2, args=(str(Path(tmp) / "a"),), timeout=180).results[0]
        run = distlab.torchrun(crash_and_resume, 2, args=(str(Path(tmp) / "b"), tmp), max_restarts=1, timeout=180)
        gap = json.loads(Path(tmp, "resumed").read_text()) - json.loads(Path(tmp, "killed").read_text())
    shards = {k: v for k, v in res["sizes"].items() if k.endswith(".distcp")}
    out = [Row("checkpoint", "DCP save (sharded, atomic commit), W=2", res["save"] * 1e3, "ms",
               "median of 5 after a warm-up, slowest rank"),
           Row("checkpoint", "DCP load + set_state_dict, W=2", res["load"] * 1e3, "ms",
               "median of 5 after a warm-up, slowest rank")]
    out += [Row("checkpoint", f"size of {name} (model + Adam shard)", size / 1024, "KiB",
                f".metadata {res['sizes'].get('.metadata', 0) / 1024:.1f} KiB") for name, size in shards.items()]
    out.append(Row("checkpoint", "SIGKILL of rank 1 -> first step done after torchrun restart", gap, "s",
                   f"includes process start, imports, rendezvous, load; whole job {run.wall_s:.1f} s"))
    return out
