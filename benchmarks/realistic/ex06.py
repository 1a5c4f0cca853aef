"""Realistic mistakes for exercise 6 (a DDP scaling benchmark, and the alpha-beta fit and prediction)."""
from __future__ import annotations

from benchmarks.realistic import Mistake

_START_BARRIER = "    dist.barrier()                    # nobody starts the clock before everyone is warm\n"
_END_BARRIER = "    dist.barrier()                    # ... on every rank, the slowest included\n"
_BROADCAST = "    dist.broadcast(elapsed, src=0)    # one clock, one figure on every rank\n"
_RETURN = "    return dist.get_world_size() * batch_size * iters / elapsed.item()\n"
_FEATURES = "    features = torch.stack([2 * (w - 1), 2 * (w - 1) / w * nbytes], dim=1)\n"
_EXPOSED = "    exposed_s = max(0.0, allreduce_s - backward_s)    # what the backward could not hide\n"

MISTAKES: list[Mistake] = [
    # measure_throughput ----------------------------------------------------------------------------------
    Mistake(
        name="one_rank_samples_only",
        what="The throughput counts this rank's samples only (batch_size * iters / seconds), not the world's.",
        source="https://duoan.github.io/posts/learning-ddp-performance-tuning-on-one-gpu (samples/s per rank vs "
               "global); logging on rank 0 with its own batch",
        edits={_RETURN: "    return batch_size * iters / elapsed.item()\n"},
        key_terms=("world",),
    ),
    Mistake(
        name="warmup_inside_window",
        what="The clock starts before the warm-up steps, so the slow first steps are timed while only the iters "
             "steps are counted.",
        source="https://www.speechmatics.com/company/articles-and-news/timing-operations-in-pytorch (warm-up steps "
               "excluded from timing)",
        edits={"    for _ in range(warmup):\n        step()\n    sync()\n" + _START_BARRIER +
               "    start = time.perf_counter()\n":
               "    start = time.perf_counter()\n    for _ in range(warmup):\n        step()\n    sync()\n"
               "    dist.barrier()\n"},
        key_terms=("warm",),
    ),
    Mistake(
        name="no_barrier_before_clock",
        what="No barrier before the clock starts: rank 0 starts timing while slower ranks are still warming up.",
        source="ex06 docstring: the window starts when every rank has finished its warm-up",
        edits={_START_BARRIER: ""},
        key_terms=("barrier",),
    ),
    Mistake(
        name="no_barrier_after_last_step",
        what="No barrier before the clock stops, so rank 0's window ends when rank 0 is done, not the slowest rank.",
        source="https://duoan.github.io/posts/learning-ddp-performance-tuning-on-one-gpu ('the slowest rank often "
               "sets the pace')",
        edits={_END_BARRIER: ""},
        key_terms=("barrier",),
    ),
    Mistake(
        name="figure_differs_per_rank",
        what="Each rank returns the figure of its own clock, never shared, so the ranks return different numbers.",
        source="ex06 contract: 'Return the same figure (a float) on every rank'",
        edits={_BROADCAST: ""},
        key_terms=("same",),
    ),
    Mistake(
        name="sum_of_rank_rates",
        what="Each rank computes its own samples per second over its own window, without the final barrier, and "
             "the rates are summed: faster ranks inflate the figure beyond what the slowest allows.",
        source="common pattern 'all_reduce each GPU's throughput and add it up' (per-GPU images/s logging)",
        edits={"    sync()                            # the device has really finished\n" + _END_BARRIER +
               "    elapsed = torch.tensor(time.perf_counter() - start, dtype=torch.float64, device=device)\n" +
               _BROADCAST + _RETURN: """\
    sync()
    rate = torch.tensor(batch_size * iters / (time.perf_counter() - start), dtype=torch.float64, device=device)
    dist.all_reduce(rate)             # every rank's samples per second, added up
    return rate.item()
"""},
        key_terms=("window",),
    ),
    # make_ddp_step ---------------------------------------------------------------------------------------
    Mistake(
        name="forward_through_inner_module",
        what="The step's forward calls the unwrapped model instead of the DDP wrapper, so DDP never prepares "
             "its reducer and no gradient is all-reduced.",
        source="forum question 'DDP not synchronizing gradients: called model.module(x)/model(x) instead of "
               "ddp_model(x)'",
        edits={"        loss = nn.functional.cross_entropy(ddp(x), y)\n":
               "        loss = nn.functional.cross_entropy(model(x), y)\n"},
        key_terms=("DDP",),
    ),
    # fit_alpha_beta --------------------------------------------------------------------------------------
    Mistake(
        name="absolute_least_squares",
        what="The fit minimises absolute errors in seconds, so the largest messages dominate and alpha (seen in "
             "the smallest) is lost.",
        source="ex06 docstring: fit on the relative errors; numpy.polyfit / lstsq on raw times is the default habit",
        edits={"    fit = torch.linalg.lstsq(features / t.unsqueeze(1), torch.ones_like(t).unsqueeze(1)).solution\n":
               "    fit = torch.linalg.lstsq(features, t.unsqueeze(1)).solution\n"},
        key_terms=("relative",),
    ),
    Mistake(
        name="elements_taken_for_bytes",
        what="numel is used as the message size in bytes (float32's 4 bytes forgotten), so beta comes out 4 "
             "times too large.",
        source="unit slip between elements and bytes (nccl-tests report bytes)",
        edits={'    nbytes = torch.tensor([r["numel"] for r in rows], dtype=torch.float64) * 4  # float32: 4 bytes each\n':
               '    nbytes = torch.tensor([r["numel"] for r in rows], dtype=torch.float64)  # the message size\n'},
        key_terms=("bytes",),
    ),
    Mistake(
        name="point_to_point_alpha_beta",
        what="The fit uses the point-to-point model t = alpha + beta * bytes, ignoring the ring's 2(W-1) steps "
             "and 2(W-1)/W of the bytes per link.",
        source="Hockney's alpha-beta model for one message, as most tutorials state it (course/00b: the ring "
               "all-reduce's factors)",
        edits={_FEATURES: "    features = torch.stack([torch.ones_like(nbytes), nbytes], dim=1)  # t = alpha + beta * bytes\n"},
        key_terms=("ring",),
    ),
    Mistake(
        name="latency_once_per_allreduce",
        what="alpha is paid once per all-reduce instead of once per ring step (2(W-1) times).",
        source="course/06_launching.py: 'a ring takes 2(W-1) steps, each paying a latency alpha'",
        edits={_FEATURES: "    features = torch.stack([torch.ones_like(w), 2 * (w - 1) / w * nbytes], dim=1)\n"},
        key_terms=("alpha",),
    ),
    # predict_efficiency ----------------------------------------------------------------------------------
    Mistake(
        name="no_overlap",
        what="The whole all-reduce is added to the step, as if DDP did not overlap it with the backward.",
        source="course/06_launching.py's own table model adds the whole all-reduce; the exercise asks for the overlap",
        edits={_EXPOSED: "    exposed_s = allreduce_s\n"},
        key_terms=("overlap",),
    ),
    Mistake(
        name="hidden_under_whole_step",
        what="The all-reduce is taken as hidden under the whole compute_s instead of the backward_s only.",
        source="DDP overlaps communication with the backward only (Li et al., VLDB 2020)",
        edits={"max(0.0, allreduce_s - backward_s)": "max(0.0, allreduce_s - compute_s)"},
        key_terms=("backward",),
    ),
    Mistake(
        name="overlap_not_clamped",
        what="The exposed time allreduce_s - backward_s is not clamped at zero, so a well-hidden all-reduce "
             "predicts an efficiency above 1.",
        source="forgotten max(0, .) in an overlap model",
        edits={"max(0.0, allreduce_s - backward_s)": "allreduce_s - backward_s"},
        key_terms=("overlap",),
    ),
    Mistake(
        name="strong_scaling_assumed",
        what="The prediction splits one fixed batch over the W workers (compute_s / W per step) while the "
             "contract's global batch grows with W.",
        source="strong vs weak scaling confusion (https://duoan.github.io/posts/learning-ddp-performance-tuning-on-"
               "one-gpu)",
        edits={"    return compute_s / (compute_s + exposed_s)\n":
               "    step_s = compute_s / world + exposed_s          # the batch is split over the workers\n"
               "    return compute_s / (world * step_s)\n"},
        key_terms=("batch",),
    ),
]

