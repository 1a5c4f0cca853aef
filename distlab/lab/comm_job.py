"""The one job behind notebook 09 and ``make bench``'s comm rows: every measurement of communication
on the same ranks, in one launch (starting ranks costs seconds; the measurements, milliseconds).

In order, on every rank: DDP's bucket sweep with a profiler trace per configuration
(:mod:`distlab.lab.ddp_overlap`, Li et al., 2020), the bytes one step sends under DDP and FSDP
(:mod:`distlab.measure.comm`, Rajbhandari et al., 2020), an all-reduce against a reduce-scatter plus
an all-gather, all-reduce bus bandwidth from 4 KiB to 16 MiB with the latency-bandwidth fit
(:mod:`distlab.lab.bandwidth`), and the MFU of exercise 6's workload (:mod:`distlab.lab.mfu`, Chowdhery
et al., 2022).
"""
from __future__ import annotations

import time

import torch.distributed as dist

#: All-reduce sizes for the bandwidth curve: 4 KiB to 16 MiB.
SIZES = [4 << (2 * k) for k in range(5, 12)]


class _Progress:
    """Rank 0 says what starts, and every part's seconds are kept (``out["seconds"]``)."""

    def __init__(self):
        self.seconds, self.last, self.part = {}, time.perf_counter(), None

    def __call__(self, part: str | None) -> None:
        now = time.perf_counter()
        if self.part:
            self.seconds[self.part] = now - self.last
        self.part, self.last = part, now
        if part and dist.get_rank() == 0:
            print(f"{part} ...", flush=True)


def communication(trace_dir: str | None = None, sizes: list[int] = SIZES, mfu: dict | None = None,
                  profile_steps: int = 1, configs: list[dict] | None = None) -> dict:
    """Runs on every rank (initialises and shuts down the process group): every measurement above.
    ``trace_dir``: where the default DDP configuration's per-rank traces are kept; ``configs``: the
    DDP options swept (default :data:`distlab.lab.ddp_overlap.CONFIGS`)."""
    from distlab.lab import comm_volume
    from distlab.lab import ddp_overlap
    from distlab.lab.bandwidth import allreduce_bandwidth, fit_latency_bandwidth
    from distlab.runtime.distributed import backend, init_distributed, shutdown
    from distlab.lab.mfu import scaling_mfu

    init_distributed()
    out = {"world": dist.get_world_size(), "backend": backend()}
    progress = _Progress()
    progress("DDP bucket sweep")
    out["ddp"] = ddp_overlap.sweep(configs or ddp_overlap.CONFIGS, trace_dir=trace_dir, steps=profile_steps)
    progress("bytes per step, DDP and FSDP")
    out["bytes"] = comm_volume.measure_step_bytes()
    progress("all-reduce against reduce-scatter + all-gather")
    out["rs_ag"] = comm_volume.allreduce_as_rs_ag()
    progress("all-reduce bus bandwidth")
    # Small messages cost microseconds and vary most: time more of them (the large ones dominate the time).
    out["bandwidth"] = allreduce_bandwidth([s for s in sizes if s <= 256 << 10], calls=20, repeats=5) \
        + allreduce_bandwidth([s for s in sizes if s > 256 << 10])
    out["fit"] = fit_latency_bandwidth(out["bandwidth"], out["world"])
    progress("MFU of exercise 6's workload")
    out["mfu"] = scaling_mfu(**(mfu or {}))
    progress(None)
    out["seconds"] = progress.seconds
    shutdown()
    return out


def mfu_only(**kwargs) -> dict:
    """Runs on every rank (initialises and shuts down): only :func:`distlab.lab.mfu.scaling_mfu`, for a
    job of more ranks than the full measurement needs (``make bench`` at W = 4)."""
    from distlab.runtime.distributed import init_distributed, shutdown
    from distlab.lab.mfu import scaling_mfu

    init_distributed()
    out = scaling_mfu(**kwargs)
    shutdown()
    return out
