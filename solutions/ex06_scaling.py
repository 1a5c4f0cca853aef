"""Exercise 6: benchmark how DistributedDataParallel scales with the number of workers.

Adding workers should multiply the samples trained per second; how close it
comes to W times one worker is the *scaling efficiency*. Measuring it is easy
to get wrong, and a wrong method gives a confident wrong number. Write:

1. ``measure_throughput``: the global training throughput in samples per
   second, counting the samples of *every* rank, excluding warm-up steps, and
   timing a window in which *all* ranks did their steps (``dist.barrier()`` at
   both ends; on a GPU also ``torch.cuda.synchronize()``, since CUDA calls
   return before the work is done).
2. ``make_ddp_step``: one training step of a model wrapped in DDP, as a
   function of no arguments that ``measure_throughput`` can call.
3. ``fit_alpha_beta``: the latency ``alpha`` and the seconds per byte
   ``beta`` of the ring all-reduce model, least-squares fitted to all-reduce
   times measured at several world sizes.
4. ``predict_efficiency``: from them, the efficiency at a world size you
   never ran (8 workers, 64), with DDP's all-reduce overlapping the backward.

``run_scaling`` (given) launches your benchmark at 1, 2 and 4 workers, times
all-reduces there, fits and predicts with your functions, and writes the
figures (JSON) and the measured and predicted efficiency (a plot). The
grader first runs ``measure_throughput`` on a synthetic step whose duration
it controls and compares your figure with the truth, then runs your
benchmark on the real model and shows you the figures; it fits all-reduce
times it made from known ``alpha`` and ``beta`` (with a little noise) with
your ``fit_alpha_beta``, and compares your predictions with the model's.
Check your work from the repository's root with ``make grade`` (every
exercise) or ``.venv/bin/python -m autograder grade --exercise 6`` (this one), or
with ``check(6)`` in the notebook ``course/06_launching``.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import distlab
from distlab.lab.bandwidth import allreduce_bandwidth
from distlab.models import make_mlp


def measure_throughput(step: Callable[[], None], batch_size: int, *, warmup: int, iters: int) -> float:
    """Global samples per second of ``step``, measured on every rank of the initialised process group.

    Contract (the grader checks the figure against the truth at 1, 2 and 4 ranks):

    * ``step()`` trains on ``batch_size`` samples of this rank's data; every
      rank calls it ``warmup + iters`` times in all.
    * The first ``warmup`` calls are not timed (the first steps are slow:
      allocations, caches, kernel selection, DDP's first-iteration bookkeeping).
    * The timed window starts when every rank has finished its warm-up and ends
      when every rank has finished its last step.
    * Throughput counts the samples of all ranks: ``world_size * batch_size * iters``
      divided by the window's length in seconds.
    * Return the same figure (a float) on every rank.
    """
    ### BEGIN SOLUTION
    device = distlab.device()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        step()
    sync()
    dist.barrier()                    # nobody starts the clock before everyone is warm
    start = time.perf_counter()
    for _ in range(iters):
        step()
    sync()                            # the device has really finished
    dist.barrier()                    # ... on every rank, the slowest included
    elapsed = torch.tensor(time.perf_counter() - start, dtype=torch.float64, device=device)
    dist.broadcast(elapsed, src=0)    # one clock, one figure on every rank
    return dist.get_world_size() * batch_size * iters / elapsed.item()
    ### END SOLUTION


def make_ddp_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, lr: float) -> Callable[[], None]:
    """A no-argument function doing one DDP training step on ``(x, y)`` (this rank's batch).

    Wrap ``model`` (already on this rank's device) in ``DistributedDataParallel``,
    optimise it with ``torch.optim.SGD(lr=lr)`` on the mean cross-entropy; each call
    of the returned function is one forward, backward (gradients all-reduced) and step.
    """
    ### BEGIN SOLUTION
    device = x.device
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=lr)

    def step() -> None:
        loss = nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step
    ### END SOLUTION


def fit_alpha_beta(rows: list[dict]) -> tuple[float, float]:
    """``(alpha, beta)`` of the ring all-reduce model, fitted to measured all-reduce times.

    Each row is one measurement, ``{"world": W, "numel": N, "seconds": t}``: one ``all_reduce`` of a
    float32 tensor of ``N`` elements on ``W >= 2`` ranks took ``t`` seconds. The rows mix world sizes,
    and not every size was measured at every world size. The model (notebook 00b): a ring all-reduce
    on ``W`` ranks takes ``2(W-1)`` steps, each paying the latency ``alpha`` (seconds), and every
    rank's link carries ``2(W-1)/W`` of the tensor's bytes, at ``beta`` seconds a byte.

    Fit both by least squares over all rows at once, on the *relative* errors
    ``(model - t) / t``: the sizes span decades, and in seconds the largest messages' noise would
    outweigh the smallest messages' whole times, which are what shows ``alpha``.
    """
    ### BEGIN SOLUTION
    t = torch.tensor([r["seconds"] for r in rows], dtype=torch.float64)
    w = torch.tensor([r["world"] for r in rows], dtype=torch.float64)
    nbytes = torch.tensor([r["numel"] for r in rows], dtype=torch.float64) * 4  # float32: 4 bytes each
    features = torch.stack([2 * (w - 1), 2 * (w - 1) / w * nbytes], dim=1)
    # Each row divided by its time: the residuals are relative errors, and the target is 1.
    fit = torch.linalg.lstsq(features / t.unsqueeze(1), torch.ones_like(t).unsqueeze(1)).solution
    alpha, beta = fit.squeeze(1).tolist()
    return alpha, beta
    ### END SOLUTION


def predict_efficiency(compute_s: float, backward_s: float, grad_bytes: float, world: int,
                       alpha: float, beta: float) -> float:
    """Predicted scaling efficiency at ``world`` workers, ``throughput(W) / (W * throughput(1))``.

    Every worker trains its own batch (the global batch grows with ``W``). One worker's step takes
    ``compute_s`` seconds (forward, backward and update), ``backward_s`` of them the backward. With
    ``W`` workers the step also all-reduces ``grad_bytes`` of gradients by a ring (``alpha``,
    ``beta`` as :func:`fit_alpha_beta` fits them), and DDP runs that all-reduce *during* the backward
    (its gradient buckets): assume a perfect overlap, so only the part of the all-reduce longer
    than the backward adds to the step. ``world`` may be one you never measured (8, 64).
    """
    ### BEGIN SOLUTION
    allreduce_s = 2 * (world - 1) * alpha + 2 * (world - 1) / world * grad_bytes * beta
    exposed_s = max(0.0, allreduce_s - backward_s)    # what the backward could not hide
    # W workers train W batches per step: throughput(W) / (W * throughput(1)) = t_step(1) / t_step(W)
    return compute_s / (compute_s + exposed_s)
    ### END SOLUTION


def bench_rank(*, batch_size: int = 128, hidden: int = 256, warmup: int = 5, iters: int = 30) -> dict:
    """One worker of the benchmark (given): the digits MLP on random data, timed with your code, and
    (on 2 or more workers) all-reduces of 4 KiB up to the gradients' size, timed for your α-β fit."""
    device = distlab.init_distributed()
    torch.manual_seed(dist.get_rank())
    model = make_mlp(seed=0, hidden=hidden).to(device)
    x = torch.randn(batch_size, 64, device=device)
    y = torch.randint(0, 10, (batch_size,), device=device)
    figure = measure_throughput(make_ddp_step(model, x, y, lr=0.01), batch_size, warmup=warmup, iters=iters)
    world, rows = dist.get_world_size(), []
    if world > 1:
        grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        rows = [{"world": world, "numel": r["bytes"] // 4, "seconds": r["time_s"]}
                for r in allreduce_bandwidth([4 << 10, 64 << 10, grad_bytes], device=device)]
    distlab.shutdown()
    return {"throughput": figure, "rows": rows}


def run_scaling(world_sizes=(1, 2, 4), out_dir: str | Path = "scaling-results", predict_at: int = 8,
                hidden: int = 256, batch_size: int = 128) -> dict:
    """Launch ``bench_rank`` at each world size; fit α and β to the all-reduces timed at every world size
    and predict the efficiency at ``predict_at`` workers with your functions; write the figures as JSON
    and the measured and predicted efficiency as a plot (given)."""
    throughput, rows = {}, []
    for w in world_sizes:
        got = distlab.torchrun(f"{__file__}:bench_rank", w, timeout=120,
                               kwargs=dict(hidden=hidden, batch_size=batch_size)).results[0]
        throughput[w], rows = got["throughput"], rows + got["rows"]
        print(f"{w} worker(s): {throughput[w]:,.0f} samples/s")
    efficiency = {w: t / (w * throughput[1]) for w, t in throughput.items()}
    alpha, beta = fit_alpha_beta(rows)
    compute_s = batch_size / throughput[1]          # one worker's step
    grad_bytes = sum(p.numel() * 4 for p in make_mlp(seed=0, hidden=hidden).parameters())
    # The backward does about twice the forward's FLOPs: about 2/3 of the step.
    predicted = {w: predict_efficiency(compute_s, 2 * compute_s / 3, grad_bytes, w, alpha, beta)
                 for w in sorted({*world_sizes, predict_at})}
    print(f"fitted α = {alpha * 1e6:.1f} µs a ring step, 1/β = {1 / beta / 1e9:.2f} GB/s; predicted efficiency "
          + ", ".join(f"{e:.0%} at {w}" for w, e in predicted.items()))
    return _write_results(throughput, efficiency, predicted, {"alpha_s": alpha, "beta_s_per_byte": beta}, out_dir)


def _write_results(throughput: dict, efficiency: dict, predicted: dict, fit: dict, out_dir: str | Path) -> dict:
    """``scaling.json`` (the figures) and ``scaling.png`` (measured and predicted efficiency) in ``out_dir``."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path, plot_path = out / "scaling.json", out / "scaling.png"
    json_path.write_text(json.dumps({
        "throughput": {str(w): t for w, t in sorted(throughput.items())},
        "efficiency": {str(w): e for w, e in sorted(efficiency.items())},
        "predicted_efficiency": {str(w): e for w, e in sorted(predicted.items())}, **fit}, indent=2))
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(sorted(efficiency), [efficiency[w] for w in sorted(efficiency)], "o-", label="measured")
    ax.plot(sorted(predicted), [predicted[w] for w in sorted(predicted)], "s--", label="α-β model, overlapped")
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set(xlabel="workers", ylabel="efficiency", xticks=sorted(predicted), ylim=(0, 1.1), title="DDP scaling")
    ax.legend()
    fig.tight_layout()
    fig.savefig(plot_path, dpi=100)
    plt.close(fig)
    return {"json": str(json_path), "plot": str(plot_path)}
