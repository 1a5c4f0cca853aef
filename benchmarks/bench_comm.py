"""Communication made visible (notebook 09), measured side by side in one job of 2 ranks.

* DDP's overlap of gradient all-reduce with backward (Li et al., 2020, "PyTorch Distributed",
  VLDB) for each ``bucket_cap_mb``, ``gradient_as_bucket_view``, ``static_graph`` and
  ``find_unused_parameters``: overlap = |comm ∩ compute| / |comm| read from each rank's
  ``torch.profiler`` trace (3 recorded steps), the step time of the slower rank beside it;
* the bytes one training step sends per rank, counted under DDP and FSDP2 (a TorchDispatchMode
  on the c10d collectives), beside the ZeRO accounting (Rajbhandari et al., 2020):
  DDP 2(n-1)/n·Ψ, FSDP 3(n-1)/n·Ψ when every unit reshards, less the root's second all-gather
  when the root stays gathered (FSDP2's default);
* MFU (Chowdhery et al., 2022) of exercise 6's workload (notebook 06's MLP, width 1024, batch 32
  per worker): FLOPs counted with FlopCounterMode (against Kaplan et al.'s 6N), the peak the
  best large-matmul rate measured by the same ranks at the same time, at W = 1 and 2, and 4
  where this machine has 4 cores (GPUs) for 4 workers.

On a CPU the overlap follows the bucket size while the step time need not: gloo's all-reduce
runs on the same cores as the backward it overlaps (notebook 09 says more).
"""
from __future__ import annotations

import statistics

import torch

from distlab import torchrun
from distlab.lab.ddp_overlap import BENCH_CONFIGS
from distlab.measure.timing import cpu_cores

from . import Row


def _ddp_rows(results: list[dict]) -> list[Row]:
    out = []
    for i, c in enumerate(results[0]["ddp"]):
        per_rank = [r["ddp"][i] for r in results]
        step = max(p["step_s"] for p in per_rank)
        buckets = ", ".join(f"{b / 2**20:.1f}" for b in c["buckets"][-1])
        out.append(Row("comm", f"DDP overlap fraction, {c['label']}", statistics.mean(p["overlap"] for p in per_rank),
                       "fraction", f"|comm ∩ compute| / |comm| over 3 traced steps, mean of ranks; comm "
                       f"{c['comm_s'] * 1e3:.1f} ms/step in buckets of [{buckets}] MiB"))
        out.append(Row("comm", f"DDP step time, {c['label']}", step * 1e3, "ms",
                       f"median of 3 traced steps, slower rank; backward {c['backward_s'] * 1e3:.1f} ms, "
                       f"exposed = comm x (1 - overlap) = {c['comm_s'] * (1 - c['overlap']) * 1e3:.1f} ms, "
                       f"bucket copy {c['bucket_copy_s'] * 1e3:.1f} ms, grads outside buckets "
                       f"{c['grad_copy_bytes'] / 2**20:.1f} MiB, buckets per iteration "
                       f"{[len(b) for b in c['buckets']]}, {c['collectives']:.0f} collectives/step"))
    return out


def _bytes_rows(b: dict) -> list[Row]:
    ddp = b["ddp"]["wire_bytes"]
    pred = b["fsdp"]["prediction"]
    out = [Row("comm", "bytes/step per rank, DDP", ddp / 2**20, "MiB",
               f"ZeRO 2(n-1)/n x Ψ = {pred['ddp'] / 2**20:.4f} MiB (Ψ = {pred['grad_bytes'] / 2**20:.3f} MiB); "
               f"counted/predicted = {ddp / pred['ddp']:.4f}")]
    for name, label, formula in (("fsdp", "FSDP2, root kept gathered (default)", "(n-1)/n x (3Ψ - Ψ_root)"),
                                 ("fsdp_root_resharded", "FSDP2, root resharded", "(n-1)/n x 3Ψ")):
        m, p = b[name], b[name]["prediction"]
        out.append(Row("comm", f"bytes/step per rank, {label}", m["wire_bytes"] / 2**20, "MiB",
                       f"ZeRO {formula} = {p['fsdp'] / 2**20:.4f} MiB; counted/predicted = "
                       f"{m['wire_bytes'] / p['fsdp']:.4f}; x DDP = {m['wire_bytes'] / ddp:.3f} "
                       f"(predicted {p['ratio']:.3f})"))
    return out


def _mfu_rows(m: dict, rows: list[dict]) -> list[Row]:
    out = []
    for r in rows:
        sheet = f"; vs datasheet {r['mfu_datasheet']:.2%}" if r.get("mfu_datasheet") else ""
        out.append(Row("comm", f"MFU exercise 6 workload, W={r['world']}", r["mfu"], "fraction",
                       f"{m['flops_per_step'] / 1e6:.1f} MFLOP/step/worker x W / {r['step_s'] * 1e3:.2f} ms = "
                       f"{r['achieved'] / 1e9:.1f} GFLOP/s over measured matmul peak "
                       f"{r['peak'] / 1e9:.1f} GFLOP/s{sheet}"))
    return out


def rows() -> list[Row]:
    res = torchrun("distlab.lab.comm_job:communication", 2, timeout=600,
                   kwargs={"configs": BENCH_CONFIGS, "profile_steps": 3}).results
    out = _ddp_rows(res) + _bytes_rows(res[0]["bytes"])
    m = res[0]["mfu"]
    out.append(Row("comm", "FLOPs/step, exercise 6 workload (FlopCounterMode)", m["flops_per_step"] / 1e6, "MFLOP",
                   f"6N x tokens = {m['six_n'] / 1e6:.1f} MFLOP (N = {m['params']:,}, tokens = batch {m['batch']}); "
                   f"counted/6N = {m['flops_per_step'] / m['six_n']:.4f}: biases and the first layer's input gradient"))
    out.append(Row("comm", "matmul peak, 1 rank alone", m["rows"][0]["peak"] / 1e9, "GFLOP/s",
                   f"best n x n fp32 product, one thread ({m['device']})"))
    mfu_rows = list(m["rows"])
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if max(cpu_cores(), gpus) >= 4:
        mfu_rows.append(torchrun("distlab.lab.comm_job:mfu_only", 4, timeout=300).results[0]["rows"][1])
        out += _mfu_rows(m, mfu_rows)
    else:
        out += _mfu_rows(m, mfu_rows)
        out.append(Row("comm", "MFU exercise 6 workload, W=4", float("nan"), "fraction",
                       f"skipped: needs 4 cores (or GPUs) for 4 workers; this machine has {cpu_cores()} cores"))
    return out
