# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
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

from distlab.lab.pipeline.timeline import bubble_fraction, gantt, ideal_schedule, peak_in_flight, theoretical_bubble

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
# Now real runs: an MLP split into stages on 2 ranks, driven by `torch.distributed.pipelining`.
# `distlab.lab.pipeline.timeline.TimedStage` wraps each stage's module and logs the start and end of every
# forward and backward it actually runs; each rank returns its log. A first untimed step warms
# up (the library infers the shapes it will send). The measured bubble is the share of
# `stages x step time` in which no stage computed.
#
# The formula ignores one cost: every micro-batch crosses every stage boundary twice (its
# activations forward, their gradient back), and each `send`/`recv` costs time. So we measure
# that first, in the same job: a ping-pong between the two ranks, the median round trip per
# message size. Half of it is the one-way cost `c`.
#
# Two workloads: **sized** (8 layers of width 1024, narrowed to 64 features where a stage
# hands over to the next, batch 1024: each micro-batch's compute is ≥ 10x what the schedule pays
# per micro-batch, even at m = 8) and **small micro-batches** (width 256, batch 64: at m = 8 a
# micro-batch is 8 rows, and the per-micro-batch costs are a large share of its compute).
#
# *Only p = 2 here:* this machine may have 2 cores, and 4 ranks on 2 cores would wait for a
# core, not for their input; `make bench` measures p = 4 where there are ≥ 4 cores.

# %%
# Predict before you run: type your guess in the box (or write it in place of guess=None).
from distlab.lab.predict import predict

bubble_guess = predict(
    "GPipe's bubble (the share of stages x step time in which no stage computes), measured on 2 "
    "stages with m = 4 micro-batches of the sized workload",
    fmt=".2f", guess=None)

# %%
import numpy as np

from distlab.lab.pipeline.sweep import MEMORY, MICRO, SIZED, SMALL, select, sweep

RUNS = ([dict(schedule="gpipe", n_microbatches=m, **SIZED) for m in MICRO]
        + [dict(schedule="1f1b", n_microbatches=4, **SIZED)]
        + [dict(schedule="gpipe", n_microbatches=m, **SMALL) for m in MICRO]
        + [dict(schedule="gpipe", n_microbatches=m, **MEMORY) for m in MICRO]
        + [dict(schedule="1f1b", n_microbatches=m, **MEMORY) for m in MICRO if m >= 2]  # 1F1B needs m >= p
        + [dict(schedule="interleaved1f1b", n_microbatches=m, stages_per_rank=2, **SIZED) for m in (2, 4, 8)]
        + [dict(schedule="zbv", n_microbatches=8, **SIZED)])
print(f"running {len(RUNS)} pipelined steps and a send/recv ping-pong on 2 ranks ...", flush=True)
figs, costs = sweep(RUNS, 2, timeout=180)
F = [dict(f, **r) for r, f in zip(RUNS, figs)]
pick = lambda schedule, workload: select(RUNS, figs, schedule, workload)  # noqa: E731

fig, ax = plt.subplots(figsize=(5, 3))
ax.loglog([c["bytes"] for c in costs], [c["round_trip_s"] * 1e6 for c in costs], "o-")
ax.set_xlabel("message size (bytes)")
ax.set_ylabel("send/recv round trip (µs)")
ax.set_title("gloo point-to-point, this machine", fontsize=10)
fig.tight_layout()
plt.show()
for c in costs:
    print(f"{c['bytes'] / 1024:8g} KiB: round trip {c['round_trip_s'] * 1e6:7.0f} µs, "
          f"one way c = {c['round_trip_s'] * 5e5:6.0f} µs")

