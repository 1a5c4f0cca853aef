"""Context parallelism (ring attention, Liu et al. 2023) measured against its arithmetic.

One job of W ranks (distlab.lab.context_parallel.jobs.cp_job), sequence 1024, 4 heads of 32:

* causal work: the busiest rank's time over the mean rank's, contiguous shards and zig-zag (Llama 3's
  layout, section 3.3.2), beside the counted blocks' ratio (contiguous 2 - 1/W for the pairs; zig-zag 1), each
  rank timed alone so the ranks do not share cores;
* zig-zag's busiest rank over contiguous's busiest: the causal ring's speed-up from balancing;
* peak bytes per rank of the ring's forward over one process's whole-sequence attention, beside W^2
  (the scores' share, which dominates as S grows);
* bytes each rank sends in the forward over 2 (W - 1) shards (target exactly 1);
* the ring's time over its compute alone: the communication not hidden (on 2 cores, gloo copies
  through the loopback on the same cores: no overlap to be had).

W = 4 needs 4 cores; on fewer the job runs at W = 2.
"""
from __future__ import annotations

from distlab.lab.context_parallel.jobs import run_cp_job
from distlab.lab.context_parallel.sharding import work_per_rank
from distlab.measure.timing import cpu_cores

from . import Row

SEQ = 1024


def rows() -> list[Row]:
    w = 4 if cpu_cores() >= 4 else 2
    runs = run_cp_job(w, seq=SEQ)
    out = []
    busiest = {}
    for layout in ("contiguous", "zigzag"):
        times = [r["work"][layout]["seconds"] for r in runs]
        blocks = [c["blocks"] for c in work_per_rank(layout, SEQ, w)]
        busiest[layout] = max(times)
        out.append(Row("context-parallel", f"causal work, busiest rank / mean, {layout}, W={w}",
                       max(times) / (sum(times) / w), "ratio",
                       f"counted blocks {max(blocks) / (sum(blocks) / w):.2f}; ms per rank "
                       f"{[round(t * 1e3, 2) for t in times]}"))
    out.append(Row("context-parallel", f"causal ring, zig-zag's busiest rank / contiguous's, W={w}",
                   busiest["zigzag"] / busiest["contiguous"], "ratio", "below 1: balancing pays"))
    mem = runs[0]["memory"][-1]
    out.append(Row("context-parallel", f"peak bytes per rank / whole sequence, S={mem['seq']}, W={w}",
                   mem["ring_peak"] / mem["whole_peak"], "ratio", f"scores alone: 1/W^2 = {1 / w ** 2:.3f}"))
    p = runs[0]["parity"]
    out.append(Row("context-parallel", f"forward bytes sent per rank / 2 (W-1) shards, W={w}",
                   p["bytes"] / (2 * (w - 1) * p["shard_bytes"]), "ratio", "target exactly 1"))
    o = runs[0]["overlap"]
    out.append(Row("context-parallel", f"ring forward / its compute alone, S={SEQ}, W={w}",
                   o["ring_s"] / o["compute_s"], "ratio",
                   f"ring {o['ring_s'] * 1e3:.2f} ms, compute {o['compute_s'] * 1e3:.2f} ms"))
    return out
