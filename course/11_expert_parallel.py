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
# # 11 · Expert parallelism
#
# A **mixture of experts** (MoE) replaces a transformer's one FFN by `E` of them and sends each
# token to `k` of them, chosen by a small **router** (Shazeer et al., 2017): the parameters grow
# with `E`, the compute per token does not. **Expert parallelism** puts the experts on different
# ranks, so the tokens must travel: an **all-to-all** sends each token to its expert's rank
# (dispatch) and another brings the result back (combine) (Lepikhin et al., 2020, *GShard*).
#
# This notebook: the router and its top-k; **capacity** and the tokens dropped at it; balancing the
# load, with the Switch Transformer's **auxiliary loss** (Fedus et al., 2021) and with DeepSeek-V3's
# **bias** that needs no loss, and **shared experts**; GShard's padded dispatch with **top-2** routing at
# W=2 against the single-process MoE, and the bytes of its all-to-alls; **dropless** experts as one
# grouped matrix multiply (MegaBlocks); and at W=4, expert parallelism **carved from the data-parallel
# ranks** of a mesh, and the all-to-all's time against **routing imbalance**. Exercise 11 writes the
# dispatch without padding: uneven splits, exchanged first, and the inverse permutation.

# %%
# %load_ext distlab

# %%
import torch

from distlab.lab.expert_parallel import capacity, seeded_moe

torch.manual_seed(0)
x = torch.randn(64, 16)
moe = seeded_moe(0, hidden=16, ffn=32, n_experts=4, top_k=2, capacity_factor=1.0)
out = moe(x)
print("router: the top-2 experts of the first 3 tokens", moe.router(x[:3]).experts.tolist())
print(f"capacity per expert: ceil(1.0 * 64 tokens * 2 / 4 experts) = {capacity(64, 4, 2, 1.0)}")
print(f"slots per expert {out.tokens_per_expert.tolist()}, dropped {out.dropped} of {64 * 2}, "
      f"aux loss {out.aux_loss.item():.3f} (1.0 when balanced)")

# %% [markdown]
# **Load balance.** A router left alone favours a few experts, and those drop tokens at capacity.
# Train a top-1 router briefly towards a task that prefers expert 0 (a stand-in for a real task's pull,
# `-mean P_0`), three ways:
# - nothing against it;
# - the Switch Transformer's auxiliary loss `E · Σ f_i P_i`, added to the task's loss (weight 1);
# - DeepSeek-V3's auxiliary-loss-free balancing (Wang et al., 2024; DeepSeek-V3, sec. 2.1.2): a
#   per-expert bias `b_i` added to the scores *for choosing the top-k only*, the gate still the score
#   itself, moved after each step by `γ · sign(mean load − load_i)` (`BiasRouter`, `update_bias`). The
#   bias is not a parameter: no gradient reaches it, and it sends none to the router.
#
# Then route the 64 tokens with capacity factor 2 (each expert takes at most ceil(2 · 64 / 4) = 32; a
# token routed to a full expert is dropped).

# %%
# Predict before you run: type your guess in the box (or write it in place of guess=None).
from distlab.lab.predict import predict

dropped_guess = predict("tokens of the 64 dropped at capacity after training the router with nothing against the pull",
                        fmt=".0f", guess=None)

# %%
import matplotlib.pyplot as plt

from distlab.lab.expert_parallel import router_training

trained = {m: router_training(m, x, steps=100, gamma=0.01, capacity_factor=2.0) for m in ("none", "switch loss", "bias")}
fig, ax = plt.subplots(figsize=(7, 2.8))
for name, run in trained.items():
    ax.plot(run["imbalance"], label=name)
ax.set_xlabel("step")
ax.set_ylabel("busiest expert / mean load")
ax.legend()
plt.show()


# %%
for name, run in trained.items():
    tail = sum(run["imbalance"][-20:]) / 20
    print(f"{name:12s} imbalance over the last 20 steps {tail:.2f}, kept per expert {run['kept']}, "
          f"dropped {64 - sum(run['kept'])}; the task's mean P_0 {run['p0']:.3f}")
print("bias: the router's weights are those trained with nothing against the pull:",
      torch.equal(trained["bias"]["weight"], trained["none"]["weight"]))
dropped_guess.reveal(64 - sum(trained["none"]["kept"]))   # top-1: every token has one slot, kept or dropped

