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
# # 08 · Tensor parallelism and recomputation
#
# Data parallelism and FSDP (notebooks 01 and 04) split the *batch*; pipeline parallelism
# (notebook 07) splits the model *between* layers. **Tensor parallelism** splits the model
# *inside* a layer: every weight matrix is cut into `t` pieces, each rank multiplies by its
# piece, and a collective puts the results together. It is how one layer that is too large,
# or too slow, for one GPU is spread over the GPUs of a node.
#
# **The Megatron MLP** (Shoeybi et al., *Megatron-LM*, 2019, section 3). A transformer's MLP is
# $Z = \mathrm{relu}(XA)\,B$. Cut $A$ by **columns** and $B$ by the matching **rows**:
#
# $$A = [A_1\ \ A_2], \qquad B = \begin{bmatrix} B_1 \\ B_2 \end{bmatrix}, \qquad
#   Z = \mathrm{relu}(XA_1)\,B_1 + \mathrm{relu}(XA_2)\,B_2 .$$
#
# Rank `r` holds $A_r$ and $B_r$ and computes $\mathrm{relu}(XA_r)B_r$ on its own: the ReLU is
# elementwise, so it applies to each column block separately. (Cutting $A$ by rows instead
# would need the sum *before* the ReLU: one more collective.) The last step adds the `t`
# partial outputs: **one all-reduce** in the forward. Megatron names the two places where
# ranks meet:
#
# * **`g`** after the block: all-reduce in the forward (sum the partial outputs), identity in
#   the backward (every rank's $Z_r$ receives the same $\partial L/\partial Z$);
# * **`f`** before the block: identity in the forward (every rank already has $X$), all-reduce
#   in the backward ($X$ fed `t` branches, so $\partial L/\partial X$ is the sum of theirs).
#
# So one all-reduce each way per block; a transformer layer has two such blocks (attention,
# with its heads split the same way, and the MLP): 2 forward + 2 backward per layer. Every
# rank stores $1/t$ of the block's weights, but the activations at the block's input and
# output, $X$ and $Z$, are whole on every rank: that is what sequence parallelism fixes, below.
# The all-reduces sit on the critical path and move activations every layer, so tensor
# parallelism stays inside a node (NVLink), and data parallelism or pipelines go across nodes.
#
# In `nn.Linear` the weight is stored transposed (`out_features x in_features`), so Megatron's
# column split of $A$ is a split of `fc1.weight`'s **rows** (dim 0), and the row split of $B$
# is a split of `fc2.weight`'s **columns** (dim 1). The second half of the notebook is
# **activation recomputation**: trading compute for the activation memory that no split removes.

# %%
import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle


def draw_megatron_mlp(t: int = 2) -> None:
    """X (whole on every rank) -> f -> X A_r -> relu -> (.) B_r -> partial Z_r -> g: sum -> Z."""
    fig, ax = plt.subplots(figsize=(10, 1.6 + 1.2 * t))
    boxes = [("X", 0.0, 1.2, 1.0), ("XA$_r$", 2.2, 0.8, 1.0), ("relu", 3.6, 0.8, 1.0),
             ("B$_r$", 5.0, 1.2, 0.8), ("Z$_r$", 6.6, 1.2, 1.0)]
    for r in range(t):
        y0 = (t - 1 - r) * 1.6
        for label, x, w, h in boxes:
            ax.add_patch(Rectangle((x, y0), w, h, fc=f"C{r}", alpha=0.35, ec="k"))
            ax.text(x + w / 2, y0 + h / 2, label.replace("$_r$", f"$_{r + 1}$"), ha="center", va="center")
        ax.text(-0.2, y0 + 0.5, f"rank {r}", ha="right", va="center")
        for x0, x1 in ((1.2, 2.2), (3.0, 3.6), (4.4, 5.0), (6.2, 6.6)):
            ax.annotate("", (x1, y0 + 0.5), (x0, y0 + 0.5), arrowprops=dict(arrowstyle="->"))
        ax.annotate("", (8.6, 0.8 * (t - 1) + 0.5), (7.8, y0 + 0.5), arrowprops=dict(arrowstyle="->"))
    ax.add_patch(Rectangle((8.6, 0.8 * (t - 1)), 1.2, 1.0, fc="0.8", ec="k"))
    ax.text(9.2, 0.8 * (t - 1) + 0.5, "Z = ΣZ$_r$", ha="center", va="center")
    ax.text(1.7, 1.6 * t - 0.35, "f: forward copy,\nbackward all-reduce", ha="center", fontsize=8)
    ax.text(8.2, 1.6 * t - 0.35, "g: forward all-reduce,\nbackward copy", ha="center", fontsize=8)
    ax.text(0.0, -0.45, "A$_r$: 2h/t columns of A (rows of fc1.weight)", fontsize=8)
    ax.text(5.0, -0.45, "B$_r$: the matching rows of B (columns of fc2.weight)", fontsize=8)
    ax.set_xlim(-1.2, 10.2), ax.set_ylim(-0.7, 1.6 * t + 0.2), ax.axis("off")
    plt.show()


