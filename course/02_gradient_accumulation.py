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
# # 02 · Gradient accumulation: a large batch in small pieces
#
# **Why.** The memory a training step needs grows with the batch: every layer keeps its
# activations for backward, one row per sample. When the batch you want (for the optimizer's
# sake: Goyal et al., *Accurate, Large Minibatch SGD*, 2017) does not fit, split it into `k`
# **micro-batches**, run forward and backward on each, let the gradients add up in `.grad`, and
# step once. Only one micro-batch's activations are alive at a time.
#
# **The normalisation argument.** The loss of a batch of `N` samples is the mean
# $L = \frac1N\sum_{j=1}^{N}\ell_j$. Split the batch into micro-batches of $n_1,\dots,n_k$ samples
# with mean losses $L_i$. Then
# $$L = \sum_{i=1}^{k} \frac{n_i}{N}\, L_i, \qquad \nabla L = \sum_{i=1}^{k} \frac{n_i}{N}\,\nabla L_i .$$
# Gradients add up in `.grad`, so back-propagating $\frac{n_i}{N} L_i$ for each micro-batch leaves
# exactly $\nabla L$ there. With equal sizes $n_i/N = 1/k$: **divide each loss by k**. Forget it
# and the gradient is `k` times too large. Under SGD that is a `k`-times larger learning rate in
# disguise. Adam divides by the gradient's own scale, so it barely notices: `exp_avg` grows `k`
# times, `exp_avg_sq` `k²` times, and the update `exp_avg / (√exp_avg_sq + eps)` is the same but
# for `eps`. Not with `Adam(weight_decay=λ)`: its L2 term `λθ` joins the gradient before the
# moments, so it weighs `k` times less (AdamW's decoupled decay keeps the invariance). With Adam
# the harm comes mostly through gradient clipping: `clip_grad_norm_(model.parameters(), 1.0)` now
# sees a `k`-times larger norm, clips where it should not, and the threshold means something else
# for every `k`.
#
# **Under DDP** every `backward()` ends with an all-reduce of the gradients. Between the
# boundaries of a window that is wasted traffic: only the sum at the end matters. `model.no_sync()`
# skips it, and the ranks' gradients stay different until the last micro-batch's backward
# all-reduces their sums. Older code sometimes sets `require_backward_grad_sync` by hand; `no_sync()`
# is the API (FSDP2's `fully_shard` modules have `set_requires_gradient_sync(False)` instead).

# %%
# %load_ext distlab

# %% [markdown]
# ## The equivalence, numerically (one process)
#
# One batch of 64 digits against 4 micro-batches of 16, with and without dividing the loss; then
# unequal micro-batches (8, 40 and 16 samples) weighted by $1/k$ and by $n_i/N$.

# %%
import torch
from torch import nn

from distlab.data import digits
from distlab.models import make_mlp

x, y = digits().tensors
model = make_mlp(seed=0)


def grad_of(parts, weight):
    """Accumulate backward over micro-batches given as index ranges; return the flat gradient."""
    model.zero_grad()
    total = sum(len(p) for p in parts)
    for p in parts:
        loss = nn.functional.cross_entropy(model(x[p]), y[p])
        (loss * weight(len(p), total, len(parts))).backward()
    return torch.cat([q.grad.flatten() for q in model.parameters()])


big = grad_of([range(0, 64)], lambda n, N, k: 1.0)
equal = [range(16 * i, 16 * i + 16) for i in range(4)]
unequal = [range(0, 8), range(8, 48), range(48, 64)]
cases = {
    "4 x 16, loss / k": grad_of(equal, lambda n, N, k: 1 / k),
    "4 x 16, loss not divided": grad_of(equal, lambda n, N, k: 1.0),
    "8+40+16, loss / k": grad_of(unequal, lambda n, N, k: 1 / k),
    "8+40+16, loss * n_i / N": grad_of(unequal, lambda n, N, k: n / N),
}
print(f"{'accumulated over':28s} {'max |g - g_big|':>16s} {'|g| / |g_big|':>14s}")
for name, g in cases.items():
    print(f"{name:28s} {(g - big).abs().max().item():16.2e} {(g.norm() / big.norm()).item():14.3f}")

