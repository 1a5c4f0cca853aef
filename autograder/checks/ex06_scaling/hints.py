"""Exercise 6's hints: three tiers per criterion (1 a nudge towards the concept, 2 the mechanism, 3 the API).

Keyed by the criterion functions' names in ``ex06_scaling``; a hint never gives the whole answer.
"""
from __future__ import annotations

HINTS: dict[str, tuple[str, str, str]] = {
    "throughput_within_tolerance": (
        "What should the clock see: the steady state, not the first steps.",
        "Run the warm-up steps untimed, then time a fixed number of steps, and wait for the device before each "
        "reading of the clock.",
        "time.perf_counter() around the timed loop, torch.cuda.synchronize() on a GPU; samples = batch * iters.",
    ),
    "trains_with_ddp": (
        "A benchmark of a step that does not train measures nothing useful.",
        "The step must be a full training step: forward, backward (where DDP all-reduces) and the update.",
        "Wrap the model in DistributedDataParallel, and zero_grad, backward and optimizer.step in step().",
    ),
    "real_run_counted": (
        "Each timed step should cost exactly what a real training step costs.",
        "One DDP wrapper for the run (not one per step), one gradient all-reduce per step, warm-up untimed.",
        "Build DistributedDataParallel once, outside step(); call step() warmup + iters times.",
    ),
    "efficiency_against_linear": (
        "Linear scaling means W workers give W times one worker's throughput.",
        "Efficiency compares the measured throughput at W with that ideal.",
        "throughput[W] / (W * throughput[1]) for each measured W.",
    ),
    "results_written": (
        "A result nobody can read back is not a result.",
        "Write the measured figures in a format a program can read, and a plot a person can.",
        "json.dump the figures; matplotlib's savefig for the plot; return the paths written.",
    ),
}
