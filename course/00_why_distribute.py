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
# # 00 · Why distribute?
#
# You reach for more than one process or GPU for one of three reasons:
#
# | scenario | symptom | what helps | notebook |
# |---|---|---|---|
# | **time** | one epoch takes hours | split each batch over W workers (data parallelism) | 01 DDP, 06 launching |
# | **memory** | the batch you want does not fit | accumulate gradients over micro-batches; lower precision | 02, 03 |
# | **model size** | weights + gradients + optimizer state do not fit on one device | shard the training state (FSDP / ZeRO), split the layers (pipeline) | 04, 07 |
#
# and once a run takes days, **checkpointing** (05) stops one crash from costing you the run.
#
# This notebook does the arithmetic that tells you which case you are in, then starts your
# first distributed job: several real processes, talking over a real communication backend.

# %%
import os

import matplotlib.pyplot as plt
import torch

import distlab

print(f"torch {torch.__version__}; {os.cpu_count()} CPU cores; CUDA available: {torch.cuda.is_available()}"
      + (f" ({torch.cuda.device_count()} GPUs)" if torch.cuda.is_available() else ""))
print(f"a 2-process job here would use the '{distlab.pick_backend(2)}' backend "
      "(NCCL needs one GPU per process; gloo runs on CPUs)")

# %%
# Predict before you run: type your guess in the box (or write it in place of guess=None).
from distlab.lab.predict import predict

memory_guess = predict(
    "GB of training state (weights, gradients, Adam) for a 7B-parameter model in fp32 on one GPU",
    unit="GB", guess=None)

# %% [markdown]
# ## The memory arithmetic of training
#
# Training with Adam in fp32 keeps, **per parameter**:
#
# * the weight itself (4 bytes),
# * its gradient (4 bytes),
# * Adam's two moving averages, `exp_avg` and `exp_avg_sq` (4 + 4 bytes),
#
# so 16 bytes per parameter before a single activation is stored. Mixed precision (notebook 03)
# stores the weights and gradients in 16 bits but keeps an fp32 **master copy** for the update:
# 2 + 2 + 4 + 4 + 4, the same 16 bytes. Sharding this state over W GPUs, as FSDP and ZeRO stage 3
# do (Rajbhandari et al., *ZeRO*, 2020), divides it by W. `distlab.lab.training_memory` does this
# arithmetic, here and in notebooks 01 to 05, 07 and 08.

# %%
from distlab.lab.training_memory import training_memory

GB = 1e9  # decimal gigabytes, as GPU data sheets count
PARTS = {"params": "weights", "grads": "gradients", "master": "fp32 master copy", "optimizer": "Adam's moments"}

seven_b = training_memory(7e9)  # fp32, Adam, one GPU
sharded = training_memory(7e9, world=8, level="full")
print(f"7B parameters, fp32, Adam: {seven_b['total'] / GB:.0f} GB in total")
print(f"bf16 mixed precision:      {training_memory(7e9, precision='bf16')['total'] / GB:.0f} GB in total")
print(f"sharded over 8 GPUs:       {sharded['total'] / GB:.0f} GB per GPU")

# %%
memory_guess.reveal(seven_b["total"] / GB, what="computed")

# %%
fig, ax = plt.subplots(figsize=(7, 3))
labels, lefts = ["1 GPU", "each of 8 GPUs"], [0.0, 0.0]
for name, colour in zip(["params", "grads", "optimizer"], ["tab:blue", "tab:orange", "tab:green"]):
    widths = [seven_b[name] / GB, sharded[name] / GB]
    ax.barh(labels, widths, left=lefts, color=colour, label=PARTS[name])
    lefts = [left + width for left, width in zip(lefts, widths)]
for gpu, colour in [(80, "red"), (141, "purple")]:
    ax.axvline(gpu, color=colour, ls="--", lw=1)
    ax.text(gpu, 1.35, f"{gpu} GB GPU", color=colour, ha="center", fontsize=8)
ax.set_xlabel("GB of training state (before activations)")
ax.set_title("7B-parameter model, fp32 + Adam")
ax.legend(loc="lower right", fontsize=8)
plt.tight_layout()
plt.show()

# %% [markdown]
# Both bars come from the same function, the second with `world=8, level="full"`. 112 GB does not fit
# on an 80 GB GPU; 14 GB per GPU does, leaving room
# for activations. Notebook **04** measures this on a real sharded run.
#
# **Activations** come on top, and grow with the batch and the sequence. Korthikanti et al. (2022) count
# what one GPT layer keeps for its backward: `s b h (34 + 5 a s / h)` bytes in 16-bit, for sequence
# length `s`, micro-batch `b`, width `h` and `a` heads (a Llama layer, with SwiGLU and no dropout, has
# other constants, of the same size). The second term is the attention scores; an
# attention that never stores them (FlashAttention, or recomputing the core attention: notebook 08) keeps
# only the first.
#
# ## The time arithmetic
#
# The first row of the table above is arithmetic too. Training a model of `N` parameters on `D` tokens
# costs about `6 N D` FLOPs (Kaplan et al., 2020: `2 N` per token forward, `4 N` backward). A GPU does
# a fraction of its datasheet peak, the **model FLOPs utilisation** (MFU; notebook 09 measures it): 30 to
# 50% is good for a large run. So the time is `6 N D / (peak x MFU)` GPU-seconds, divided by the GPUs.