# %% [markdown]
# Equal to float rounding (see the first column) when the weights are right; 4x too large when the loss is
# not divided; and with unequal micro-batches, $1/k$ over-weights the small ones: only $n_i/N$
# gives the big-batch gradient.
#
# **Tokens, and other ranks.** A language model's loss is a mean over *tokens*, and a batch of
# padded sequences holds as many tokens as its sequences are long: then $n_i$ is a token count
# that changes with every micro-batch, and the label of a padding token (`-100`, `cross_entropy`'s
# `ignore_index`) is no token at all. Under DDP the big batch is every rank's micro-batches
# together, so $N$ counts the tokens of *all* ranks, while each rank can count only its own. Several
# libraries shipped exactly this normalisation wrong in 2024 (they averaged per-micro-batch means).
# Before the exercise, work out on paper: who knows $N$, and when? And what does DDP's *average*
# over the ranks do to a loss you normalised by a global count?
#
# ## Under DDP: `no_sync()` saves all-reduces, and the ranks differ until the boundary
#
# Two ranks accumulate 4 micro-batches, once with an all-reduce after every backward and once
# with `no_sync()` on the first three. A **DDP communication hook** counts the all-reduces (DDP's
# reducer runs in C++, so wrapping `dist.all_reduce` would count nothing).

# %%
# %%torchrun -n 2 --result sync_runs
import contextlib

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

import distlab
from distlab.data import digits
from distlab.models import make_mlp

distlab.init_distributed()
rank = dist.get_rank()
ddp = DDP(make_mlp(seed=0))
calls = []


def counting_hook(state, bucket):
    calls.append(bucket.index())
    return default_hooks.allreduce_hook(None, bucket)


ddp.register_comm_hook(None, counting_hook)
x, y = digits().tensors
result = {}
for use_no_sync in (False, True):
    ddp.zero_grad()
    calls.clear()
    for i in range(4):
        lo = 32 * i + 16 * rank                      # micro-batch i: 16 samples per rank
        skip = use_no_sync and i < 3                 # the last micro-batch synchronises
        with ddp.no_sync() if skip else contextlib.nullcontext():
            (nn.functional.cross_entropy(ddp(x[lo:lo + 16]), y[lo:lo + 16]) / 4).backward()
        if i == 1:
            mid = list(ddp.parameters())[-1].grad[:3].tolist()   # output-layer bias
    final = list(ddp.parameters())[-1].grad[:3].tolist()
    result["no_sync" if use_no_sync else "sync every micro-step"] = {
        "all-reduces": len(calls), "grad after micro-step 2": mid, "grad at the boundary": final}
distlab.shutdown()

# %%
for mode in sync_runs[0]:
    print(f"{mode}: {sync_runs[0][mode]['all-reduces']} all-reduce(s) per optimizer step")
    for key in ("grad after micro-step 2", "grad at the boundary"):
        r0, r1 = (sync_runs[r][mode][key] for r in (0, 1))
        print(f"   {key:24s} rank 0 {[f'{v:+.5f}' for v in r0]}  rank 1 {[f'{v:+.5f}' for v in r1]}  "
              f"{'same' if r0 == r1 else 'DIFFERENT'}")

# %% [markdown]
# With `no_sync()` the ranks' gradients differ in the middle of the window (each holds its own
# partial sum) and agree at the boundary, after **one** all-reduce instead of four; the final
# gradients are the same either way (up to float rounding). The grader uses exactly these two
# observations: a comm-hook count, and the ranks' gradients mid-window.
#
# ## Memory and throughput against k, at a fixed effective batch
#
# 256 samples per rank per optimizer step, split into k = 1, 2, 4, 8 micro-batches, at 2 ranks
# (`distlab/lab/accumulation.py`, also a row of `make bench`). The loop measured is **yours**
# (`exercises/ex02_accumulation.py`) once you have written it; until then, the reference
# solution where this copy of the course has one.
# Memory is the activation bytes one micro-step saves for backward (on a GPU: the peak
# allocated). Timing uses a fixed number of steps between barriers, not
# `torch.utils.benchmark`'s adaptive repeat count: ranks choosing different counts would wait
# forever in each other's all-reduce.

# %%
# Predict before you run: type your guess in the box (or write it in place of guess=None).
from distlab.lab.predict import predict

k_guess = predict(
    "throughput at k = 8 micro-batches as a fraction of k = 1 (same 256 samples per step)",
    fmt=".2f", guess=None)

# %%
from pathlib import Path

import matplotlib.pyplot as plt

import distlab
from autograder.nbgrader_cell import stubs_left
from distlab.lab.accumulation import sweep

