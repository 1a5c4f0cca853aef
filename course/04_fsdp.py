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
# # 04 · Fully Sharded Data Parallel: shard the memory, not just the batch
#
# DDP keeps a **full copy** of everything on every rank: the parameters, their gradients and
# the optimizer state. With fp32 weights and Adam that is 4 + 4 + 8 = **16 bytes per parameter**,
# so a 7-billion-parameter model needs 112 GB before a single activation: more than an 80 GB A100 or H100 holds.
#
# ZeRO (Rajbhandari et al., *ZeRO: Memory Optimizations Toward Training Trillion Parameter
# Models*, SC 2020) removes the redundancy in three stages, and PyTorch FSDP (Zhao et al.,
# *PyTorch FSDP*, VLDB 2023) implements the last one:
#
# | level | what each of the W ranks keeps 1/W of | ZeRO stage |
# |---|---|---|
# | none | nothing (this is DDP) | 0 |
# | optimizer | optimizer state (with mixed precision, the fp32 master weights too) | 1 |
# | +gradients | optimizer state and gradients | 2 |
# | full | optimizer state, gradients **and parameters** | 3 = FSDP |
#
# With full sharding a rank cannot run a layer it holds only 1/W of, so FSDP gathers just in time:
#
# 1. **before forward** of a unit (a block): **all-gather** its parameter shards into full tensors;
# 2. run forward, then **free** the gathered copy (`reshard_after_forward=True`);
# 3. **before backward** of the unit: all-gather again;
# 4. after backward: **reduce-scatter** the full gradients, so each rank keeps the *averaged*
#    gradient of its own shard only, and free the full ones;
# 5. the optimizer steps on shards: each rank updates its 1/W of the model.
#
# Communication per step is one all-gather forward, one backward and one reduce-scatter: about
# 1.5x DDP's all-reduce (which *is* a reduce-scatter plus an all-gather), in exchange for memory.
# The unit of sharding matters: if the whole model is one unit, step 1 gathers the whole model and
# the peak is back to unsharded. Shard **per block**, and only one block (plus the next, prefetched)
# is ever whole.

# %% [markdown]
# ## The memory calculator
#
# `distlab.lab.training_memory.training_memory` is the arithmetic of the table above, the same
# function notebooks 00, 03 and 08 call. The widget below calls it; the line printed under it
# comes from the same function at the overview's example (7B parameters, fp32, Adam, 8 GPUs), so
# the figure is computed, not typed.

# %%
import ipywidgets as widgets
from IPython.display import display

from distlab.lab.training_memory import LEVELS, OPTIMIZER_STATES, PRECISIONS, training_memory


def describe(billions: float, dtype: str, optimizer: str, world: int, level: str) -> str:
    unsharded = training_memory(billions * 1e9, precision=dtype, optimizer=optimizer)["total"]
    m = training_memory(billions * 1e9, precision=dtype, optimizer=optimizer, world=world, level=level)
    parts = ", ".join(f"{k} {v / 1e9:.1f} GB" for k, v in m.items() if k != "total" and v)
    return (f"{billions:g}B params, {dtype}, {optimizer}: {unsharded / 1e9:.0f} GB unsharded; "
            f"sharding '{level}' on {world} GPUs -> {m['total'] / 1e9:.1f} GB per GPU ({parts})")


print(describe(7, "fp32", "adam", 8, "full"))
out = widgets.Output()


def on_change(billions, dtype, optimizer, world, level):
    with out:
        out.clear_output()
        print(describe(billions, dtype, optimizer, world, level))


ui = widgets.interactive(
    on_change,
    billions=widgets.FloatLogSlider(value=7, base=10, min=-1, max=3, step=0.05, description="params (B)"),
    dtype=widgets.Dropdown(options=list(PRECISIONS), value="fp32"),
    optimizer=widgets.Dropdown(options=list(OPTIMIZER_STATES), value="adam"),
    world=widgets.IntSlider(value=8, min=1, max=64, description="GPUs"),
    level=widgets.Dropdown(options=list(LEVELS), value="full", description="sharding"),
)
display(ui, out)