# %% [markdown]
# The measured GPipe bubble against the formula, and against a **model made of what the run
# measured** (`distlab.lab.pipeline.costs.bubble_model`): every action of stage `s` takes a slot of its
# own compute (`f_s` forward, `b_s` backward, medians from the timeline), plus the schedule's own
# work between two actions `o`, plus the message `c`. The forwards stream through the stages at
# the pace of the slowest slot, and so do the backwards:
#
# $$\text{step} = \sum_s (f_s + o + c) + (m-1)\max_s (f_s + o + c) + \text{the same for } b,
# \qquad \text{bubble} = 1 - \frac{m \sum_s (f_s + b_s)}{p \cdot \text{step}}$$
#
# With equal stages and `o = c = 0` it is the formula. `o` is read off the timeline: the idle gap
# between two actions that wait for no message (stage 0's forwards, the last stage's backwards):
# Python in `torch.distributed.pipelining` building the chunks, the send and receive ops, the loss.
# The dotted lines keep only the messages, `(p-1)/(m+p-1) + m·(p-1)·c / step time`.
#
# *Sized:* on the formula at m = 1 and 2, and falling with m. At m = 4 and 8 this 2-core machine
# measures 5-17 points more: about half of it is `o` (~0.6 ms per action against ~8 ms of forward
# at m = 8), which the model adds; the rest is messages that arrive late. The ping-pong measured
# `c` between idle ranks; during the step the sender keeps computing, and gloo's communication
# thread must wait for a core (2 ranks on 2 cores: none is free). On a machine with a spare core
# per rank, or on GPUs, that part goes away.
#
# *Small micro-batches:* far above the formula. The messages (dotted) explain little; the
# schedule's own work per action is about as long as an 8-row micro-batch's compute, and the
# model with `o` comes within 10-20 points. Both costs are paid per micro-batch, which is why
# micro-batches must stay large enough to hide them: the bubble formula only rewards more
# micro-batches while each one is still much more compute than overhead.

# %%
fig, ax = plt.subplots(figsize=(6, 3.5))
ms = np.arange(1, 9)
ax.plot(ms, [theoretical_bubble(2, m) for m in ms], "k-", label="formula (p-1)/(m+p-1)")
for size, label, color in ((SIZED, "sized", "C0"), (SMALL, "small micro-batches", "C3")):
    runs = pick("gpipe", size)
    ax.plot([f["m"] for f in runs], [f["bubble"] for f in runs], "o", color=color, label=f"measured, {label}")
    ax.plot([f["m"] for f in runs], [f["with_messages"] for f in runs], ":", color=color,
            label=f"formula + m(p-1)c/step, {label}")
    ax.plot([f["m"] for f in runs], [f["model"] for f in runs], "--", color=color,
            label=f"model: measured f, b, o, c, {label}")
ax.set_xlabel("micro-batches m")
ax.set_ylabel("bubble")
ax.set_ylim(0, 1)
ax.legend(fontsize=7)
fig.tight_layout()
plt.show()
print(f"{'workload':>9} {'m':>3} {'measured':>9} {'formula':>8} {'+messages':>10} {'model':>6} "
      f"{'compute/mb':>11} {'o':>7} {'c':>7}")
for size, label in ((SIZED, "sized"), (SMALL, "small")):
    for f in pick("gpipe", size):
        print(f"{label:>9} {f['m']:>3} {f['bubble']:>9.1%} {f['formula']:>8.1%} {f['with_messages']:>10.1%} "
              f"{f['model']:>6.1%} {f['compute_per_mb_s'] * 1e3:>8.2f} ms {f['overhead_s'] * 1e6:>4.0f} µs "
              f"{f['c'] * 1e6:>4.0f} µs")

# %%
bubble_guess.reveal(next(f["bubble"] for f in pick("gpipe", SIZED) if f["m"] == 4))

# %% [markdown]
# The timelines behind two of those points, GPipe and 1F1B with m = 4 on the sized workload:

# %%
fig, axes = plt.subplots(2, 1, figsize=(10, 3.2))
for ax, f in zip(axes, [pick("gpipe", SIZED)[2], pick("1f1b", SIZED)[0]]):
    gantt(ax, [e.__class__(e.stage, e.kind, e.mb, e.start * 1e3, e.end * 1e3, e.rows) for e in f["events"]],
          f"measured {f['schedule'].upper()}, m={f['m']}: bubble {f['bubble']:.1%} (formula {f['formula']:.1%})")
    ax.set_xlabel("ms")
fig.tight_layout()
plt.show()

# %% [markdown]
# ## Memory, measured
# `distlab.lab.pipeline.costs.SavedBytes` counts the bytes autograd keeps for the backward
# (`torch.autograd.graph.saved_tensors_hooks`) on stage 0, at their peak during the step. The
# micro-batch is fixed (32 rows), so a step with m micro-batches does m times the work.
# GPipe keeps every micro-batch's activations until its backwards start: m × a. 1F1B starts
# backwards once p micro-batches are in flight: min(m, p) × a.

# %%
gp, ob = pick("gpipe", MEMORY), pick("1f1b", MEMORY)
a = gp[0]["saved_peak_bytes"]
fig, ax = plt.subplots(figsize=(5, 3))
ax.plot([f["m"] for f in gp], [f["saved_peak_bytes"] / 2**20 for f in gp], "o", color="C0", label="GPipe, measured")
ax.plot(ms, ms * a / 2**20, "-", color="C0", lw=0.8, label="m × a")
ax.plot([f["m"] for f in ob], [f["saved_peak_bytes"] / 2**20 for f in ob], "s", color="C1", label="1F1B, measured")
ax.plot(ms[1:], np.minimum(ms[1:], 2) * a / 2**20, "-", color="C1", lw=0.8, label="min(m, p) × a")
ax.set_xlabel("micro-batches m")
ax.set_ylabel("stage-0 peak saved (MiB)")
ax.legend(fontsize=7)
fig.tight_layout()
plt.show()

# %% [markdown]
# In the course's one accounting (`distlab.lab.training_memory`, notebooks 00 to 08), a pipeline
# divides the model state by the stages, since each rank holds only its own layers' parameters,
# gradients and optimizer state, and its schedule sets the activations term, measured above.
# Stage 0 of this 2-stage model, as if it were trained in fp32 with Adam (the runs above take no
# optimizer step), at m = 8:

# %%
from distlab.lab.pipeline.run import cuts, mlp
from distlab.lab.training_memory import training_memory

full = mlp(MEMORY["depth"], MEMORY["width"], seed=0)
cut = cuts(len(full), MEMORY["depth"], 2)
n_stage0 = sum(p.numel() for p in full[cut[0]:cut[1]].parameters())
n_whole = sum(p.numel() for p in full.parameters())
KiB = 2**10
print(f"stage 0 holds {n_stage0:,} of the model's {n_whole:,} parameters; stage 0's memory, KiB:")
print(f"{'schedule':>9} {'params':>7} {'grads':>6} {'Adam':>6} {'activations':>12} {'total':>7}")
for name, figures in (("GPipe", gp), ("1F1B", ob)):
    peak = next(f["saved_peak_bytes"] for f in figures if f["m"] == 8)
    mem = training_memory(n_stage0, precision="fp32", optimizer="adam", activations=peak)
    print(f"{name:>9} {mem['params'] / KiB:>7.0f} {mem['grads'] / KiB:>6.0f} {mem['optimizer'] / KiB:>6.0f} "
          f"{mem['activations'] / KiB:>12.0f} {mem['total'] / KiB:>7.0f}")