mine, reference = Path("../exercises/ex02_accumulation.py").resolve(), Path("../solutions/ex02_accumulation.py").resolve()
if mine.exists() and not stubs_left(mine.name, mine.parent):
    train = f"{mine}:train_accumulated"
elif reference.exists():
    train = f"{reference}:train_accumulated"
    print("measuring the reference solution's loop until yours is written")
else:
    train = None
    print("write train_accumulated in exercises/ex02_accumulation.py, then run this cell again")
res = None
if train:
    run = distlab.torchrun(sweep, 2, kwargs=dict(steps=2, repeats=3, train=train), timeout=180, stream=True)
    res = run.results[0]


def plot_sweep(res: list[dict]) -> None:
    ks = [r["k"] for r in res]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3))
    ax1.plot(ks, [r["activation_bytes"] / 2**20 for r in res], "o-")
    ax1.set(xscale="log", xticks=ks, xticklabels=ks, xlabel="micro-batches per step (k)",
            ylabel="MiB", title="activation memory of one micro-step")
    ax2.plot(ks, [r["samples_per_s"] for r in res], "o-", color="C1")
    ax2.set(xscale="log", xticks=ks, xticklabels=ks, xlabel="micro-batches per step (k)",
            ylabel="samples/s (2 ranks)", title="throughput")
    plt.tight_layout()
    plt.show()
    print("all-reduce rounds per optimizer step:", {r["k"]: r["allreduce_per_step"] for r in res})
    print("memory measured as:", res[0]["memory_method"])


if res:
    plot_sweep(res)

# %%
if res:
    per_k = {r["k"]: r["samples_per_s"] for r in res}
    k_guess.reveal(per_k[max(per_k)] / per_k[min(per_k)])
else:
    print("no sweep ran (see the cell above): no measurement to set beside your prediction")

# %% [markdown]
# Activation memory falls as $1/k$ (plus the input batch, held whole, here 0.25 MiB); the
# all-reduces stay at one per step; throughput drops
# as the micro-batches shrink (smaller matrix multiplications, more Python per sample). On a
# shared CPU the throughput curve is noisy; the memory curve is exact. Accumulation trades time
# for memory: use the largest micro-batch that fits.
#
# What it trades is one term of the accounting notebook 00 began (`distlab.lab.training_memory`,
# the same function in notebooks 00 to 05, 07 and 08): each rank holds the parameters, their gradients
# and the optimizer's state whatever k is (here fp32 and plain SGD: 4 + 4 + 0 bytes a parameter;
# with Adam, 16), and only the activations shrink. The measured activations of one micro-step go in
# as its `activations` term:

# %%
from distlab.lab.accumulation import MODEL
from distlab.lab.training_memory import training_memory
from distlab.models import make_mlp

n_params = sum(p.numel() for p in make_mlp(seed=0, **MODEL).parameters())
if res:
    MiB = 2**20
    print(f"{n_params:,} parameters; per rank, MiB:")
    print(f"{'k':>2} {'params':>7} {'grads':>6} {'optimizer':>10} {'activations':>12} {'total':>7}")
    for r in res:
        m = training_memory(n_params, precision="fp32", optimizer="sgd", activations=r["activation_bytes"])
        print(f"{r['k']:>2} {m['params'] / MiB:>7.2f} {m['grads'] / MiB:>6.2f} {m['optimizer'] / MiB:>10.2f} "
              f"{m['activations'] / MiB:>12.2f} {m['total'] / MiB:>7.2f}")

# %% [markdown]
# Accumulation shrinks the total only by the activations it saves. In this MLP the state (about
# 10 MiB) already outweighs one micro-step's activations at k = 1, so k = 8 saves under a fifth of
# the total; it pays where the activations dominate (large batches, long sequences, notebook 08).
# Where the state itself does not fit (notebook 00's 7B model: 112 GB of it before one activation),
# accumulation cannot help: sharding the state does (notebook 04). The accounting leaves out
# what DDP adds itself: its gradient buckets hold a second copy of the gradients unless
# `DDP(..., gradient_as_bucket_view=True)` makes the gradients views into them.
#
# ## Exercise 2
#
# Open `exercises/ex02_accumulation.py` and write `train_accumulated`. The grader runs it at
# 2 ranks on equal micro-batches, unequal ones, a final short window, and padded sequences whose
# token counts differ between micro-batches and between ranks, and compares each optimizer step
# with one big batch computed in a single process (for the sequences: the mean over every
# non-padding token of the window on both ranks).

# %%
from autograder import check

report = check(2, raise_on_fail=False)
