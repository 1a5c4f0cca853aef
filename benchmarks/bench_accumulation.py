"""Gradient accumulation at a fixed effective batch: throughput, activation memory, all-reduces.

The reference solution of exercise 2 at world size 2 for k = 1, 2, 4, 8
micro-batches per optimizer step, always 256 samples per rank per step
(:func:`distlab.lab.accumulation.sweep`). The expected shape: activation memory
falls as 1/k (one micro-batch alive at a time), all-reduces stay at one per
step (``no_sync``), and throughput drops as k grows (smaller matmuls, more
Python per sample).
"""
from __future__ import annotations

import distlab
from benchmarks import Row
from distlab.lab.accumulation import sweep


def rows() -> list[Row]:
    run = distlab.torchrun(sweep, 2, kwargs=dict(train="solutions.ex02_accumulation:train_accumulated"),
                           timeout=300)
    res = run.results[0]
    note = f"W=2, 256 samples/rank/step, {res[0]['memory_method']}"
    table = []
    for r in res:
        table += [
            Row("accumulation", f"k={r['k']} (micro-batch {r['micro_batch']}) throughput", r["samples_per_s"],
                "samples/s", "reference solution, median of 5 x 5 steps, slowest rank"),
            Row("accumulation", f"k={r['k']} activation memory of one micro-step", r["activation_bytes"] / 2**20,
                "MiB", note),
            Row("accumulation", f"k={r['k']} all-reduce rounds per optimizer step", r["allreduce_per_step"],
                "calls", "counted with a DDP comm hook; 1 expected for every k"),
        ]
    return table
