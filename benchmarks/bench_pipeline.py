"""Pipeline parallelism measured against its formulas: messages, bubbles, memory, interleaving.

All in one job of 2 ranks (distlab.lab.pipeline.sweep.sweep):

* the per-message cost: a gloo send/recv round trip against the message size;
* GPipe (Huang et al., 2019) on the sized workload (SIZED: compute per
  micro-batch >= 10x the one-way message cost at m = 8), m = 1, 2, 4, 8,
  measured bubble beside (p-1)/(m+p-1);
* GPipe on tiny micro-batches (SMALL), beside the formula and the model with
  messages, (p-1)/(m+p-1) + m (p-1) c / step time;
* stage 0's peak saved-tensor bytes, GPipe against 1F1B (Narayanan et al.,
  2021), micro-batch fixed at 32 rows: GPipe m x a, 1F1B min(m, p) x a (a:
  one micro-batch's bytes, the m = 1 run);
* interleaved 1F1B (Narayanan et al., SC'21) with v = 2 stages per rank,
  beside (p-1)/(v m + p-1), and ZBV zero-bubble (Qi et al., 2024): step time
  against interleaved 1F1B's (its split backward is not timed per stage).

Beside each GPipe bubble, a model made of what the run measured
(distlab.lab.pipeline.costs.bubble_model): each stage's forward and backward, the
schedule's own work between two actions o, and the message c. On a 2-core machine the
sized bubble follows the formula at m = 1, 2 and sits 5-17 points above it at m = 4, 8:
about half is o, the rest messages that wait for a core while both ranks compute. The
small micro-batches' gap is mostly o, which is as long as an 8-row micro-batch's compute.

p = 4 needs 4 ranks with a core each: it runs only where this machine has >= 4
cores (on 2 cores, 4 ranks share them and a stage waits for a core, not for
its input).
"""
from __future__ import annotations

from distlab.lab.pipeline.sweep import MEMORY, MICRO, SIZED, SMALL, select, sweep
from distlab.measure.timing import cpu_cores

from . import Row

P = 2


def _runs() -> list[dict]:
    runs = [dict(schedule="gpipe", n_microbatches=m, **SIZED) for m in MICRO]
    runs += [dict(schedule="gpipe", n_microbatches=m, **SMALL) for m in MICRO]
    runs += [dict(schedule="gpipe", n_microbatches=m, **MEMORY) for m in MICRO]
    runs += [dict(schedule="1f1b", n_microbatches=m, **MEMORY) for m in MICRO if m >= P]  # 1F1B needs m >= p
    runs += [dict(schedule="interleaved1f1b", n_microbatches=m, stages_per_rank=2, **SIZED) for m in (2, 4, 8)]
    runs += [dict(schedule="zbv", n_microbatches=8, **SIZED)]
    return runs


def _bubble_rows(label: str, figures: list[dict]) -> list[Row]:
    def note(f: dict) -> str:
        model = (f"model (measured f, b, o = {f['overhead_s'] * 1e3:.2f} ms, c) {f['model']:.3f}; "
                 if "model" in f else "")
        return (f"formula (p-1)/(v*m+p-1) = {f['formula']:.3f}; with messages {f['with_messages']:.3f}; {model}"
                f"compute/micro-batch {f['compute_per_mb_s'] * 1e3:.2f} ms = {f['compute_per_mb_s'] / f['c']:.0f} c; "
                f"gradients match: {f['grads_match']}")

    return [Row("pipeline", f"{label} bubble, p={f['p']}, v={f['v']}, m={f['m']}", f["bubble"], "fraction", note(f))
            for f in figures]


def rows() -> list[Row]:
    runs = _runs()
    figs, costs = sweep(runs, P)
    out = [Row("pipeline", f"gloo send/recv round trip, {c['bytes'] / 1024:g} KiB", c["round_trip_s"] * 1e6, "us",
               "median of 30 ping-pongs; one-way cost c = half") for c in costs]
    by = lambda schedule, workload: select(runs, figs, schedule, workload)  # noqa: E731
    out += _bubble_rows("GPipe sized", by("gpipe", SIZED))
    out += _bubble_rows("GPipe small micro-batches", by("gpipe", SMALL))
    gp, ob = by("gpipe", MEMORY), by("1f1b", MEMORY)
    a = gp[0]["saved_peak_bytes"]
    for name, fs, model in (("GPipe", gp, lambda m: m), ("1F1B", ob, lambda m: min(m, P))):
        out += [Row("pipeline", f"{name} stage-0 peak saved bytes, m={f['m']}", f["saved_peak_bytes"] / 2 ** 20, "MiB",
                    f"formula {model(f['m'])} x a = {model(f['m']) * a / 2 ** 20:.3f} MiB (a = one micro-batch)")
                for f in fs]
    out += _bubble_rows("interleaved 1F1B", by("interleaved1f1b", SIZED))
    zbv, il8 = by("zbv", SIZED)[0], by("interleaved1f1b", SIZED)[-1]
    out.append(Row("pipeline", "ZBV zero-bubble step / interleaved 1F1B step, p=2, v=2, m=8",
                   zbv["wall_s"] / il8["wall_s"], "ratio", f"gradients match: {zbv['grads_match']}"))
    if cpu_cores() >= 4:
        runs4 = [dict(schedule="gpipe", n_microbatches=m, **SIZED) for m in MICRO]
        figs4, _ = sweep(runs4, 4)
        out += _bubble_rows("GPipe sized (4 ranks)", figs4)
    return out
