# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 07 · Pipeline parallelism
#
# Data parallelism (notebook 01) and FSDP (notebook 04) give every rank the *whole* model's
# computation on a slice of the batch. **Pipeline parallelism** gives every rank a slice of
# the *model*: rank 0 holds the first layers (stage 0), rank 1 the next ones (stage 1), and so
# on. Activations flow forward from stage to stage with point-to-point `send`/`recv`; gradients
# flow back the same way.
#
# Run naively, only one stage works at a time. **GPipe** (Huang et al., 2019) cuts the batch
# into `m` *micro-batches* and streams them: while stage 1 works on micro-batch 0, stage 0
# already computes micro-batch 1. All forwards, then all backwards. The stages still idle at
# the start and the end: the **bubble**. With `p` equal stages it is a fraction
#
# $$\text{bubble} = \frac{p-1}{m+p-1}$$
#
# of the step, whatever the forward and backward costs, so more micro-batches shrink it.
# **1F1B** (PipeDream-Flush, Narayanan et al., *Memory-Efficient Pipeline-Parallel DNN Training*,
# ICML 2021; also DAPPLE) has the same bubble but, once the pipeline is
# full, alternates one forward and one backward per stage: stage `s` keeps at most `p - s`
# micro-batches of activations alive instead of `m`. That memory saving is why 1F1B is the
# default in practice.
#
# **The APIs.** PyTorch's current API is `torch.distributed.pipelining` (`PipelineStage`,
# `ScheduleGPipe`, `Schedule1F1B`, interleaved and zero-bubble schedules). Older material uses
# `torch.distributed.pipeline.sync.Pipe` (from torchgpipe; removed in PyTorch 2.4) or the
# separate PiPPy project, which became `torch.distributed.pipelining`.

# %%
import matplotlib.pyplot as plt
import ipywidgets as widgets
from IPython.display import display

from distlab import torchrun
from distlab.pipeline import (as_events, bubble_fraction, gantt, ideal_schedule, peak_in_flight,
                              theoretical_bubble)

# %% [markdown]
# ## The ideal schedules
# On a perfect machine (forward 1 time unit, backward 2, no communication cost) the two
# schedules look like this. Read each row left to right: `F3` is the forward of micro-batch 3.

# %%
def draw_schedules(p: int = 4, m: int = 8, schedules=("gpipe", "1f1b")) -> dict:
    """Draw the ideal schedules side by side; return their bubble and peak in-flight micro-batches."""
    fig, axes = plt.subplots(len(schedules), 1, figsize=(10, 1.0 + 0.45 * p * len(schedules)), squeeze=False)
    summary = {}
    for ax, name in zip(axes[:, 0], schedules):
        events = ideal_schedule(p, m, name)
        peak = peak_in_flight(events)
        summary[name] = {"bubble": bubble_fraction(events), "peak activations (stage 0)": peak[0]}
        gantt(ax, events, f"{name.upper()}: p={p}, m={m}, bubble {bubble_fraction(events):.1%} "
                          f"(formula {theoretical_bubble(p, m):.1%}), stage 0 keeps {peak[0]} micro-batches")
    fig.tight_layout()
    plt.show()
    return summary


draw_schedules(4, 8)

# %% [markdown]
# Same bubble, different memory: GPipe's stage 0 holds all 8 micro-batches' activations
# before its first backward, 1F1B's holds 4 (= p).
#
# ## Explore
# Move the sliders: the bubble falls as `m` grows; 1F1B's peak memory stays at `p - s`
# micro-batches on stage `s` while GPipe's grows with `m`. (The figure below is the
# explorer's first drawing, computed when the notebook runs.)

# %%
def explore(stages: int = 4, microbatches: int = 8, schedule: str = "1f1b") -> None:
    events = ideal_schedule(stages, microbatches, schedule)
    peak = peak_in_flight(events)
    fig, ax = plt.subplots(figsize=(10, 0.6 + 0.45 * stages))
    gantt(ax, events, f"{schedule.upper()}: bubble {bubble_fraction(events):.1%} "
                      f"= (p-1)/(m+p-1) = {theoretical_bubble(stages, microbatches):.1%}; peak "
                      f"in-flight activations per stage {[peak[s] for s in range(stages)]}")
    plt.show()


explore(4, 8, "1f1b")
display(widgets.interactive(
    explore,
    stages=widgets.IntSlider(value=4, min=2, max=8, description="stages p"),
    microbatches=widgets.IntSlider(value=8, min=1, max=16, description="micro-batches m"),
    schedule=widgets.Dropdown(options=["gpipe", "1f1b"], value="1f1b", description="schedule"),
))