draw_megatron_mlp(2)

# %% [markdown]
# ## One job for every distributed demo
# Every job pays its start (a rendezvous, process groups, and with the torchrun CLI every rank
# importing torch), so the four demos of this notebook
# run in **one job of 4 ranks** on a 2 × 2 `DeviceMesh`: `dp` × `tp`, rank = 2·dp + tp. The
# first three demos use only the `tp` dimension: ranks {0, 1} and {2, 3} are two tensor-parallel
# pairs doing the same work, as two data-parallel replicas would (both ranks of a pair must see
# the *same* batch: they split the layer, not the data). The fourth adds FSDP over `dp`.
#
# *Nothing in this job is timed:* this machine may have 2 cores, and 4 ranks on 2 cores wait
# for a core. `make bench` times tensor parallelism at W = 2, and at W = 4 where there are ≥ 4
# cores.
#
# Read the cell top to bottom; the sections after it show what each part returned.
#
# 1. **By hand**: the block's weights cut with slicing, the forward computed, one
#    `dist.all_reduce` over the TP pair (its process group, `mesh["tp"].get_group()`).
# 2. **PyTorch's API**: `parallelize_module` turns `fc1`/`fc2` into column/row-parallel layers
#    whose weights are **DTensors**; one forward and backward is compared with the unsplit
#    model, its collectives counted by `CollectiveRecorder` (`distlab.measure.comm`), a
#    `TorchDispatchMode` like PyTorch's `CommDebugMode` (`torch.distributed.tensor.debug`) that
#    also records each collective's size.
# 3. **Sequence parallelism**, measured by `distlab.lab.tensor_parallel.sequence_parallel_report`.
# 4. **2-D**: tensor parallel over `tp`, then `fully_shard` over `dp`.

# %%
# %load_ext distlab

# %%
# Predict before you run: type your guess in the box (or write it in place of guess=None).
from distlab.lab.predict import predict

collectives_guess = predict(
    "collectives each rank joins in one forward of a tensor-parallel MLP block (fc1 split by output "
    "features, fc2 by input features)",
    guess=None)

# %%
# %%torchrun -n 4 --result runs
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import distlab
from distlab.resmlp import Block, make_resmlp
from distlab.lab.tensor_parallel import param_bytes, seeded, sequence_parallel_report, step_report
from distlab.measure.comm import CollectiveRecorder

dev = distlab.init_distributed()
mesh = init_device_mesh(dev.type, (2, 2), mesh_dim_names=("dp", "tp"))
tp, t, r = mesh["tp"], mesh["tp"].size(), mesh["tp"].get_local_rank()
say = print if dist.get_rank() == 0 else (lambda *a, **k: None)
gen = torch.Generator().manual_seed(1)  # the same batch on both ranks of a TP pair
x, y = torch.randn(16, 64, generator=gen), torch.randint(0, 10, (16,), generator=gen)
result = {}

say("1/4 the Megatron MLP forward by hand ...", flush=True)
block = seeded(Block, 0, 64)  # 64 -> 128 -> 64, the same weights on every rank
c = block.fc1.out_features // t  # hidden features per rank
A, a = block.fc1.weight[r * c:(r + 1) * c], block.fc1.bias[r * c:(r + 1) * c]  # columns of A
B = block.fc2.weight[:, r * c:(r + 1) * c]  # the matching rows of B
with torch.no_grad(), CollectiveRecorder() as comm:
    partial = torch.relu(x @ A.T + a) @ B.T  # this rank's share of the MLP's output
    dist.all_reduce(partial, group=tp.get_group())  # g: sum the shares over the TP pair
    out = x + partial + block.fc2.bias  # the bias once, after the sum; then the residual
with torch.no_grad():
    unsplit = block(x)
result["by hand"] = {"max_diff": (out - unsplit).abs().max().item(), "collectives": comm.counts(),
                     "shard_bytes": A.nbytes + a.nbytes + B.nbytes,
                     "full_bytes": block.fc1.weight.nbytes + block.fc1.bias.nbytes + block.fc2.weight.nbytes}