# %% [markdown]
# The calculator leaves out activations (they scale with batch and sequence length, and are
# what activation checkpointing trades for recompute) and the temporary full copy of the unit
# being computed. Mixed precision changes the mix, not the total: bf16 params and grads with an
# fp32 master copy and Adam's two fp32 moments are 2 + 2 + 4 + 4 + 4 = 16 bytes per parameter too
# (ZeRO's 2Ψ + 2Ψ + KΨ, K = 12; set the dtype to bf16 above):

# %%
print(describe(7, "bf16", "adam", 8, "full"))

# %% [markdown]
# ### Stage by stage
#
# The same calculator, one line per ZeRO stage (7B parameters, bf16 with Adam, 8 GPUs). Stage 1
# (`optimizer`) already removes most of the redundancy, because Adam's moments and the fp32 master
# copy are 12 of the 16 bytes per parameter; it does so without changing the forward or the
# backward at all: every rank still holds the whole model and computes whole gradients.

# %%
for level in LEVELS:
    print(f"{level:>10}: {training_memory(7e9, precision='bf16', world=8, level=level)['total'] / 1e9:6.1f} GB per GPU")

# %% [markdown]
# ## FSDP2: `fully_shard`, and what it does to a tensor
#
# `torch.distributed.fsdp.fully_shard(module)` turns every parameter of `module` that is not
# already in a sub-unit into a **DTensor** with placement `Shard(0)`: rank r keeps rows
# `[r*c, (r+1)*c)` with `c = ceil(rows / W)`. Every rank *stores* `c` rows, so the last shards
# are padded: the all-gather then moves equal-sized pieces. The Adam moments are made with
# `zeros_like` of the real rows, so they are not padded.
#
# Below two ranks shard our 8-block residual MLP (`distlab.resmlp`; its widths are made odd on
# purpose, so shards need padding) per block and then the root, take two Adam steps, and report what they hold.
# The same cell also wraps only the root, to see the peak that per-block sharding avoids. The peak
# on the CPU is measured by `LiveStorageTracker`, which follows every tensor storage an op touches
# until it is freed (the CPU has no `max_memory_allocated`; on a GPU use that instead).

# %%
# %load_ext distlab

# %%
# Predict before you run: type your guess in the box (or write it in place of guess=None).
from distlab.lab.predict import predict

shard_guess = predict(
    "share of the unsharded weights + gradients + Adam state that each of 2 FSDP ranks holds",
    fmt=".3f", guess=None)

# %%
# %%torchrun -n 2 --result fsdp_runs
import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

import distlab
from distlab.data import synthetic_classification
from distlab.lab.fsdp_memory import LiveStorageTracker, expected_bytes, full_shapes, measured_bytes
from distlab.resmlp import make_resmlp

dev = distlab.init_distributed()  # this rank's device: the CPU under gloo, its GPU under NCCL
rank, world = dist.get_rank(), dist.get_world_size()
x_all, y_all = synthetic_classification(64, 64, 10).tensors
x, y = x_all[rank * 8:(rank + 1) * 8].to(dev), y_all[rank * 8:(rank + 1) * 8].to(dev)
result = {}
for how in ("per block", "root only"):
    model = make_resmlp(seed=0, hidden=91).to(dev)  # odd widths: the second shard is padded
    shapes = full_shapes(model)
    if how == "per block":
        for block in model.blocks:
            fully_shard(block)
    fully_shard(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)  # after sharding: it must see the DTensors
    for step in range(2):
        with LiveStorageTracker() as mem:
            mem.track(*model.parameters(), *(s for st in opt.state.values() for s in st.values()))
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    w = model.blocks[0].fc1.weight
    if rank == 0 and how == "per block":
        print(f"blocks.0.fc1.weight: {type(w).__name__}, placements {w.placements}, global "
              f"{tuple(w.shape)}, local {tuple(w.to_local().shape)}")
    result[how] = {"measured": measured_bytes(model, opt), "expected": expected_bytes(shapes, world, rank),
                   "peak": mem.peak, "n_params": sum(torch.Size(s).numel() for s in shapes.values())}
