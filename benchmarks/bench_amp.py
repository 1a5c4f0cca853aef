"""Mixed precision: bf16 (and fp16) autocast speed and saved-activation memory against float32.

Measured side by side in one process with the reference solution of
exercise 3 (``compare``: warm-up, ``torch.utils.benchmark`` medians), on the
model the grader measures on this device. Targets from the issue (for this
project's CPU, which has avx512_bf16): bf16 at least 1.8x the speed of fp32,
at most 0.55x its activation bytes. The speed target needs bf16 matrix
instructions the CPU may not have (AMX); the table says what was measured.
"""
from __future__ import annotations

import functools

import torch

import distlab
from autograder.checks.ex03_amp import REAL_MODEL
from benchmarks import Row
from distlab.data import seeded_batch
from distlab.models import make_mlp
from distlab.measure.timing import synchronize


def rows() -> list[Row]:
    from solutions.ex03_amp import compare, train_step

    device = distlab.device()  # this rank's device: the GPU when there is one
    cfg = REAL_MODEL["cuda" if device.type == "cuda" else "cpu"]
    x, y = seeded_batch(cfg["batch"], cfg["in_features"], 10, seed=0, device=device)

    def step(dtype, scaler=None):
        model = make_mlp(seed=0, in_features=cfg["in_features"], hidden=cfg["hidden"], depth=cfg["depth"]).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        return functools.partial(train_step, model, opt, x, y, amp_dtype=dtype, scaler=scaler)

    sync = functools.partial(synchronize, device)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # like the grader's ranks; 2 threads on a shared 2-core machine measure the neighbours
    try:
        bf16 = compare(step(None), step(torch.bfloat16), sync=sync, min_run_time=0.5)
        fp16 = compare(step(None), step(torch.float16, torch.amp.GradScaler(device.type)), sync=sync,
                       min_run_time=0.5)
    finally:
        torch.set_num_threads(threads)
    what = f"MLP {cfg['in_features']}-{cfg['hidden']}x{cfg['depth']}, batch {cfg['batch']}, {device.type}, 1 thread"
    return [
        Row("amp", "fp32 step", bf16["baseline_s"] * 1e3, "ms", what),
        Row("amp", "bf16 autocast step", bf16["candidate_s"] * 1e3, "ms", what),
        Row("amp", "bf16 speedup over fp32", bf16["speedup"], "x", "target >= 1.8x (issue, this CPU)"),
        Row("amp", "bf16 saved-activation bytes / fp32", bf16["memory_ratio"], "x",
            "target <= 0.55x; bytes saved for backward (saved_tensors_hooks)"),
        Row("amp", "fp16 + GradScaler speedup over fp32", fp16["speedup"], "x", "same model, same run"),
        Row("amp", "fp16 saved-activation bytes / fp32", fp16["memory_ratio"], "x", "saved_tensors_hooks"),
    ]
