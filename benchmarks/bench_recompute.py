"""Activation recomputation (Chen et al., 2016) measured: memory against depth, and what it costs.

A residual MLP (width 256, batch 256, depths 4, 8, 16), single process, one thread
(distlab.lab.recompute.sweep), under three policies: no recomputation, every block checkpointed
(``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``), and segments of √L blocks:

* bytes saved for backward at the end of the forward (saved_tensors_hooks), beside the
  activation term of distlab.lab.activation_memory (target: within 5 %), and the share saved
  (target: >= 60 % at depth 16 with every block checkpointed; the model says 2/3 of the
  blocks' bytes);
* the peak of the storage a step makes beyond the parameters and gradients (recomputed
  activations included), beside the estimate saved + one segment + one weight gradient;
* the step time over the plain model's, beside 1 + F/(F+B): the recomputed forward F over
  the measured plain step F+B (≈ 4/3 if a backward costs two forwards). The policies are
  timed in turn, five rounds, and the median of each round's ratio is reported: a burst of
  load from elsewhere (this machine's cores may be shared) hits a round's policies alike.
"""
from __future__ import annotations

from distlab.lab.activation_memory import resmlp_peak_bytes, resmlp_saved_bytes
from distlab.lab.recompute import step_time_ratios, sweep

from . import Row

SHAPE = dict(in_features=64, hidden=256, out_features=10)
BATCH, DEPTHS = 256, (4, 8, 16)


def _memory_rows(r: dict, plain: dict) -> list[Row]:
    term = resmlp_saved_bytes(BATCH, depth=r["depth"], every=r["every"], **SHAPE)
    peak = resmlp_peak_bytes(BATCH, depth=r["depth"], every=r["every"], **SHAPE)
    what = f"depth {r['depth']}, " + (f"{r['policy']} (segments of {r['every']})" if r["every"] else "none")
    saved = f"; {1 - r['saved_bytes'] / plain['saved_bytes']:.1%} less than none" if r["every"] else ""
    target = "; target >= 60% less at depth 16" if r["every"] == 1 and r["depth"] == 16 else ""
    return [Row("recompute", f"saved for backward, {what}", r["saved_bytes"] / 2**20, "MiB",
                f"activation term {term / 2**20:.3f} MiB ({term / r['saved_bytes'] - 1:+.2%}){saved}{target}"),
            Row("recompute", f"peak during the step, {what}", r["peak_bytes"] / 2**20, "MiB",
                f"estimate saved + one segment + one weight gradient {peak / 2**20:.3f} MiB "
                f"({peak / r['peak_bytes'] - 1:+.1%})")]


def rows() -> list[Row]:
    results = sweep(DEPTHS, measure=("saved", "peak", "grads"), batch=BATCH, **SHAPE)
    out = []
    for depth in DEPTHS:
        mine = [r for r in results if r["depth"] == depth]
        assert all(r["grads_equal"] for r in mine), "recomputation changed a gradient"
        timed = step_time_ratios(depth, rounds=5, min_run_time=0.15, batch=BATCH, **SHAPE)
        for r in mine:
            out += _memory_rows(r, mine[0])
            if r["every"]:
                out.append(Row("recompute", f"step time / none, depth {depth}, {r['policy']}", timed[r["policy"]],
                               "ratio", f"model 1 + F/(F+B) = {1 + timed['forward share']:.2f} (F/(F+B) measured "
                                        f"{timed['forward share']:.2f}; 4/3 if B = 2F); "
                                        "median of 5 interleaved rounds"))
    return out