distlab.shutdown()

# %%
import matplotlib.pyplot as plt

n_params = fsdp_runs[0]["per block"]["n_params"]
calc = training_memory(n_params, world=2, level="full")  # fp32, Adam, as the run above
unsharded = training_memory(n_params)["total"]
print(f"{n_params:,} parameters -> {unsharded:,.0f} B unsharded; calculator at W=2: {calc['total']:,.0f} B per rank")
for r, res in enumerate(fsdp_runs):
    m, e = res["per block"]["measured"], res["per block"]["expected"]
    print(f"rank {r}: measured {sum(m.values()):,} B (params {m['params']:,}, grads {m['grads']:,}, "
          f"Adam {m['optimizer']:,}); exact expected incl. {e['padding']:,} B padding: "
          f"{e['params'] + e['grads'] + e['optimizer']:,} B")
    assert sum(m.values()) == e["params"] + e["grads"] + e["optimizer"], "measured bytes differ from the accounting"

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.5))
parts = ["params", "grads", "optimizer"]
for i, r in enumerate(range(len(fsdp_runs))):
    ax1.bar([p_ + f"\nrank {r}" for p_ in parts], [fsdp_runs[r]["per block"]["measured"][p_] / 1e6 for p_ in parts],
            color=f"C{i}", label=f"rank {r} measured")
ax1.scatter([p_ + f"\nrank {r}" for r in range(len(fsdp_runs)) for p_ in parts],
            [calc[p_] / 1e6 for r in range(len(fsdp_runs)) for p_ in parts], color="k", marker="_", s=400,
            label="calculator (1/W)", zorder=3)
ax1.set_ylabel("MB on the rank"); ax1.set_title("what each of 2 ranks holds"); ax1.legend(fontsize=8)
ax1.tick_params(axis="x", labelsize=7)
hows = ["per block", "root only"]
ax2.bar(hows, [max(r_[h]["peak"] for r_ in fsdp_runs) / 1e6 for h in hows], color=["C2", "C3"])
ax2.axhline(unsharded / 1e6, color="k", ls="--", label="unsharded params+grads+Adam")
ax2.set_ylabel("peak live MB during a step"); ax2.set_title("where you shard matters"); ax2.legend(fontsize=8)
plt.tight_layout(); plt.show()

# %%
shard_guess.reveal(sum(fsdp_runs[0]["per block"]["measured"].values()) / unsharded)

# %% [markdown]
# The measured bytes match the exact accounting to the byte, and the calculator's 1/W to within
# the padding and Adam's 4-byte `step` counters (a few hundred bytes here; with real layer widths, which are multiples of 8 or 128,
# padding all but vanishes). Wrapping only the root shards the *storage* just as well, but the
# peak during a step is far higher: forward gathers every parameter at once. On a CPU the
# numbers are bytes of live tensor storage, which is what the allocator must find; timings on a
# CPU say nothing about GPU communication, so this notebook measures memory only.
#
# ## Mixed precision under FSDP2: who holds what, in which dtype
#
# `fully_shard(module, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))`
# is how mixed precision is written with FSDP2 (notebook 03's `torch.autocast` is for replicated models).
# Each rank keeps its **shard in fp32**: that shard is the master copy the optimizer updates. Before a
# unit's forward (and again before its backward) the shards are all-gathered **cast to bf16**: the unsharded
# bf16 weights live only while the unit computes. The gradients are reduce-scattered in `reduce_dtype`
# and cast back to the shard's dtype. Zhao et al. (2023, *PyTorch FSDP*, section 4.4) describe the design.
#
# Below, two ranks take one step under three policies: no casting, bf16 parameters with an fp32
# reduction, and both in bf16. Each reports what a weight is inside its forward and after it, what its
# gradient is, the bytes the step gathered and reduce-scattered (the one recorder), and
# `clip_grad_norm_`'s total norm over the sharded gradients, beside one process's norm on the same
# 16 samples. Last, the ranks play two **pipeline stages**: each holds the gradients of half the
# layers and clips by the norm of what it holds.