say("2/4 parallelize_module, forward and backward against the unsplit model ...", flush=True)
shape = dict(in_features=64, hidden=64, depth=2, out_features=10)
ref, model = make_resmlp(0, **shape), make_resmlp(0, **shape)
for blk in model.blocks:
    parallelize_module(blk, tp, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
result["api"] = step_report(model, ref, x, y, t)
result["api"]["block_bytes"] = param_bytes(model.blocks[0])
result["api"]["params"] = {n: (f"{type(p).__name__}, placements {p.placements}, global {tuple(p.shape)}, "
                               f"local {tuple(p.to_local().shape)}") for n, p in model.blocks[0].named_parameters()}

say("3/4 sequence parallelism ...", flush=True)
result["sp"] = sequence_parallel_report(tp, batch=2, seq=16, hidden=64)

say("4/4 a 2-D mesh: tensor parallel over tp, FSDP over dp ...", flush=True)
ref, model = make_resmlp(0, **shape), make_resmlp(0, **shape)
for blk in model.blocks:
    parallelize_module(blk, tp, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    fully_shard(blk, mesh=mesh["dp"])
fully_shard(model, mesh=mesh["dp"])
dp = mesh["dp"].get_local_rank()  # each TP pair takes its half of the batch
result["2d"] = step_report(model, ref, x.chunk(2)[dp], y.chunk(2)[dp], t, x_ref=x, y_ref=y)
w = model.blocks[0].fc1.weight
result["2d"]["fc1.weight"] = f"placements {w.placements}, global {tuple(w.shape)}, local {tuple(w.to_local().shape)}"
result["2d"]["mesh"] = str(mesh)
distlab.shutdown()

# %% [markdown]
# ## 1. The Megatron MLP forward, by hand
# Each rank kept 64 of fc1's 128 output features (rows of `fc1.weight`, and their biases) and
# the matching 64 input features of fc2 (columns of `fc2.weight`), computed its partial output
# and joined one all-reduce. The sum is the unsplit block's output, up to float rounding (the
# two halves of each dot product are added in another order). `fc2`'s bias is added once,
# after the sum: every rank adding it before would add it `t` times.

# %%
for rank, run in enumerate(runs):
    h = run["by hand"]
    print(f"rank {rank}: max |by hand - unsplit| = {h['max_diff']:.1e}; collectives {h['collectives']}; "
          f"weights held {h['shard_bytes']:,} of {h['full_bytes']:,} B = {h['shard_bytes'] / h['full_bytes']:.3f} "
          f"(1/t = {1 / 2:.3f})")
assert all(run["by hand"]["max_diff"] < 1e-5 and run["by hand"]["collectives"] == {"all-reduce": 1} for run in runs)

# %%
collectives_guess.reveal(sum(runs[0]["by hand"]["collectives"].values()))

# %% [markdown]
# ### The attention block, its heads split
# Megatron splits attention the same way (Shoeybi et al. 2019, figure 3b): heads are independent, so
# rank `r` keeps the rows of `wq`, `wk`, `wv` that make *its* `n_heads / t` heads (column-parallel),
# attends on them alone, and multiplies by the matching columns of `wo` (row-parallel): a partial
# output, and again **one all-reduce** in the forward. On the tiny transformer of
# `distlab.transformer` (4 heads, 2 per rank; `distlab.lab.tensor_parallel.attention_heads_split`):

# %%
# %%torchrun -n 2 --result attn_runs
import torch.distributed as dist

import distlab
from distlab.lab.tensor_parallel import attention_tp_report

distlab.init_distributed()
result = attention_tp_report(dist.group.WORLD)
distlab.shutdown()

# %%
for rank, a in enumerate(attn_runs):
    print(f"rank {rank}: {a['heads_per_rank']} heads, max |split - unsplit| = {a['max_diff']:.1e}, collectives "
          f"{a['collectives']}, attention weights held {a['shard_bytes']:,} of {a['full_bytes']:,} B")
assert all(a["max_diff"] < 1e-5 and a["collectives"] == {"all-reduce": 1} for a in attn_runs)

# %% [markdown]
# That is the forward only. Training needs the backward too: `g`'s gradient passes straight
# through, and `f`'s all-reduces the gradient of the block's input. Written as
# `torch.autograd.Function`s they are **exercise 8** (end of this notebook); PyTorch's own
# version, next, does the same with DTensors.
#
# ## 2. PyTorch's API: DeviceMesh, DTensor, `parallelize_module`
# `init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))` lays the ranks out on a grid
# and makes a process group per row and column; `mesh["tp"]` is this rank's TP pair.
# `parallelize_module(block, mesh["tp"], {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})`
# replaces each parameter with a **DTensor**: a local tensor plus its *placement* on the mesh:
#
# * `Shard(d)`: each rank holds a slice along dim `d`;
# * `Replicate()`: each rank holds all of it;
# * `Partial()`: each rank holds a term of a sum not yet taken (the row-parallel output before
#   the all-reduce; here, sequence parallelism's layer-norm gradients below).

# %%
api = runs[0]["api"]
for name, desc in api["params"].items():
    print(f"blocks.0.{name:<10} {desc}")
local, full = api["block_bytes"]
print(f"\nblock parameters on a rank: {local:,} of {full:,} B = {local / full:.4f}: the weight matrices "
      f"exactly 1/2, fc2's bias (64 floats) on both")

# %% [markdown]
# One training step of the 2-block model (input layer and head whole on every rank), on each rank:

# %%
from distlab.lab.activation_memory import resmlp_saved_bytes

for rank, run in enumerate(runs):
    a = run["api"]
    print(f"rank {rank}: forward {a['forward']}, backward {a['backward']}; "
          f"|loss - unsplit| {a['loss_diff']:.1e}, max |grad - unsplit| {a['grad_diff']:.1e}")
    assert a["forward"] == a["backward"] == {"all-reduce": 2} and a["grad_diff"] < 1e-5
expected = resmlp_saved_bytes(16, in_features=64, hidden=64, depth=2, out_features=10, tp=2)
print(f"saved for backward on a rank: {api['saved_bytes']:,} B; activation term with t=2: {expected:,} B")

# %% [markdown]
# What `CommDebugMode` counts on gloo, honestly:
#
# * forward: **1 all-reduce per block** (`c10d_functional.all_reduce`, the row-parallel output:
#   `g`), and the gradients match the unsplit model's;
# * backward: **1 all-reduce per block** (the column-parallel input gradient: `f`), *if the
#   block's input requires grad*. Here the input layer before the blocks has parameters, so it
#   does. A lone block fed a plain tensor counts 0 in the backward: nothing needs that
#   gradient, and DTensor does not compute it.
# * no collective for the weight gradients: both ranks of a pair saw the same batch, so each
#   rank's gradient of its own shard is already complete (data parallelism, section 4, adds
#   the gradient collectives).
#
# The saved activations match the activation term of the memory calculator (below) with
# `t = 2`: each block keeps its *whole* input and *half* its hidden ReLU output.
#
# ## 3. Sequence parallelism
# Between the blocks, a transformer runs layer norm, dropout and the residual add on the whole
# activation, replicated on every TP rank: a `10 s b h` bytes term per layer that tensor
# parallelism does not divide (Korthikanti et al., 2022). **Sequence parallelism** shards those
# regions on the *sequence* dimension instead. The block's all-reduce becomes an **all-gather**
# of the sequence shards before the column-parallel linear and a **reduce-scatter** after the
# row-parallel one: a ring all-reduce *is* a reduce-scatter followed by an all-gather, so the
# bytes sent are the same. The plan for a layer norm followed by our block:
#
# ```python
# {"0": SequenceParallel(),                                   # the norm, on s/t positions
#  "1.fc1": ColwiseParallel(input_layouts=Shard(1)),          # all-gather the sequence first
#  "1.fc2": RowwiseParallel(output_layouts=Shard(1), use_local_output=False)}  # reduce-scatter
# ```
#
# Measured on the same batch (2 sequences of 16 positions, width 64), against the unsplit block:

# %%
sp = runs[0]["sp"]
print(f"{'':>18} {'forward':>32} {'backward':>32} {'sent/rank':>10} {'saved/rank':>11}")
for name, s in sp.items():
    print(f"{name:>18} {str(s['forward']):>32} {str(s['backward']):>32} "
          f"{s['forward_bytes'] + s['backward_bytes']:>8,.0f} B {s['saved_bytes']:>9,} B")
    assert s["out_diff"] < 1e-5 and s["input_grad_diff"] < 1e-5
tp_b, sp_b = (sp[k]["forward_bytes"] + sp[k]["backward_bytes"] for k in ("tensor parallel", "sequence parallel"))
print(f"bytes sent, sequence / tensor parallel: {sp_b / tp_b:.3f}; the norm's weight gradient under sequence "
      f"parallelism: {sp['sequence parallel']['norm_grad']}")
assert sp_b == tp_b

# %% [markdown]
# The bytes are those of the counted collectives' tensors, on a ring: an all-reduce of `N`
# bytes sends `2(t-1)/t · N` per rank, an all-gather or a reduce-scatter `(t-1)/t · N` each.
# Equal, as promised, and each rank now keeps the norm's input for `s/t` positions only (the
# saved bytes fall by that much; the gathered input of `fc1` is still whole). One thing the
# counts do not show: the norm's weight gradient comes out **`Partial`** — each rank's
# positions give a term of it — and stays so until an op needs it whole: `full_tensor()`, or
# the optimizer's update of the replicated weight, where DTensor all-reduces it (tried
# separately: an SGD step on this block issues 2 all-reduces, the norm's weight and bias, and
# the updated weights match the unsplit block's). Megatron-LM all-reduces these gradients
# explicitly after the backward.
#
# ## 4. Two dimensions: FSDP × tensor parallelism
# The standard recipe for large models (torchtitan applies tensor parallelism, then
# activation checkpointing, then `fully_shard`): tensor parallelism inside a node, FSDP
# across. The TP shards are sharded again over `dp`, so each of the 4 ranks stores 1/4 of a block:

# %%
d2 = runs[0]["2d"]
print(f"{d2['mesh']}\nblocks.0.fc1.weight: {d2['fc1.weight']}")
for rank, run in enumerate(runs):
    print(f"rank {rank}: forward {run['2d']['forward']}\n        backward {run['2d']['backward']}; "
          f"max |grad - unsplit on the whole batch| {run['2d']['grad_diff']:.1e}")
assert all(run["2d"]["grad_diff"] < 1e-5 for run in runs)

# %% [markdown]
# `_StridedShard(dim=0, sf=2)` is FSDP's `Shard(0)` over `dp` applied to a tensor already
# sharded on dim 0 over `tp`: each rank's rows are a strided pick of the global ones. Per
# step: FSDP's all-gathers (the input layer and head's unit and each block before the forward,
# each block again before the backward) and reduce-scatters (each unit's gradients, averaged
# over `dp`), and tensor parallelism's 2 all-reduces per block, now within each TP pair. The
# gradients equal the unsplit model's on the whole batch of 16 rows, which the two pairs split.
#
# ## Activation recomputation
# Everything the forward computes and the backward reads stays in memory until the backward
# reaches it. **Recomputation** (activation checkpointing: Chen et al., 2016, *Training Deep
# Nets with Sublinear Memory Cost*) keeps only some layers' inputs and runs the forward of the
# rest again during the backward:
#
# * **every block** checkpointed: the forward keeps each block's input only (here a third of
#   what a block saves), still O(L) in the depth L;
# * **every √L blocks**: the forward keeps L/√L = √L segment inputs, and the backward
#   recomputes one segment of √L blocks at a time: O(√L);
# * the price: one more forward per step, ≈ 4/3 of the step if a backward costs two forwards.
#
# `distlab.lab.recompute` wraps the blocks of our residual MLP (width 256, batch 64) in
# `torch.utils.checkpoint.checkpoint(segment, x, use_reentrant=False)` and measures, per depth
# and policy: the bytes saved for backward at the end of the forward
# (`distlab.measure.memory.saved_tensor_bytes`), the peak of the storage a step makes beyond the
# parameters and their gradients (recomputed activations included), the step time, and that
# the gradients are bit-for-bit the plain model's. It runs on one thread (a second thread on
# a shared 2-core machine mostly waits); the first checkpoint call also imports
# `torch._dynamo`, about 2 s.

# %%
import time

from distlab.lab.activation_memory import resmlp_peak_bytes
from distlab.lab.recompute import POLICIES, step_time_ratios, sweep

start = time.perf_counter()
rows = sweep((4, 8, 16), measure=("saved", "peak", "grads"), progress=lambda s: print(s, flush=True))
rows += sweep((32, 64), measure=("saved",), progress=lambda s: print(s, "(saved bytes only)", flush=True))
print("step times: 3 rounds of the three policies at depths 4, 8, 16 ...", flush=True)
slower = {d: step_time_ratios(d, rounds=3, min_run_time=0.02) for d in (4, 8, 16)}
print(f"measured in {time.perf_counter() - start:.1f} s")
assert all(r["grads_equal"] for r in rows if "grads_equal" in r)
by = {p: [r for r in rows if r["policy"] == p] for p in POLICIES}

fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(13, 3.6))
for i, p in enumerate(POLICIES):
    ax1.plot([r["depth"] for r in by[p]], [r["saved_bytes"] / 2**20 for r in by[p]], "o-", color=f"C{i}", label=p)
    peaked = [r for r in by[p] if "peak_bytes" in r]
    ax2.plot([r["depth"] for r in peaked], [r["peak_bytes"] / 2**20 for r in peaked], "o-", color=f"C{i}", label=p)
    ax2.plot([r["depth"] for r in peaked], [resmlp_peak_bytes(64, in_features=64, hidden=256, depth=r["depth"],
                                                              out_features=10, every=r["every"]) / 2**20
                                             for r in peaked], ":", color=f"C{i}")
    ax3.plot(list(slower), [slower[d][p] if p != "none" else 1.0 for d in slower], "o-", color=f"C{i}", label=p)
ax1.set_title("saved for backward (end of forward)", fontsize=10)
ax2.set_title("peak during the step (dotted: estimate)", fontsize=10)
ax3.set_title("step time / without recomputation", fontsize=10)
ax3.plot(list(slower), [1 + slower[d]["forward share"] for d in slower], "k--", lw=0.8, label="1 + F/(F+B)")
for ax in (ax1, ax2):
    ax.set_xscale("log", base=2), ax.set_yscale("log", base=2), ax.set_xlabel("depth L"), ax.set_ylabel("MiB")
ax3.set_xlabel("depth L"), ax3.set_ylim(0.8, 2.2)
ax1.legend(fontsize=8), ax3.legend(fontsize=8)
fig.tight_layout()
plt.show()
s16 = {r["policy"]: r for r in rows if r["depth"] == 16}
less = {p: 1 - s16[p]["saved_bytes"] / s16["none"]["saved_bytes"] for p in POLICIES}
print(f"depth 16: every block keeps {less['every block']:.0%} less for backward, every √L blocks "
      f"{less['every √L blocks']:.0%} less; step time x{slower[16]['every block']:.2f} and "
      f"x{slower[16]['every √L blocks']:.2f}, one more forward would be x{1 + slower[16]['forward share']:.2f}")
s64 = {r["policy"]: r["saved_bytes"] for r in rows if r["depth"] == 64}
print(f"depth 16 -> 64 (4x deeper): none x{s64['none'] / s16['none']['saved_bytes']:.2f}, "
      f"every block x{s64['every block'] / s16['every block']['saved_bytes']:.2f}, "
      f"every √L blocks x{s64['every √L blocks'] / s16['every √L blocks']['saved_bytes']:.2f} "
      f"(the segment inputs x√4 = x2; the batch, the head's input and the loss's do not grow)")

# %% [markdown]
# On the log-log axes the slope is the exponent: without recomputation and with every block
# checkpointed the lines have slope 1 (O(L), with a third of the bytes), with √L segments
# slope ½. The peak adds what the backward recomputes (one segment of √L blocks) and the
# step's temporaries (a weight gradient before it is added to `.grad`): at depths 4 and 8 the
# √L schedule peaks no lower than checkpointing every block, from depth 16 on it is lower. The
# dotted estimate is `distlab.lab.activation_memory.resmlp_peak_bytes`.
#
# The step time goes up by about one forward: the dashed line is `1 + F/(F+B)` with the
# plain model's forward `F` and step `F+B` measured, about 4/3 (a backward costs two
# forwards). Each point is the median of 3 rounds that time the three policies in turn, as
# this machine's cores may be shared; still, short runs, so expect ±0.2 from run to run
# (`make bench` measures longer, on a larger batch). What sits above the line is each
# checkpoint call's own work (it saves and restores the RNG state, installs its hooks), large
# next to a block this small. Korthikanti
# et al. (2022) cut the price further with **selective** recomputation: recompute only the core
# attention (`Q Kᵀ`, softmax, dropout and the product with `V`), whose activations take much memory
# and little compute
# (`torch.utils.checkpoint.create_selective_checkpoint_contexts` with a `CheckpointPolicy`).
#
# ## The memory calculator's activation term
# Notebook 04's calculator (`distlab.lab.training_memory`) counts parameters, gradients, master
# weights and optimizer state; `distlab.lab.activation_memory` models the activations it adds, per
# layer and micro-batch. For our residual
# MLP a block keeps its input and its ReLU output (`fc2` reads the same storage): `4 b (h + 2h/t)`
# bytes in float32, `4 b h` when recomputed (the segment's input only). Against every run above:

# %%
from distlab.lab.activation_memory import resmlp_saved_bytes

worst = 0.0
print(f"{'depth':>5} {'policy':>16} {'measured':>12} {'term':>12} {'error':>7}")
for r in rows:
    term = resmlp_saved_bytes(64, in_features=64, hidden=256, depth=r["depth"], out_features=10, every=r["every"])
    worst = max(worst, abs(term - r["saved_bytes"]) / r["saved_bytes"])
    print(f"{r['depth']:>5} {r['policy']:>16} {r['saved_bytes']:>10,} B {term:>10,} B "
          f"{term / r['saved_bytes'] - 1:>+7.2%}")
print(f"largest error {worst:.2%}; with tensor parallelism (t=2, section 2): measured {api['saved_bytes']:,} B, "
      f"term {expected:,} B")
assert worst <= 0.05

# %% [markdown]
# For a transformer layer the same bookkeeping gives Korthikanti et al.'s Table 2, for GPT's
# layer: a `4h` GeLU MLP, dropout, the attention scores stored (16-bit activations, `s` sequence
# length, `b` micro-batch, `h` width, `a` heads, `t` TP degree):
#
# | | bytes per layer |
# |---|---|
# | no parallelism | `s b h (34 + 5 a s / h)` |
# | tensor parallel | `s b h (10 + 24/t + 5 a s / (h t))` |
# | + sequence parallel | `s b h (34/t + 5 a s / (h t))` |
# | + selective recomputation | the `5 a s / (h t)` term (attention scores) goes |
# | full recomputation | `2 s b h` (the layer input; `/t` with sequence parallelism) |
#
# The `5 a s / h` term is the attention scores (softmax, its dropout mask and output), which
# grows with the *square* of the sequence; FlashAttention never stores them, recomputing them
# inside its kernel: selective recomputation, fused.
#
# **A Llama layer is not GPT's.** RMSNorm, no dropout, grouped-query attention (`k` and `v` of
# `h_kv ≤ h` columns) in a fused kernel that keeps no scores, and a SwiGLU MLP of width `f`
# (`w2(silu(w1 x) * w3 x)`; `f = 11008` for Llama 2 7B, `14336` for Llama 3 8B). Counted storage by
# storage (`distlab.lab.llama_layer`: each norm keeps its input and output in fp32 and an fp32
# `rstd`; the projections' three inputs; `q`, `k`, `v` and the log-sum-exp; four `s b f` tensors of the
# SwiGLU), eager PyTorch keeps
#
# $$ s\,b\,\bigl(16h + 8 + 2\,(4h + 2h_{kv} + 4f) + 4a\bigr) \text{ bytes a layer, in 16-bit.} $$
#
# Checked here against what autograd saves in a tiny Llama layer, then priced at real shapes beside
# Korthikanti's GPT layer:

# %%
from distlab.lab.activation_memory import transformer_layer_bytes
from distlab.lab.llama_layer import llama_layer_bytes, measured_layer_bytes

for shape in ((64, 2, 64, 4, 4, 176), (64, 2, 64, 4, 1, 176)):  # seq, batch, h, heads, kv heads, f
    measured, formula = measured_layer_bytes(*shape), llama_layer_bytes(*shape)
    print(f"tiny Llama layer {shape}: measured {measured:,} B, formula {formula:,} B")
    assert measured == formula
GiB = 2**30
for name, (h, a, kv, f) in {"Llama 2 7B": (4096, 32, 32, 11008), "Llama 3 8B": (4096, 32, 8, 14336)}.items():
    s = 8192
    print(f"{name}, s = {s}, b = 1: Llama layer {llama_layer_bytes(s, 1, h, a, kv, f) / GiB:.2f} GiB; "
          f"Korthikanti's GPT layer of that width {transformer_layer_bytes(s, 1, h, a) / GiB:.2f} GiB with the "
          f"scores, {transformer_layer_bytes(s, 1, h, a, recompute='selective') / GiB:.2f} GiB without")

# %% [markdown]
# Without the scores, a Llama layer keeps *more* than Korthikanti's `34 s b h`: the SwiGLU's four `f`-wide
# tensors (`f ≈ 2.7h` to `3.5h`) and the norms' fp32 copies outweigh what grouped-query attention and the
# missing dropout save. A fused RMSNorm kernel, which keeps only its 16-bit input and the fp32 `rstd`
# (`2h + 4` bytes), saves most of the norms' share. Against GPT's layer *with* the scores, at `s = 8192`, both are small: the scores are what FlashAttention
# removed.
#
# ## Explore
# Memory per rank and communication per step for a transformer split `t` ways (bf16 mixed
# precision with Adam, 2 + 2 + 4 + 8 = 16 bytes a parameter; one micro-batch of activations):
# pure arithmetic, `distlab.lab.activation_memory.per_rank` on `distlab.lab.training_memory`.
# The presets are shapes only: each layer is Korthikanti's GPT layer at that width, so "Llama-2
# 7B" overstates its SwiGLU MLP with flash attention, which stores no scores.
# Full recomputation (Megatron's) runs the forward twice, so its all-reduces too: 6 collectives
# per layer instead of 4. torchtitan's selective policy saves every second `mm` and the
# reduce-scatters, but not the all-gathers or the all-reduces; counted with `CollectiveRecorder`
# on a Llama-style layer (torch 2.13, `tests/distlab/test_recompute_collectives.py`), its recomputation
# re-issues both all-gathers with sequence parallelism (their outputs are the inputs the saved
# matmuls need for their weight gradients) and attention's all-reduce without it (its output
# feeds the MLP's norm): 6 + 4 and 5 collectives per layer. The line printed under the widget is
# the same function at its starting values.

# %%
import ipywidgets as widgets
from IPython.display import display

from distlab.lab.activation_memory import PRESETS, RECOMPUTE, per_rank


def describe(preset: str, seq: int, tp: int, sp: bool, recompute: str) -> str:
    m = per_rank(preset, seq=seq, tp=tp, sp=sp, recompute=recompute)
    return (f"GPT layer at {preset}'s shape, s={seq}, b=1, t={tp}{' + SP' if sp else ''}, recompute {recompute}: "
            f"weight state {m['weight state'] / 1e9:.1f} GB + activations {m['activations'] / 1e9:.2f} GB "
            f"({m['per layer'] / 1e6:.0f} MB a layer) = {m['total'] / 1e9:.1f} GB per rank; "
            f"{m['collectives per step']} collectives, {m['comm per step'] / 1e9:.2f} GB sent per rank per step")


print(describe("Llama-2 7B", 4096, 4, False, "none"))
out = widgets.Output()


def on_change(preset, seq, tp, sp, recompute):
    with out:
        out.clear_output()
        print(describe(preset, seq, tp, sp, recompute))


display(widgets.interactive(
    on_change,
    preset=widgets.Dropdown(options=list(PRESETS), value="Llama-2 7B", description="model"),
    seq=widgets.SelectionSlider(options=[2**k for k in range(9, 16)], value=4096, description="sequence"),
    tp=widgets.SelectionSlider(options=[1, 2, 4, 8], value=4, description="TP degree t"),
    sp=widgets.Checkbox(value=False, description="sequence parallel"),
    recompute=widgets.Dropdown(options=list(RECOMPUTE), value="none", description="recompute"),
), out)

# %% [markdown]
# ## Old names for the same things
#
# | legacy / elsewhere | PyTorch today |
# |---|---|
# | Megatron-LM's `mpu` (`megatron/mpu`, now `megatron.core.tensor_parallel`): `ColumnParallelLinear`, `RowParallelLinear`, `copy_to_tensor_model_parallel_region` (`f`), `reduce_from_tensor_model_parallel_region` (`g`) | `ColwiseParallel`, `RowwiseParallel` with `parallelize_module` |
# | Megatron-LM's sequence-parallel mappings (`gather_from_sequence_parallel_region`, `reduce_scatter_to_sequence_parallel_region`) | `SequenceParallel`, `input_layouts=Shard(1)` / `output_layouts=Shard(1)` |
# | fairscale's `fairscale.nn.model_parallel` (`initialize_model_parallel`, `layers.ColumnParallelLinear`, `RowParallelLinear`) | `init_device_mesh` + DTensor |
# | `torch.distributed._tensor` (the DTensor module before PyTorch 2.5) | `torch.distributed.tensor` |
# | `torch.utils.checkpoint.checkpoint(fn, x)`: without `use_reentrant` it still runs the **reentrant** variant in torch 2.13 (and warns); no `torch.autograd.grad`, no gradients when no input requires grad | `checkpoint(fn, x, use_reentrant=False)` |
# | `checkpoint_wrapper(module, CheckpointImpl.REENTRANT)` with `apply_activation_checkpointing` (`torch.distributed.algorithms._checkpoint`, FSDP1-era code) | `checkpoint_wrapper(module)` (default `CheckpointImpl.NO_REENTRANT`; torchtitan wraps each block with it), or `checkpoint(..., use_reentrant=False)` in the forward |
#
# ## Exercise 8: a tensor-parallel MLP by hand
# In `exercises/ex08_tensor_parallel.py` you write Megatron's two operators yourself as
# `torch.autograd.Function`s — `CopyToParallelRegion` (`f`: identity forward, all-reduce
# backward) and `ReduceFromParallelRegion` (`g`: all-reduce forward, identity backward) — and
# with them `ColumnParallelLinear` and `RowParallelLinear`, the two halves of the block this
# notebook split by hand (forward only) and with DTensors (forward and backward).
#
# *Why by hand, when `parallelize_module` does it?* The API hides exactly the two lines that
# make tensor parallelism correct: which collective runs in which direction. Writing them shows
# why the forward of `f` must not communicate, why a missing all-reduce in the backward raises
# no error (the layers before the block get a wrong gradient, a different one on each rank, and
# their copies drift apart), and where the bias goes.
#
# The exercise file does not dictate the lines: its contract states the invariants, what each rank
# holds (which rows or columns, of which shape, in storage of its own) and what crosses the wire (which
# collective, in which direction, of how many bytes), and any code that keeps them scores full marks.
# The grader runs your layers on 2 and on 4 ranks, compares them with the unsplit block and counts the
# collectives. Run the next cell (it grades the stub until you fill it in).

# %%
from autograder import check

check(8, raise_on_fail=False)