# %% [markdown]
# The auxiliary loss balances by pulling the router's probabilities away from what the task asked
# for (its mean `P_0` is lower): the two gradients compete, and its weight is a trade-off. The bias
# balances the *choice* and leaves the probabilities, hence the task's gradient, alone: its router's
# weights are bit for bit those of the unbalanced run. A fixed step `γ` and a sign make it oscillate
# around balance, and a task that keeps pulling harder, as this stand-in does, drifts ahead of it;
# DeepSeek-V3 also keeps a tiny sequence-wise auxiliary loss (weight 0.0001) against extreme cases.
#
# **Shared experts** (DeepSeekMoE, Dai et al., 2024): `n_shared` ordinary FFNs that every token passes
# through, beside the routed ones (`SharedExpertMoE`). Under expert parallelism a shared expert is a
# dense layer: replicated, its tokens never travel, and its compute can hide the dispatch all-to-all.
# DeepSeek-V3 has 1 shared and 256 routed experts in each of its 58 MoE layers, 8 routed per token:

# %%
from distlab.lab.expert_parallel import DEEPSEEK_V3

c = DEEPSEEK_V3
print(f"one SwiGLU expert: 3 x {c.hidden} x {c.expert_ffn} = {c.expert_parameters() / 1e6:.1f}M parameters")
print(f"experts of all {c.layers} MoE layers: {c.total_ffn_parameters() / 1e9:.0f}B of the model's 671B; "
      f"a token passes through {c.top_k} + {c.shared} per layer: {c.active_ffn_parameters() / 1e9:.1f}B of its 37B active")

# %% [markdown]
# **Dispatch and combine at W=2**, GShard's way, with GShard's **top-2** routing: each token makes two
# slots, for two different experts, so its two halves may travel to two ranks and come back to be
# added, each weighed by its renormalised gate. One expert per rank; each rank writes its kept
# slots into a buffer of `W · C` rows (`C` per expert, zeros where it has fewer), so every split is
# `C` rows and `all_to_all_single` needs no sizes. The all-to-all must be autograd-aware
# (`torch.distributed._functional_collectives.all_to_all_single_autograd`; the older
# `torch.distributed.nn.functional.all_to_all_single` is deprecated in 2.13) or the backward stops
# at it: through combine's, the experts get no gradient; through dispatch's, the tokens get none but
# the router's. `ep_job` compares output and gradients with the single-process MoE, and
# also does the **exchange of counts** that uneven splits need: one all-to-all of `W` integers.

# %%
# %%torchrun -n 2 --result runs
from distlab.lab.expert_parallel import ep_job

result = ep_job(tokens=64, hidden=16, ffn=32, top_k=2)

# %%
for r in runs:
    print(f"rank {r['rank']}: output diff {r['y_diff']:.2g}, x.grad diff {r['x_grad_diff']:.2g}, expert grad diff "
          f"{r['expert_grad_diff']:.2g}; capacity {r['capacity']}, padding rows sent {r['padding_rows']}, "
          f"dropped {r['dropped']}; sends {r['send_counts']} slots, receives {r['recv_counts']}")
r = runs[0]
print(f"all-to-alls: {r['a2a_counts']}, {r['a2a']['wire_bytes']:,.0f} B on the wire per rank; "
      f"the count exchange {r['count_exchange']['wire_bytes']:,.0f} B")
print(f"a replicated MoE (data parallel) all-reduces {r['moe_parameters']:,} gradients: "
      f"{r['dense_all_reduce']['wire_bytes']:,.0f} B per rank")

# %% [markdown]
# The all-to-alls move **activations** (tokens × hidden, four times per step; top-2 sends each token
# twice), the all-reduce of a replicated layer moves **parameters** (every expert's gradient): expert
# parallelism pays off when the experts are large against the tokens a rank routes, and the padding
# (rows sent that hold nothing) is what exercise 11's uneven splits save.
#
# **Dropless.** Capacity buys fixed shapes with dropped tokens. MegaBlocks (Gale et al., 2022) drops
# none: sort the slots by expert, so that each expert's rows are one contiguous block of uneven
# length, and run every expert at once as a **grouped GEMM** over the blocks. In PyTorch that is
# `torch._grouped_mm(rows, W, offs=ends_of_blocks)` with the experts' weights stacked `(E, in, out)`
# (torchtitan's `GroupedExperts` calls it); it is private, and in torch 2.13 it has a CPU kernel,
# forward and backward, that wants every stride a multiple of 16 bytes. `dropless_forward` uses it
# where it runs and a loop over the blocks where it does not, and says which it ran:

# %%
from distlab.lab.expert_parallel import dropless_forward, grouped_mm_works

