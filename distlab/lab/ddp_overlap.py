"""DDP's buckets, measured on every rank: how many, when their all-reduce runs, what the options change.

Li et al., 2020 ("PyTorch Distributed", VLDB, section 3.2): DDP reduces
gradients in buckets of about ``bucket_cap_mb`` MiB (25 by default), filled in
the reverse order of the parameters, which is roughly the order backward
produces their gradients; a bucket's all-reduce starts when its last gradient
is ready. Small buckets start communicating early and overlap more of the
backward, at a per-message cost each; one bucket for the whole model cannot
start before backward ends. What torch 2.13 does beyond the paper, and what
:func:`sweep` measures:

* *The first iteration uses one bucket* for everything (the order in which
  gradients become ready is not known yet); at the second, DDP rebuilds the
  buckets in the order it observed. With ``static_graph=True`` the rebuild
  waits one more iteration; ``find_unused_parameters=True`` buckets in
  reverse parameter order from the start, never rebuilds, and all-reduces a
  map of the parameters each step used (one collective more per step).
* *The default is not ``bucket_cap_mb=25``*: left unset, the first bucket (the
  last layers' gradients, ready first) is capped at 1 MiB
  (``dist._DEFAULT_FIRST_BUCKET_BYTES``) so communication starts sooner.
  A bucket closes once it holds at least its cap, so it exceeds the cap by up
  to one parameter: a parameter is never split.
* ``gradient_as_bucket_view=True`` makes each ``.grad`` a view into its
  bucket: no second copy of the gradients, no copy back after the all-reduce.

A comm hook (:class:`distlab.measure.ddp_hooks.BucketLog`) logs every bucket DDP hands over, per
iteration: its index, its bytes, the storage it lives in; it then reduces the
bucket as DDP's built-in path does (``default_hooks.allreduce_hook``: divide
by the world size, all-reduce), one Python call per bucket more.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from distlab.data import seeded_batch
from distlab.measure.ddp_hooks import BucketLog
from distlab.models import sgd_step
from distlab.measure.profiling import profile_steps, summarize, trace_spans
from distlab.resmlp import make_resmlp

#: 8.4 M parameters, 34 MB of fp32 gradients: 25 MB buckets give several, 100 MB gives one.
MODEL = dict(in_features=64, hidden=1024, out_features=10, depth=2)
BATCH = 64
#: The sweep: ``bucket_cap_mb`` (None: DDP's default) and the other options, one DDP each.
CONFIGS = [
    {"label": "1 MB", "bucket_cap_mb": 1},
    {"label": "25 MB", "bucket_cap_mb": 25},
    {"label": "default (25 MB, first 1 MB)"},
    {"label": "100 MB (one bucket)", "bucket_cap_mb": 100},
    {"label": "default + gradient_as_bucket_view", "gradient_as_bucket_view": True},
    {"label": "default + static_graph", "static_graph": True},
]
#: ``make bench`` adds the option static_graph replaces: a graph traversal and a bitmap all-reduce a step.
BENCH_CONFIGS = CONFIGS + [{"label": "default + find_unused_parameters", "find_unused_parameters": True}]


def _grad_bytes_outside_buckets(model: torch.nn.Module, bucket_storages: set[int]) -> int:
    """Bytes of ``.grad`` storages that are not a bucket: the second copy of the gradients."""
    seen = {}
    for p in model.parameters():
        if p.grad is not None and p.grad.untyped_storage().data_ptr() not in bucket_storages:
            seen[p.grad.untyped_storage().data_ptr()] = p.grad.untyped_storage().nbytes()
    return sum(seen.values())


def run_config(config: dict, device: torch.device, trace: Path, steps: int = 1) -> dict:
    """One DDP on this rank: two untimed iterations (the bucket rebuild), then ``1 + steps``
    profiled ones (the first discarded); return the trace's figures, this rank's spans and the
    buckets of every iteration."""
    kwargs = {k: v for k, v in config.items() if k != "label"}
    model = make_resmlp(0, **MODEL).to(device)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None, **kwargs)
    log = BucketLog().register(ddp)  # every step is one backward: one round of buckets
    x, y = seeded_batch(  # each rank its own samples
        BATCH, MODEL["in_features"], MODEL["out_features"], seed=dist.get_rank(), device=device)
    step = sgd_step(ddp, x, y, lr=1e-3)
    for _ in range(2):  # iteration 0: one bucket; 1: rebuilt (2 with static_graph: the profiler's warm-up)
        step()
    profile_steps(step, steps, trace, cuda=device.type == "cuda")
    spans, steps_at = trace_spans(trace)
    last = {b.storage for b in log.in_round(-1)}
    return {**summarize(trace), "label": config["label"], "options": kwargs,
            "spans": [(s.kind, s.phase, s.start, s.end) for s in spans], "steps": steps_at,
            "buckets": log.bytes_per_round(),
            "grad_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
            # the last iteration's buckets only: a freed bucket's address may be reused by a .grad
            "grad_copy_bytes": _grad_bytes_outside_buckets(model, last)}


def sweep(configs: list[dict] = CONFIGS, trace_dir: str | None = None, keep: str = CONFIGS[2]["label"],
          steps: int = 1) -> list[dict]:
    """Runs on every rank of an initialised job: :func:`run_config` for each config. The trace of
    the config labelled ``keep`` is left in ``trace_dir`` as ``ddp_rank{r}.json`` (the others go
    to a temporary folder)."""
    from distlab.runtime.distributed import device as rank_device

    rank, device = dist.get_rank(), rank_device()
    out = []
    with tempfile.TemporaryDirectory(prefix="distlab-trace-") as tmp:
        for config in configs:
            if rank == 0:
                print(f"  DDP {config['label']}", flush=True)
            kept = trace_dir is not None and config["label"] == keep
            path = Path(trace_dir if kept else tmp) / (f"ddp_rank{rank}.json" if kept else "trace.json")
            out.append(run_config(config, device, path, steps))
            dist.barrier()  # the next config starts on every rank together
    return out