# %%
from distlab.lab.activation_memory import transformer_layer_bytes
from distlab.lab.mfu import training_seconds

# A Llama-2-7B-shaped model (Touvron et al., 2023): 6.74e9 parameters, 32 layers, width 4096, 32 heads,
# trained on 2.0e12 tokens of 4096; Meta reports 184,320 A100-80GB GPU-hours for it (the paper's Table 2).
N, D, A100_BF16 = 6.74e9, 2.0e12, 312e12
for mfu in (0.3, 0.4, 0.5):
    days = training_seconds(N, D, peak_flops_per_s=A100_BF16, mfu=mfu) / 86400
    print(f"MFU {mfu:.0%}: {days:,.0f} A100-days = {days / 1024:.1f} days on 1024 A100s")
print(f"published: {184_320 / 24:,.0f} A100-days, an MFU of {6 * N * D / (184_320 * 3600 * A100_BF16):.0%}")
per_layer = transformer_layer_bytes(4096, 1, 4096, 32)
stored_no_scores = transformer_layer_bytes(4096, 1, 4096, 32, recompute="selective")
print(f"activations of one sequence of 4096 tokens: {32 * per_layer / GB:.0f} GB over 32 layers with the "
      f"attention scores stored, {32 * stored_no_scores / GB:.0f} GB without them")

# %% [markdown]
# One GPU would need about twenty years; a thousand need a week. That is the **time** case, and the
# **memory** case is in the same cell: the activations of *one* 4096-token sequence, with the scores
# stored, are about as large as the 112 GB of training state. Neither is solved by a faster GPU.
#
# ## Your first distributed job
#
# `torchrun` starts W copies of a program. Each copy is a *rank*; torchrun tells it who it is
# through environment variables (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`, ...).
# The ranks meet (the *rendezvous*) and then talk through *collectives* such as `all_reduce`,
# which leaves the sum of every rank's tensor on every rank.
#
# The `%%torchrun` cell magic runs a cell's code that way, here on 4 ranks. Every rank is a
# process of its own: names defined elsewhere in this notebook do not exist inside it.
# Underneath, `distlab.torchrun` runs torchrun's own engine (`elastic_launch`) with the
# arguments of `torchrun --standalone --nproc-per-node=4 cell.py`, but forks the ranks from a
# server that imported torch once (`--start-method=fork`), so a launch costs about a second
# instead of every rank importing torch again.
# (`%%time`, IPython's, on the first line prints how long the whole cell took: we come back to
# that below.)

# %%
# %load_ext distlab

# %%
# %%time
# %%torchrun -n 4 --result ranks
import os
import time

import torch
import torch.distributed as dist

import distlab

device = distlab.init_distributed()  # reads RANK, WORLD_SIZE, MASTER_ADDR/PORT set by torchrun
rank, world = dist.get_rank(), dist.get_world_size()
start = time.perf_counter()
x = torch.tensor([float(rank + 1)], device=device)  # NCCL reduces GPU tensors, gloo CPU ones
dist.all_reduce(x)  # sum over ranks, in place, on every rank
work_s = time.perf_counter() - start
print(f"I am rank {rank} of {world} (pid {os.getpid()}); after all_reduce x = {x.item():g}")
result = {"rank": rank, "pid": os.getpid(), "sum": x.item(), "work_s": work_s}
distlab.shutdown()

# %% [markdown]
# Four different process ids, one answer: 1 + 2 + 3 + 4 = 10 on every rank. The results came
# back to this notebook through `--result ranks`:

# %%
for r in ranks:
    print(r)
assert len({r["pid"] for r in ranks}) == 4 and {r["sum"] for r in ranks} == {10.0}

# %% [markdown]
# ## What costs what
#
# Starting the processes is not free: torchrun starts, then each rank imports torch and joins
# the rendezvous. The torchrun CLI pays all of it on every launch (10 s or more on a 2-core
# laptop); `distlab.torchrun` pays the imports once per notebook, on its first launch. That
# fixed cost is why distributed training pays off for long jobs, not for a few seconds of work. Compare the `Wall time` printed under the 4-rank cell, the whole job seen
# from this notebook, with the work the ranks did once they were up, timed inside them:

# %%
work_ms = max(r["work_s"] for r in ranks) * 1e3
print(f"the ranks' work (one all_reduce): {work_ms:.1f} ms on the slowest rank; the rest of the "
      "cell's wall time was starting and stopping the job")

# %% [markdown]
# Next: **01 · DDP**, where W ranks train one model together and end with identical weights.