# %% [markdown]
# ## Measured, not only drawn
# Now a real run: an MLP (width 1024, batch 512) split into 2 stages on 2 ranks, driven by
# `torch.distributed.pipelining`. `distlab.pipeline.TimedStage` wraps each stage's module and
# logs the start and end of every forward and backward it actually runs; each rank returns
# its log. A first untimed step warms up (the library infers the shapes it will send).
#
# On a CPU the two stages share this machine's cores with everything else, and gloo's
# `send`/`recv` add a per-message cost (not measured here) that the formula ignores: expect the measured
# bubble above the formula, more so with many small micro-batches. On GPUs with NCCL the
# same code runs; communication is cheaper relative to compute there.

# %%
SIZE = dict(width=1024, batch=512)  # large enough that matrix products, not messages, dominate a step
RUNS = [dict(schedule="gpipe", n_microbatches=4, **SIZE), dict(schedule="1f1b", n_microbatches=4, **SIZE),
        dict(schedule="gpipe", n_microbatches=1, **SIZE), dict(schedule="gpipe", n_microbatches=8, **SIZE)]
print("running 4 pipelined steps on 2 ranks ...", flush=True)
job = torchrun("distlab.pipeline_run:pipeline_sweep", 2, args=(RUNS,), timeout=120)
timelines = [as_events([job.results[r][i]["events"] for r in range(2)]) for i in range(len(RUNS))]

fig, axes = plt.subplots(2, 1, figsize=(10, 3.2))
for ax, run, ev in zip(axes, RUNS[:2], timelines[:2]):
    gantt(ax, [e.__class__(e.stage, e.kind, e.mb, e.start * 1e3, e.end * 1e3, e.rows) for e in ev],
          f"measured {run['schedule'].upper()}, m={run['n_microbatches']}: bubble {bubble_fraction(ev):.1%} "
          f"(formula {theoretical_bubble(2, run['n_microbatches']):.1%})")
    ax.set_xlabel("ms")
fig.tight_layout()
plt.show()

# %% [markdown]
# The measured bubble next to the formula, for GPipe with 1, 4 and 8 micro-batches:

# %%
print(f"{'schedule':>8} {'m':>3} {'measured bubble':>16} {'(p-1)/(m+p-1)':>14}")
for run, ev in sorted(zip(RUNS, timelines), key=lambda t: (t[0]["schedule"], t[0]["n_microbatches"])):
    print(f"{run['schedule']:>8} {run['n_microbatches']:>3} {bubble_fraction(ev):>16.1%} "
          f"{theoretical_bubble(2, run['n_microbatches']):>14.1%}")

# %% [markdown]
# ## Parity: the pipelined model is the same model
# Splitting into stages and micro-batches must not change the mathematics: the loss and every
# gradient match the unsplit model's (up to float rounding: micro-batch gradients are summed
# in another order). Each rank compared its stage's gradients with `assert_close`.

# %%
for run, i in zip(RUNS, range(len(RUNS))):
    last = job.results[1][i]
    print(f"{run['schedule']:>5} m={run['n_microbatches']}: loss {last['loss']:.6f} (unsplit {last['unsplit_loss']:.6f}); "
          + ", ".join(f"stage {r} gradients match: {job.results[r][i]['grads_match']} "
                      f"(max abs diff {job.results[r][i]['max_grad_diff']:.1e})" for r in range(2)))
assert all(job.results[r][i]["grads_match"] for r in range(2) for i in range(len(RUNS))), "a pipelined run lost parity"

# %% [markdown]
# ## Exercise 7: GPipe by hand
# The library hides the interesting part. In `exercises/ex07_pipeline.py` you write the GPipe
# schedule of a 2-stage pipeline yourself with `dist.send` and `dist.recv`: chunk the batch,
# send each micro-batch's activations as soon as they exist, receive them on stage 1 into a
# buffer that requires grad, scale each micro-batch's loss by `1/m`, and send the gradient of
# that buffer back so stage 0 can continue its backward.
#
# *Why by hand rather than with `torch.distributed.pipelining`?* Driving the library is a
# few lines (this notebook did it above); what it does is invisible. Writing the sends and
# receives yourself shows where the bubble comes from, why the activations must be kept until
# their backward (the memory cost 1F1B reduces), and why the loss is divided by `m` — and
# every one of those is a mistake the grader recognises. Once it works, the library's
# schedules (1F1B, interleaved, zero-bubble) are variations on the loop you wrote.
#
# The grader runs your `gpipe_step` on 2 ranks and checks, from its own instruments: the loss
# and gradients against the unsplit model, 4 forwards and 4 backwards per stage, and that
# stage 1 started before stage 0 finished all its forwards.

# %%
from autograder.notebook import check

check(7, raise_on_fail=False)