LEGAL: list[Mistake] = [
    Mistake(
        name="slowest_clock_all_reduce_max",
        what="The window is all-reduced with MAX (the slowest rank's clock) instead of broadcast from rank 0.",
        source="distlab.measure.timing.slowest_rank style ('a step is as slow as its slowest rank')",
        edits={_BROADCAST: "    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank's window\n"},
    ),
    Mistake(
        name="from_time_import_perf_counter",
        what="measure_throughput reads the clock through 'from time import perf_counter'.",
        source="common import style for timing code",
        edits={
            "import json\nimport time\n": "import json\nimport time\nfrom time import perf_counter\n",
            "    start = time.perf_counter()\n": "    start = perf_counter()\n",
            "elapsed = torch.tensor(time.perf_counter() - start,": "elapsed = torch.tensor(perf_counter() - start,",
        },
    ),
    Mistake(
        name="normal_equations_fit",
        what="fit_alpha_beta solves the relative least squares by hand (column-scaled normal equations, "
             "torch.linalg.solve) instead of torch.linalg.lstsq.",
        source="a hand-written solver instead of the helper",
        edits={"""\
    fit = torch.linalg.lstsq(features / t.unsqueeze(1), torch.ones_like(t).unsqueeze(1)).solution
    alpha, beta = fit.squeeze(1).tolist()
""": """\
    a = features / t.unsqueeze(1)
    scale = a.norm(dim=0)                  # columns of similar size: a well-conditioned 2 x 2 system
    a = a / scale
    solution = torch.linalg.solve(a.T @ a, a.T @ torch.ones_like(t)) / scale
    alpha, beta = solution.tolist()
"""},
    ),
]