kernel = "grouped_mm" if grouped_mm_works(16, 32) else "loop"
tight = seeded_moe(0, hidden=16, ffn=32, n_experts=4, top_k=2, capacity_factor=1.0)
roomy = seeded_moe(0, hidden=16, ffn=32, n_experts=4, top_k=2, capacity_factor=4.0)  # C = every slot
dropless = dropless_forward(tight, x, kernel=kernel)
print(f"kernel: {kernel} (torch {torch.__version__}); slots per expert {dropless.tokens_per_expert.tolist()}")
print(f"capacity factor 1.0 drops {tight(x).dropped} of 128 slots; dropless drops {dropless.dropped}, and its output "
      f"differs from a capacity that drops nothing by {(dropless.y - roomy(x).y).abs().max().item():.2g}")

# %% [markdown]
# **At W=4: carved from data parallelism, and imbalance.** A real job does not give experts ranks of
# their own. Its ranks are all data-parallel, each with its own tokens, and the experts are spread over
# groups of `ep` of them: on the mesh `(dp, ep) = (2, 2)`, rank `(d, e)` holds expert `e`, and a copy of
# each expert sits in each `dp` row (GShard's and DeepSeek-V3's layout; torchtitan takes its `ep` degree
# out of the data-parallel ranks the same way). The tokens travel inside an `ep` group only; an
# expert's gradient is all-reduced over the ranks holding it (`dp`); the dense weights (the router)
# over every rank. `ep_mesh_report` compares all of it with one process.
#
# The same launch measures what **routing imbalance** costs. The router sends a share `ρ/W` of every
# rank's tokens to one *hot* expert (`ρ = 1` balanced, `ρ = W` all of them): its rank receives `ρ` times
# the balanced rows, then computes `ρ` times the work, and every rank waits for it.

# %%
# %%torchrun -n 4 --result scale
from distlab.lab.expert_parallel.mesh import ep_scale_job

result = ep_scale_job()

# %%
for r in (s["mesh"] for s in scale):
    print(f"rank {r['rank']} {r['coordinate']}: expert {r['expert']}, tokens exchanged with ranks {r['ep_group']}, "
          f"expert gradient summed with ranks {r['dp_group']}; output diff {r['y_diff']:.2g}, expert grad diff "
          f"{r['expert_grad_diff']:.2g}, router grad diff {r['router_grad_diff']:.2g}")
m = scale[0]["mesh"]
print(f"per rank: {m['a2a']['all_to_all']['calls']} all-to-alls in its ep group ({m['a2a']['wire_bytes']:,.0f} B), "
      f"an all-reduce of {m['expert_parameters']:,} expert gradients over dp, of {m['router_parameters']} router "
      f"gradients over all 4")

# %%
from distlab.measure.timing import cpu_cores

rows = scale[0]["imbalance"]["rows"]
rho = [row["rho"] for row in rows]
fig, ax = plt.subplots(figsize=(6, 3))
for key, name in (("all_to_all", "dispatch all-to-all (every rank at once)"),
                  ("expert", "the busiest rank's expert (each rank timed alone)")):
    ax.plot(rho, [row[key] / rows[0][key] for row in rows], "o-", label=name)
ax.plot(rho, rho, "k--", label="ρ")
ax.set_xlabel("ρ: the hot expert's load / the mean")
ax.set_ylabel("time / balanced time")
ax.legend()
plt.show()
for row in rows:
    print(f"rho {row['rho']}: the busiest rank received {row['busiest_rows']:,} rows; all-to-all "
          f"{row['all_to_all'] * 1e3:.2f} ms, its expert {row['expert'] * 1e3:.2f} ms")
print(f"measured with 4 ranks on {cpu_cores()} CPU cores")

# %% [markdown]
# Read the plot with the machine in mind. The busiest expert's time follows `ρ`, within this machine's
# noise: each rank was timed alone, as each GPU computes alone, and every other rank waits for it. The all-to-all
# between processes on one CPU is memory copies, and the ranks together copy the same bytes whatever
# `ρ` is (each sends all its rows but its own expert's: `(W − 1) · T` rows in all), so its time need
# not follow `ρ`. On GPUs each rank has its own link, and the hot rank's receive takes about `ρ` times
# as long too. Hence capacity, which bounds `ρ` by dropping tokens, and the balancing above, which
# dropless training depends on.
#
# **Exercise 11.** In `exercises/ex11_moe_dispatch.py`, write `sort_by_expert` (the kept slots in
# expert order, and the split sizes), `exchange_split_sizes`, `dispatch` and `combine` (uneven
# autograd all-to-alls, and the inverse permutation). The grader runs them at W=2 inside the same
# MoE layer and compares output and gradients with the single-process MoE.

# %%
from autograder import check

check(11, raise_on_fail=False)
