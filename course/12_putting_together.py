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
# # 12 · Putting them together
#
# Each notebook so far split one thing: the batch (01 DDP, 04 FSDP), the layers (07 pipeline), a
# layer's matrices (08 tensor parallelism), the sequence (10 context parallelism), the experts (11).
# A real job splits several at once: its `W` GPUs are laid out on a **device mesh**, one dimension
# per parallelism, and the degrees multiply to `W`. torchtitan's Llama recipe
# (`torchtitan/models/llama3/infra/parallelize.py`) applies tensor parallelism first, on the mesh's
# `tp` dimension, then FSDP on its `dp` dimension, to the same modules.
#
# This notebook does that with the tiny transformer of `distlab.transformer` at W = 4, on a 2 × 2 mesh
# (rank = 2·dp + tp): each **row** `{0, 1}`, `{2, 3}` is a tensor-parallel pair (Megatron's split of
# the attention heads and the MLP, Shoeybi et al. 2019), each **column** `{0, 2}`, `{1, 3}` a
# data-parallel pair that shards what its pair holds (ZeRO-3, Rajbhandari et al. 2020). Then a
# **planner** in the manner of the *Ultra-Scale Playbook* (Tazi et al., 2025) predicts, for any
# model and cluster, the memory per GPU, the bytes sent per step and the pipeline bubble of every
# layout; first it must predict this run exactly.

# %%
# %load_ext distlab

# %% [markdown]
# ## One run on two dimensions
# `distlab.lab.mesh2d` holds the two steps, written as torchtitan writes them:
#
# ```python
# mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
# apply_tp(model, tp_mesh=mesh["tp"])    # parallelize_module: wq, wk, wv, mlp.w1 Colwise; wo, mlp.w2 Rowwise
# apply_fsdp(model, dp_mesh=mesh["dp"])  # fully_shard each block, then the root
# ```
#
# The job trains 3 steps of SGD with momentum on 8 sequences of 32 tokens: each data-parallel rank
# takes 4 of them, and both ranks of a tensor-parallel pair take the *same* 4 (they split the layer,
# not the data). It returns the losses, the weights gathered whole, every parameter's local shape,
# the bytes it holds, and every collective of the last step, recorded by `CollectiveRecorder`.
#
# Before you run it: the tensor-parallel pair all-reduces the attention's and the MLP's output in the
# forward (`4 × 32 × 32` floats each) and their input gradients in the backward; the data-parallel
# pair all-gathers each block's parameters (its tensor-parallel half) before the forward and again
# before the backward, and reduce-scatters the gradients.

# %%
from distlab.lab.predict import predict

sent_guess = predict("bytes each rank sends in one training step, both dimensions together", unit="kB",
                     guess=None)

# %%
# %%torchrun -n 4 --result runs
from distlab.lab.mesh2d import mesh2d_job

result = mesh2d_job(with_reference=True)

# %% [markdown]
# ## The same training as one process
# `reference_run` trains the whole model on the whole batch in one process, with no collective (rank
# 0 ran it too, after its share of the job: `with_reference=True`). The mean of the two
# data-parallel halves' losses is the whole batch's loss, and FSDP's reduce-scatter averages the
# gradients, so the runs must agree to float rounding (the sums are added in another order).

# %%
from distlab.lab.mesh2d import comm_by_dimension, parity

ref = runs[0]["reference"]
diff = parity(runs, ref)
print("loss per step, 2-D mesh:  ", [f"{x:.6f}" for x in diff["losses"]])
print("loss per step, one process:", [f"{x:.6f}" for x in ref["losses"]])
print(f"largest weight difference on any rank after 3 steps: {diff['weight_abs']:.1e} "
      f"({diff['weight_rel']:.1e} of the weight's largest entry)")
assert diff["loss"] < 1e-5 and diff["weight_rel"] < 1e-5

# %% [markdown]
# ## What each rank holds
# A split matrix is halved by `tp` (`ColwiseParallel` by output rows, `RowwiseParallel` by input
# columns) and its half halved again by `dp` (FSDP always shards dim 0; on top of a row split that is
# a `_StridedShard`): **a quarter per rank**. The norms, `mlp.w2`'s bias, the embeddings and the head
# are whole on both ranks of a pair, so only FSDP halves them.

# %%
import math