# %%
# %%torchrun -n 2 --result mp_runs
from distlab.lab.fsdp_mixed_precision import mixed_precision_rank

result = mixed_precision_rank()

# %%
ref = mp_runs[0]["reference_norm"]
print(f"{'policy':26}{'weight in forward':>20}{'after forward':>16}{'gradient':>16}{'gathered':>11}"
      f"{'reduced':>10}{'grad norm':>11}")
for name, p in mp_runs[0]["policies"].items():
    print(f"{name:26}{p['in_forward']:>20}{p['after_forward']:>16}{p['grad']:>16}"
          f"{p['all_gather_bytes'] / 1e3:>8.0f} kB{p['reduce_scatter_bytes'] / 1e3:>7.0f} kB{p['norm']:>11.5f}")
print(f"{'one process, fp32':26}{'':>73}{ref:>11.5f}")
stages = [r["stages"] for r in mp_runs]
print("as two pipeline stages: each stage's own norm", ", ".join(f"{s['stage_norm']:.4f}" for s in stages),
      f"-> the model's norm from the summed squares: {stages[0]['combined_norm']:.5f}")

fig, ax = plt.subplots(figsize=(7, 2.8))
names = list(mp_runs[0]["policies"])
for i, (key, label) in enumerate((("all_gather_bytes", "all-gathered"), ("reduce_scatter_bytes", "reduce-scattered"))):
    ax.barh([n + " " * i for n in names], [mp_runs[0]["policies"][n][key] / 1e3 for n in names], color=f"C{i}",
            label=label)
ax.set_xlabel("kB per rank in one step"); ax.legend(fontsize=8); ax.invert_yaxis()
plt.tight_layout(); plt.show()