# %% [markdown]
# The state terms are the same under both schedules; 1F1B's saving is all in the activations.
#
# ## Interleaved 1F1B and zero bubble
# **Interleaved 1F1B** (Narayanan et al., *Efficient Large-Scale Language Model Training on
# GPU Clusters Using Megatron-LM*, SC'21) gives each rank `v` smaller stages (here rank 0
# holds stages 0 and 2, rank 1 stages 1 and 3): the pipeline fills in `1/v` of the time, so
# the bubble is `(p-1)/(v·m + p-1)`, at the price of `v` times as many messages.
# **Zero bubble** (Qi et al., *Zero Bubble Pipeline Parallelism*, ICLR 2024) splits each
# backward into the input gradient (needed by the previous stage now) and the weight gradient
# (needed only at the optimizer step), and fills the bubble with the latter. Both run on this
# CPU with gloo (`ScheduleInterleaved1F1B`, `ScheduleZBVZeroBubble`). The zero-bubble run is
# not timed per stage: `TimedStage`'s marks are views, which its split backward cannot
# `detach_()`, so we compare its step time.

# %%
il = pick("interleaved1f1b", SIZED)
print(f"{'schedule':>16} {'m':>3} {'measured':>9} {'(p-1)/(vm+p-1)':>15} {'step':>8}")
for f in pick("gpipe", SIZED)[1:] + il:
    print(f"{f['schedule']:>16} {f['m']:>3} {f['bubble']:>9.1%} {f['formula']:>15.1%} {f['wall_s'] * 1e3:>5.0f} ms")
zbv = pick("zbv", SIZED)[0]
print(f"ZBV zero bubble, m=8: step {zbv['wall_s'] * 1e3:.0f} ms, interleaved 1F1B {il[-1]['wall_s'] * 1e3:.0f} ms")

# %% [markdown]
# On this CPU, interleaving does not deliver its formula: the measured bubble stays near
# GPipe's. It doubles the stage boundaries, and the new ones are wide (1024 features, not the
# 64 of the rank boundary), so it sends more and larger messages; it doubles the schedule's
# actions, each with its own per-micro-batch overhead; and its stages are half as long, so the
# same overheads weigh twice as much. The formula counts none of these. On GPUs, where a
# stage is long next to a message over NVLink, interleaving pays; here the overheads win.

# %% [markdown]
# ## Parity: the pipelined model is the same model
# Splitting into stages and micro-batches must not change the mathematics: every gradient
# matches the unsplit model's (up to float rounding: micro-batch gradients are summed in
# another order). Each rank compared its stages' gradients with `assert_close`.

# %%
for f in F:
    print(f"{f['schedule']:>16} m={f['m']} width {f['width']}: gradients match {f['grads_match']} "
          f"(max abs diff {f['max_grad_diff']:.1e})")
assert all(f["grads_match"] for f in F), "a pipelined run lost parity"

# %% [markdown]
# ## Exercise 7: GPipe and 1F1B by hand
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
#
# **Part 2: 1F1B by hand.** Then write `one_f_one_b_step`, the same step in 1F1B's order. Before
# you do, work out the schedule on paper for `p = 2` stages and `m = 4` micro-batches: which
# forwards and backwards each stage runs, in which order, and how many micro-batches' activations
# each holds at most. Type your answer for stage 0 below, then compare it with `draw_schedules`'s
# 1F1B panel above. Two things the drawing does not show: in the steady state *both* neighbours
# send at once (stage 0 a forward's activations, stage 1 a backward's gradient), so a blocking
# `dist.send` on both sides waits forever for a receive; and a micro-batch's activations are only
# freed if nothing still references its graph after its backward. The grader reads each stage's
# order of forwards, backwards and sends (an order, not a time), and counts the bytes of
# activations each stage keeps with a saved-tensor counter.

# %%
# Predict before you run: type your guess in the box (or write it in place of guess=None).
held_guess = predict("micro-batches' activations stage 0 holds at once under 1F1B with p = 2 stages, m = 4",
                     fmt=".0f", guess=None)

# %%
schedule = draw_schedules(2, 4, ("1f1b",))   # the drawing: count stage 0's forwards before each backward

# %%
held_guess.reveal(peak_in_flight(ideal_schedule(2, 4, "1f1b"))[0])

# %%
from autograder import check

check(7, raise_on_fail=False)