shapes = runs[0]["shapes"]
for name in [n for n in shapes if n.startswith("blocks.0.")] + ["tok.weight", "head.weight"]:
    full, local, placements = shapes[name]
    share = math.prod(full) // math.prod(local)
    print(f"{name:26} global {str(full):10} local {str(local):9} 1/{share} per rank  {placements}")
for r in runs:
    print(f"rank {r['rank']} (dp, tp) = {r['coordinate']}: holds {r['held']} bytes")

# %% [markdown]
# ## Every collective of one step
# By the dimension it ran on (each group has 2 ranks), its calls, its size `S` summed (the all-gathered
# output, the reduce-scattered input, the all-reduced tensor) and the bytes this rank sent with ring
# algorithms (`wire_bytes`: `(n-1)/n · S` a gather or scatter, `2(n-1)/n · S` an all-reduce).

# %%
measured = comm_by_dimension(runs[0]["ops"], runs[0]["group_sizes"])
for dim, kinds in measured.items():
    for kind, row in kinds.items():
        print(f"{dim}: {kind:15} {row['calls']} calls, {row['bytes']:>7,} B, sent {row['wire_bytes']:>9,.0f} B")
sent = sum(row["wire_bytes"] for kinds in measured.values() for row in kinds.values())
assert all(comm_by_dimension(r["ops"], r["group_sizes"]) == measured for r in runs)  # every rank alike

# %%
line = sent_guess.reveal(sent / 1e3)  # printed beside your prediction

# %% [markdown]
# The tensor-parallel all-reduces move **activations** (they grow with the micro-batch and the
# sequence); FSDP's collectives move **parameters and gradients** (they grow with the model). The
# root unit (embeddings, final norm, head) is all-gathered once, not twice: FSDP2 keeps the root
# gathered between its forward and its backward (`2 × 2 + 1 = 5` all-gathers).
#
# ## The planner, on this run
# `distlab.lab.planner` adds nothing to the course's accounting: memory is
# `training_memory` (notebook 00, 04) of the parameters a rank keeps plus `activation_memory`'s
# transformer layer (notebook 08); each collective is priced by the recorder's own `wire_bytes`, and
# timed with the α-β model of `bandwidth` (notebooks 00b, 06); the bubble is `(p-1)/(m+p-1)` (07).
# Given this run's layout (`fsdp 2 × tp 2`) and training (fp32, SGD with momentum, 8 sequences), its
# model states and its collectives must be exactly what the run held and recorded.

# %%
from distlab.lab.planner import Layout, Model, Training, collectives, memory_per_gpu
from distlab.measure.comm import label, wire_bytes
from distlab.transformer import TransformerConfig

model, layout = Model.of(TransformerConfig(), seq=32), Layout(fsdp=2, tp=2)
training = Training(batch=8, precision="fp32", optimizer="sgd+momentum")
memory = memory_per_gpu(model, layout, training)
for term in ("params", "grads", "optimizer"):
    print(f"{term:9} predicted {memory[term]:>8,.0f} B, held {runs[0]['held'][term]:>8,} B")
predicted = {}
for row in collectives(model, layout, training):
    cell = predicted.setdefault({"fsdp": "dp"}.get(row["dim"], row["dim"]), {}).setdefault(
        label(row["kind"]), {"calls": 0, "bytes": 0, "wire_bytes": 0})
    cell["calls"] += row["calls"]
    cell["bytes"] += row["calls"] * row["bytes"]
    cell["wire_bytes"] += row["calls"] * wire_bytes(row["kind"], row["bytes"], row["group"])
for dim, kinds in predicted.items():
    for kind, row in kinds.items():
        print(f"{dim}: {kind:15} predicted {row['calls']} calls, {row['bytes']:>7,.0f} B; "
              f"recorded {measured[dim][kind]['calls']} calls, {measured[dim][kind]['bytes']:>7,} B")
assert predicted == measured and all(memory[t] == runs[0]["held"][t] for t in ("params", "grads", "optimizer"))

