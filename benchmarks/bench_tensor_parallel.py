"""Tensor parallelism (Megatron-LM, Shoeybi et al., 2019, sec. 3) measured against its arithmetic.

One job of W ranks (distlab.lab.tensor_parallel.tp_job): a residual MLP of 4 blocks (width 512,
hidden 1024, batch 128) with every block column- then row-parallel through
``parallelize_module``, against the unsplit model on the same batch:

* the block's parameter bytes on a rank over the unsplit bytes: target 1/W within 2 % (the
  weight matrices exactly 1/W; fc2's bias is replicated, added once after the all-reduce);
* the collectives of one training step as CommDebugMode counts them: target exactly 2 per
  block (one all-reduce forward, ``g``; one backward, ``f``);
* parity: the largest gradient difference from the unsplit model (float32 rounding);
* the step time (forward and backward) over the unsplit model's on one core (W=1), both
  measured in the same job, every rank at once, so both see the same load, beside the model
  (unsplit / W + 2 x blocks x one all-reduce of a batch x width activation, timed alone + the
  fixed cost, the parallel step on a single row: DTensor's own work per op, sharding
  propagation in Python, and the collectives' latency) / unsplit;
* sequence parallelism (Korthikanti et al., 2022): bytes each rank sends, over tensor
  parallelism's: target exactly 1 (a ring all-reduce is a reduce-scatter plus an all-gather);
* the bytes a rank saves for backward against distlab.lab.activation_memory's term with t=W.

W = 4 needs 4 ranks with a core each: it runs only where this machine has >= 4 cores (on 2
cores, 4 ranks share them and the step time measures the wait for a core).
"""
from __future__ import annotations

from distlab.lab.activation_memory import resmlp_saved_bytes
from distlab.lab.tensor_parallel import run_tp_job
from distlab.measure.timing import cpu_cores

from . import Row

SIZED = dict(hidden=512, depth=4, batch=128, seq=64)


def _rows(w: int) -> list[Row]:
    runs = run_tp_job(w, timeout=300, timed=True, calls=5, repeats=5, **SIZED)
    r0, depth = runs[0], SIZED["depth"]
    step, t = r0["step"], r0["time"]
    local, full = r0["block_bytes"]
    m_local, m_full = r0["matrix_bytes"]
    n = sum(step["forward"].values()) + sum(step["backward"].values())
    tp, sp = r0["sp"]["tensor parallel"], r0["sp"]["sequence parallel"]
    term = resmlp_saved_bytes(SIZED["batch"], in_features=SIZED["hidden"], hidden=SIZED["hidden"], depth=depth,
                              out_features=10, tp=w)
    return [
        Row("tensor-parallel", f"block parameter bytes per rank / unsplit, W={w}", local / full, "ratio",
            f"target 1/W = {1 / w:.3f} within 2%; weight matrices alone {m_local / m_full:.4f} (exactly 1/W)"),
        Row("tensor-parallel", f"collectives per training step, W={w}, {depth} blocks", n, "count",
            f"target exactly 2 per block = {2 * depth}; forward {step['forward']}, backward {step['backward']}"),
        Row("tensor-parallel", f"max |grad - unsplit|, W={w}", max(r["step"]["grad_diff"] for r in runs), "abs",
            f"float32 rounding (partial sums added in another order); |loss diff| {step['loss_diff']:.1e}"),
        Row("tensor-parallel", f"step time / unsplit step time (W=1), W={w}", t["parallel_s"] / t["unsplit_s"], "ratio",
            f"model (1/W x unsplit + 2 x {depth} all-reduces + fixed cost) / unsplit = {1 / w:.2f} + "
            f"{2 * depth * t['all_reduce_s'] / t['unsplit_s']:.2f} + {t['one_row_s'] / t['unsplit_s']:.2f} = "
            f"{(t['unsplit_s'] / w + 2 * depth * t['all_reduce_s'] + t['one_row_s']) / t['unsplit_s']:.2f}; "
            f"TP {t['parallel_s'] * 1e3:.1f} ms, unsplit {t['unsplit_s'] * 1e3:.1f} ms (each rank alone on a core), "
            f"one all-reduce of {SIZED['batch']}x{SIZED['hidden']} fp32 {t['all_reduce_s'] * 1e3:.2f} ms, "
            f"fixed cost = TP step on 1 row {t['one_row_s'] * 1e3:.1f} ms"),
        Row("tensor-parallel", f"sequence-parallel bytes sent / tensor-parallel, W={w}",
            (sp["forward_bytes"] + sp["backward_bytes"]) / (tp["forward_bytes"] + tp["backward_bytes"]), "ratio",
            f"target exactly 1; SP {sp['forward']} each way, TP {tp['forward']}; "
            f"saved per rank SP {sp['saved_bytes']:,} B vs TP {tp['saved_bytes']:,} B (norm input on s/t)"),
        Row("tensor-parallel", f"saved for backward per rank / activation term, W={w}", step["saved_bytes"] / term,
            "ratio", f"target 1 within 5%: measured {step['saved_bytes']:,} B, term 4b(h + 2h/t) per block + ends "
                     f"= {term:,} B"),
    ]


def rows() -> list[Row]:
    out = _rows(2)
    if cpu_cores() >= 4:
        out += _rows(4)
    else:
        out.append(Row("tensor-parallel", "W=4 rows", float("nan"), "skipped",
                       f"need >= 4 cores for 4 ranks, this machine has {cpu_cores()}: 4 ranks would wait for a core"))
    return out
