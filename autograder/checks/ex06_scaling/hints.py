"""Exercise 6's hints: three tiers per criterion (1 why it matters, 2 the mechanism, 3 the API).

Keyed by the criterion functions' names in ``ex06_scaling``; a hint never gives the whole answer.
"""
from __future__ import annotations

HINTS: dict[str, tuple[str, str, str]] = {
    "throughput_within_tolerance": (
        "The first steps pay for allocation, kernel choice and the first rendezvous: a clock that counts them "
        "reports a throughput that no long run sees.",
        "Run the warm-up steps untimed, then time a fixed number of steps, and wait for the device before each "
        "reading of the clock.",
        "time.perf_counter() around the timed loop, torch.cuda.synchronize() on a GPU; samples = batch * iters.",
    ),
    "trains_with_ddp": (
        "A benchmark of a step that does not train measures nothing useful: without DDP's all-reduce it times "
        "computation only, and hides the communication that limits scaling.",
        "The step must be a full training step: forward, backward (where DDP all-reduces) and the update.",
        "Wrap the model in DistributedDataParallel, and zero_grad, backward and optimizer.step in step().",
    ),
    "real_run_counted": (
        "Each timed step should cost exactly what a real training step costs: a step that skips its backward, its "
        "update or its communication promises a speed that training never reaches.",
        "One DDP wrapper for the run (not one per step), one gradient all-reduce per step, warm-up untimed.",
        "Build DistributedDataParallel once, outside step(); call step() warmup + iters times.",
    ),
    "alpha_beta_fitted": (
        "Every measurement is one equation in the same two unknowns, whatever its world size and size: a fit that "
        "drops some of them, or fits each apart, predicts from less than the data holds.",
        "A ring all-reduce pays the latency at each of its 2(W-1) steps and moves 2(W-1)/W of the bytes through "
        "each link; a row's time is linear in α and β, so all rows together are a least-squares problem. Weigh "
        "each row by 1/time, or the largest messages decide it alone.",
        "A matrix with one row [2(W-1), 2(W-1)/W * 4 * numel] / t per measurement, solved against ones with "
        "torch.linalg.lstsq (or numpy.linalg.lstsq); β is seconds per byte, not bytes per second.",
    ),
    "efficiency_predicted": (
        "Scaling efficiency is what the step pays with W workers that one worker does not: a prediction that leaves "
        "that cost out promises linear scaling that never comes.",
        "DDP all-reduces gradient buckets while the backward still runs, so only the part of the all-reduce "
        "longer than the backward lengthens the step; the efficiency is t_step(1) / t_step(W), not the speed-up.",
        "all-reduce = 2(W-1) α + 2(W-1)/W * grad_bytes * β; step = compute + max(0, all-reduce - backward).",
    ),
}