# %% [markdown]
# Exact, because nothing here is padded (every split divides) and the planner models FSDP2 as it
# behaves (one unit per layer, the root gathered once). What this check leaves out: the compute, and how
# much of the communication overlaps it (the planner models both below; no run here checks them); Adam's
# 4-byte step counters; allocator slack. Its activation term
# is Korthikanti et al.'s GPT layer (16-bit, with dropout), not this fp32 model's: a figure to plan
# with, not one this run can check to the byte.
#
# **Which of the planner's figures are checked against runs on this machine**, and how
# (`tests/distlab/test_planner.py`, `tests/distlab/test_mesh2d.py`; `distlab.lab.planner_runs` runs the labs' own rank
# programs in one launch of 4 ranks):
#
# | figure | checked against | agreement |
# |---|---|---|
# | FSDP's and TP's bytes held and collectives | this run (above) | exact |
# | PP's sends, per stage | notebook 07's `torch.distributed.pipelining` 1F1B and GPipe, `p = 4`, recorded | exact |
# | PP's bubble `(p-1)/(m+p-1)` | the order of actions that run took, replayed in slots | exact (in slots) |
# | PP's activations in flight, `min(p - s, m)` micro-batches | stage `s`'s peak of saved bytes, 1F1B | exact |
# | CP's sends | notebook 10's ring, forward and backward, `W = 4`, recorded | exact |
# | EP's all-to-alls | notebook 11's padded dispatch, `W = 4`, recorded | exact |
# | the bubble in wall time, communication time, compute and step time, activation bytes per layer | nothing | a model |
#
# The bubble is compared in slots, not seconds: on 2 cores shared by 4 ranks the wall-time bubble also
# holds the schedule's own Python and the waits for a core (notebook 07 measures both). The activation
# bytes of a transformer layer are Korthikanti et al.'s; the pipeline run checks only *how many*
# micro-batches' activations a stage holds. The α-β times are as good as the fit of notebook 06.

# %% [markdown]
# ## Time: which rules of thumb follow
# The Playbook states three rules of thumb (with Narayanan et al., *Efficient Large-Scale Language Model
# Training on GPU Clusters Using Megatron-LM*, SC 2021, for TP and PP): **FSDP first** while the model's
# states do not fit; **TP within a node**; **PP across nodes**. The table above cannot derive them: it
# prices every link alike and counts no compute. Given a peak, `distlab.lab.planner_time` adds what they
# rest on:
#
# * **compute**: `6 N` FLOPs per token (`8 N` under full recomputation: the forward again), over the GPUs,
#   at a fraction of each GPU's peak (40% here, an input, not a prediction);
# * **the bubble, priced**: a 1F1B pipeline takes `(m + p - 1) / m` of its stages' compute;
# * **links**: ranks are numbered `tp` innermost, then `cp`, `ep`, `fsdp`, `dp`, `pp` (Megatron's order),
#   8 to a node; a group inside a node uses NVLink (360 GB/s here), one spanning nodes the network
#   (45 GB/s a GPU: a 400 Gb/s NIC each);
# * **overlap**: TP's, CP's and EP's collectives and the pipeline's sends are waited for; DDP's all-reduce
#   runs during the backward (`4 N` of `6 N`), FSDP's gathers and reduce-scatters during the forward and
#   backward, so only what exceeds that window counts.
#
# A Llama 3 8B-shaped model (32 layers of width 4096, 32 heads, a 128k vocabulary, sequences of 8192;
# 7.5 B parameters in this planner's layer, whose MLP is `4h` and whose `k`, `v` are full width) on two
# nodes of eight 80 GB H100s, 256 sequences a step in 16 micro-batches, bf16 with Adam, attention that
# keeps no scores (FlashAttention's, "selective"), sequence parallelism with TP.

# %%
from dataclasses import replace

from distlab.lab.planner import Layout, Model, Training, plan, plan_layout
from distlab.lab.planner_widget import H100_NODES

llama3_8b = Model(layers=32, hidden=4096, heads=32, seq=8192, vocab=128256)
job = Training(batch=256, micro_batches=16, recompute="selective", sp=True)
ranked = plan(llama3_8b, H100_NODES, job)
print(f"{'layout':26}{'GB/GPU':>8}{'step s':>8}{'compute':>9}{'bubble':>8}{'waited':>8}{'exposed':>9}{'to hide':>9}")
for r in [r for r in ranked if r["fits"]][:8]:
    t = r["time"]
    print(f"{str(r['layout']):26}{r['memory']['total'] / 1e9:8.1f}{t['step']:8.2f}{t['compute']:9.2f}"
          f"{t['bubble']:8.2f}{t['critical']:8.2f}{t['exposed']:9.2f}{t['overlappable']:9.2f}")