# %% [markdown]
# What the table says:
#
# * **The fp32 shard is the master.** After the forward every weight is its fp32 shard again; the bf16
#   copy existed only inside the unit's forward (and backward). Per parameter a rank keeps 4 bytes of
#   shard, 4 of gradient and 8 of Adam, over W: notebook 00's 16 bytes, sharded, plus the transient
#   bf16 copy of the one or two units being computed.
# * **`param_dtype` halves the gathers; `reduce_dtype` the reduce-scatters.** A bf16 reduction sums W
#   numbers with 8 bits of mantissa each, and the error grows with W, so the usual choice (torchtitan's
#   default) reduces in fp32. Megatron-LM goes further: its bf16 parameters keep an fp32 `main_grad` in
#   which micro-batches accumulate and the reduction runs, beside the fp32 master and Adam's two moments:
#   2 + 4 + 4 + 8 = **18 bytes per parameter** before its distributed optimizer shards the last 12.
# * **`clip_grad_norm_` works on DTensor gradients**: each rank sums the squares of its shards and the
#   sum is all-reduced, so the total norm is one process's (exactly in fp32; bf16's rounding moves it a
#   little). Clip *before* `optimizer.step()`, on every rank.
# * **Pipeline stages must combine their norms.** A stage holds only its layers' gradients, and
#   `clip_grad_norm_` over them gives that stage's norm, not the model's: clipped each by its own, the
#   stages scale their gradients differently and the update changes direction. The model's norm is the
#   square root of the stages' summed squares, one all-reduce over the pipeline's group (torchtitan's
#   `clip_grad_norm_` takes its `pp` mesh for this).
#
# **fp8.** On H100-class GPUs the matrix products can run in 8-bit floats (Micikevicius et al. 2022, *FP8
# Formats for Deep Learning*: E4M3 for weights and activations, E5M2 for gradients), each tensor with a
# scale. torchao's `convert_to_float8_training(model)` swaps `nn.Linear` for `Float8Linear` (matmuls in
# fp8, weights still kept in higher precision), and `Float8LinearConfig(enable_fsdp_float8_all_gather=True)`
# makes FSDP2 all-gather the weights in fp8, halving the bf16 gathers again; torchtitan's Llama 3 recipes
# use both. DeepSeek-V3 (2024) trained in fp8 with finer, block-wise scales. A CPU has no fp8 matmul,
# so this course does not run it.
#
# ## Old names for the same things
#
# Older tutorials and code use **FSDP1**, the `FullyShardedDataParallel` wrapper. It flattens
# each unit's parameters into one `FlatParameter`; FSDP2 keeps the parameters as DTensors, which
# is why the optimizer and the state dict see ordinary per-parameter tensors.
#
# | FSDP1 (legacy) | FSDP2 / current |
# |---|---|
# | `FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Block}))` | `fully_shard(block)` for each block, then `fully_shard(model)` |
# | `sharding_strategy=ShardingStrategy.FULL_SHARD` | `fully_shard(..., reshard_after_forward=True)` (default) |
# | `ShardingStrategy.SHARD_GRAD_OP` (ZeRO-2) | `reshard_after_forward=False` |
# | `ShardingStrategy.NO_SHARD` | DDP |
# | `FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, FullStateDictConfig(offload_to_cpu=True, rank0_only=True))` | `get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))` |
# | `StateDictType.SHARDED_STATE_DICT` + `FSDP.optim_state_dict` | `get_state_dict(model, optimizer)` + `torch.distributed.checkpoint` (notebook 05) |
# | `FSDP.full_optim_state_dict` / `FSDP.optim_state_dict_to_load(model, optim, osd)` + `optim.load_state_dict` | `get_optimizer_state_dict(model, optim)` / `set_optimizer_state_dict(model, optim, osd)` (notebook 05) |
# | `mixed_precision=MixedPrecision(...)` | `fully_shard(..., mp_policy=MixedPrecisionPolicy(...))` |
#
# ## Exercise 4
#
# Open `exercises/ex04_fsdp.py`. It has two parts.
#
# **Part 1, ZeRO-1 by hand** (`shard_range`, `make_zero1_optimizer`, `zero1_step`): a plain,
# replicated model (no DDP, no FSDP), whose optimizer state you shard yourself. Each rank keeps an
# fp32 copy of its 1/W slice of the flattened parameters and an Adam over that slice alone; after
# backward the ranks must end up with the *mean* gradient of their own slice, step it, and then every
# rank needs every updated slice back in its model. **Before you write it, think.** Notebook 00b
# showed that an all-reduce is a reduce-scatter followed by an all-gather: where would the optimizer
# step go between the two, and what does each rank then never need to hold? A reduce-scatter and an
# all-gather move W *equal* pieces, and the grader's model has an odd number of parameters, which
# splits evenly over neither 2 nor 4 ranks: how long is each piece, and where do the extra elements
# go? The docstrings are the contract: what each rank holds, what crosses the wire, which
# collective and how many.
#
# **Part 2, FSDP2**: shard per block then the root, build the optimizer *after* sharding, train,
# and export a full state dict on rank 0.
#
# The grader runs both at 2 and 4 ranks and checks, against a single-process Adam on the same
# global batches: for part 1, `shard_range`'s slices, every rank's weights, the elements of each
# rank's Adam state (1/W of the parameters) and the collectives of each step, counted (one
# reduce-scatter, one all-gather, no all-reduce); for part 2, the DTensor placements, each rank's
# exact bytes (padding included), the peak during a step against the per-block bound, parity of
# the trained weights, and the exported state dict. Run the next cell (it grades the stub until you
# fill it in).

# %%
from autograder import check

report = check(4, raise_on_fail=False)
