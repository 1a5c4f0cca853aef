"""The pipeline sweep that notebook 07, its benchmark and its tests share: the workloads, one
launch that runs them all (:func:`distlab.lab.pipeline.run.pipeline_sweep`), and each run's figures
beside the bubble formula and the model with per-message costs (:mod:`distlab.lab.pipeline.costs`)."""
from __future__ import annotations

from distlab.lab.pipeline.costs import bubble_model, bubble_with_messages, one_way_cost, stage_costs


# ---- the workloads the notebook, the benchmark and the tests share ----------------------------

#: Compute per micro-batch >= 10x what the schedule pays per micro-batch even at m = 8 (on a CPU core
#: with gloo): the message (~0.1 ms) and the schedule's own work between two actions (~0.6 ms,
#: :func:`stage_costs`), against ~8 ms forward and ~17 ms backward per stage. 1024 features inside a
#: stage, 64 where one stage hands over to the next (32 KiB messages at m = 8).
SIZED = dict(width=1024, depth=8, batch=1024, boundary=64)
#: Tiny micro-batches: the per-message cost is a large share of each, the bubble is far above the formula.
SMALL = dict(width=256, depth=4, batch=64)
#: Memory: a fixed micro-batch of 32 rows, so a step of m micro-batches has m times the work.
MEMORY = dict(width=256, depth=4, microbatch_rows=32, memory=True)
MICRO = (1, 2, 4, 8)
#: Message sizes (float32 elements) for :func:`message_cost`: 1 KiB to 4 MiB.
MESSAGE_SIZES = [2 ** k for k in range(8, 21, 2)]


def message_bytes(run: dict) -> int:
    """Bytes one micro-batch sends across a stage boundary (the largest, with ``v`` stages per rank):
    its rows x the boundary's features, float32."""
    rows = run.get("microbatch_rows") or run["batch"] // run["n_microbatches"]
    v = 2 if run["schedule"] == "zbv" else run.get("stages_per_rank", 1)
    return 4 * rows * (run["width"] if v > 1 else run.get("boundary") or run["width"])  # v > 1: wide cuts too


def summarize(run: dict, per_rank: list[dict], costs: list[dict] | None = None) -> dict:
    """One run's figures: measured bubble, the formula, the step time, the compute per micro-batch,
    and with ``costs`` (:func:`message_cost`) the per-message cost ``c`` and the model with messages."""
    from distlab.lab.pipeline.timeline import as_events, bubble_fraction

    p, m = len(per_rank), run["n_microbatches"]
    v = 2 if run["schedule"] == "zbv" else run.get("stages_per_rank", 1)
    events = as_events([r["events"] for r in per_rank])
    span = (max(e.end for e in events) - min(e.start for e in events)) if events else max(
        r["step_s"] for r in per_rank)
    work = [e.end - e.start for e in events if e.stage == 0]
    out = {"schedule": run["schedule"], "m": m, "p": p, "v": v, "step_s": span,
           "wall_s": max(r["step_s"] for r in per_rank),
           "bubble": bubble_fraction(events) if events else float("nan"),
           "formula": (p - 1) / (v * m + p - 1),
           "compute_per_mb_s": sum(work) / max(1, m * v),  # stage 0's forward + backward per micro-batch
           "grads_match": all(r["grads_match"] for r in per_rank),
           "max_grad_diff": max(r["max_grad_diff"] for r in per_rank), "events": events,
           "cpu_share": min(r.get("cpu_share", 1.0) for r in per_rank)}
    if costs:
        c = one_way_cost(costs, message_bytes(run))
        out.update(c=c, with_messages=bubble_with_messages(p, m, c, span, v))
        if run["schedule"] == "gpipe" and events:  # stage_costs reads GPipe's order of actions
            measured = stage_costs(events, p)
            out.update(overhead_s=measured["o"],
                       model=bubble_model(measured["f"], measured["b"], m, measured["o"], c))
    if "saved_peak_bytes" in per_rank[0]:
        out["saved_peak_bytes"] = per_rank[0]["saved_peak_bytes"]
    return out


def sweep(runs: list[dict], nprocs: int = 2, messages: bool = True, timeout: float = 300) -> tuple[list[dict], list]:
    """Launch ``runs`` in one job of ``nprocs`` ranks (plus the message ping-pong); return each run's
    :func:`summarize` and the message costs."""
    from distlab.runtime.launch import torchrun
    from distlab.lab.pipeline.run import pipeline_sweep

    res = torchrun(pipeline_sweep, nprocs, args=(runs, MESSAGE_SIZES if messages else None),
                   timeout=timeout).results
    costs = res[0][-1]["message_cost"] if messages else None
    return [summarize(run, [res[r][i] for r in range(nprocs)], costs) for i, run in enumerate(runs)], costs


def select(runs: list[dict], figures: list[dict], schedule: str, workload: dict) -> list[dict]:
    """The figures of the runs of ``schedule`` on ``workload`` (one of :data:`SIZED`, :data:`SMALL`, :data:`MEMORY`)."""
    return [dict(f, **r) for r, f in zip(runs, figures) if r["schedule"] == schedule
            and all(r.get(k) == workload.get(k) for k in ("width", "boundary", "memory"))]