# %% [markdown]
# **FSDP first** comes out: the fastest layouts are data-parallel only, the compute alone, nothing
# waited for. And a fourth rule with it: among them, the ones that **shard within a node and replicate
# across** (`dp 4 × fsdp 4`, `dp 2 × fsdp 8`: PyTorch's HSDP, torchtitan's `dp_replicate × dp_shard`) leave
# a tenth as much to hide as `fsdp 16`, whose gathers cross the network at every layer and fill 97% of
# the compute: one slow step of the network and they are exposed. Where do tensor and pipeline
# parallelism stand, and would their placement matter?

# %%
import matplotlib.pyplot as plt

pp_inside = replace(H100_NODES, placement=("pp", "fsdp", "dp", "cp", "ep", "tp"))  # TP's pairs across nodes
shown = [(str(r["layout"]), r["time"]) for r in [r for r in ranked if r["fits"]][:3]]
for layout in (Layout(fsdp=8, tp=2), Layout(fsdp=4, pp=4), Layout(fsdp=2, tp=8)):
    shown.append((str(layout), plan_layout(llama3_8b, layout, job, H100_NODES)["time"]))
    shown.append((f"{layout}, PP/FSDP inside a node", plan_layout(llama3_8b, layout, job, pp_inside)["time"]))
fig, ax = plt.subplots(figsize=(8, 4))
left = [0.0] * len(shown)
for part, colour in (("compute", "tab:blue"), ("bubble", "tab:gray"), ("critical", "tab:red"),
                     ("exposed", "tab:orange")):
    widths = [t[part] for _, t in shown]
    ax.barh([name for name, _ in shown], widths, left=left, color=colour,
            label={"critical": "waited for (TP, CP, EP, PP)", "exposed": "DP/FSDP not hidden"}.get(part, part))
    left = [a + b for a, b in zip(left, widths)]
ax.barh([name for name, _ in shown], [min(t["overlappable"], t["step"]) for _, t in shown], height=0.25,
        color="black", alpha=0.45, label="DP/FSDP traffic, hidden behind the compute")
ax.invert_yaxis()
ax.set_xlabel("seconds per step (model)")
ax.set_title("Llama 3 8B-shaped, 2 nodes x 8 H100, 256 x 8192 tokens a step")
ax.legend(fontsize=8, loc="upper right")
plt.tight_layout()
plt.show()
for name, t in shown[3:]:
    print(f"{name:40} step {t['step']:6.2f} s, of which waited for {t['critical']:5.2f} s")

# %% [markdown]
# **TP within a node** comes out as a comparison of placements: the same degrees, `fsdp 2 × tp 8`, take
# about 22 s a step with each TP group inside a node and three times that with the groups across
# nodes, where TP's activation-sized collectives, four per layer and micro-batch, wait on the network
# (`fsdp 8 × tp 2`: 16 s against 23 s). **PP across nodes** is the same comparison turned round: with
# `fsdp 4 × pp 4` the pipeline's sends are one activation per micro-batch and stage boundary, a fraction
# of a second on either link, so it is the degree that can afford the slow one; what it costs is its
# bubble, `3/16` of the compute.
#
# What still does not follow, and is stated, not derived:
#
# * for this model TP and PP are never needed on two nodes: every layout with them is slower than
#   HSDP. They pay when the states do not fit even sharded over a node, or when the global batch is too
#   small to give each GPU a sequence; the planner says when, for the model you type in (below);
# * the efficiency (40%) is an input, the same for every layout; in practice TP's smaller matrices
#   compute less efficiently, and so do a pipeline's micro-batches;
# * one link per GPU, without contention: the groups that share a node's NIC slow each other, which this
#   model does not price; attention's `s^2` FLOPs are not counted (as `6 N` does not count them).
#
# The widget below prices time too when given a peak: set *peak TFLOP/s* to 989 (an H100's bf16), *GPUs /
# node* to 8 and the *GB/s network* to 45, with 16 GPUs.

# %% [markdown]
# ## Plan a real job
# Type in a model, a cluster and a batch. Every layout of the six degrees whose product is the GPU
# count (and that the model divides: heads by `tp`, layers by `pp`, the sequence by `cp`, experts by
# `ep`) is listed, those that fit in memory first, then by their step time (with a peak) or their
# communication time (without). Try: Llama-2 7B
# on 8 GPUs of 80 GB (the default) with `recompute` full; 4 micro-batches against 16; a link of
# 25 GB/s (between nodes) instead of 100; 8 experts.

# %%
from distlab.lab.planner_widget import planner

plan_7b = planner()
