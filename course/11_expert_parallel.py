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
# This notebook: the router and its top-k; **capacity** and the tokens dropped at it; the
# **load-balancing loss** of the Switch Transformer (Fedus et al., 2021) seen in a short training;
# GShard's padded dispatch at W=2 against the single-process MoE; and the bytes of the all-to-alls
# against the all-reduce a replicated layer would need. Exercise 11 writes the dispatch without
# padding: uneven splits, exchanged first, and the inverse permutation.

# %%
# %load_ext distlab

# %%
import torch

from distlab.lab.expert_parallel import capacity, load_balancing_loss, seeded_moe

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
# Train the router briefly towards a target that prefers expert 0 (a stand-in for a real task's
# pull), with and without the auxiliary loss `E · Σ f_i P_i`, and count the slots per expert.
# Top-1 routing of the 64 tokens, capacity factor 2: each expert takes at most
# ceil(2 · 64 / 4) = 32 tokens, and a token routed to a full expert is dropped.

# %%
# Predict before you run: type your guess in the box (or write it in place of guess=None).
from distlab.lab.predict import predict

dropped_guess = predict("tokens of the 64 dropped at capacity after training the router without the aux loss",
                        fmt=".0f", guess=None)

# %%
import matplotlib.pyplot as plt


def train(aux_weight: float, steps: int = 60) -> list[int]:
    layer = seeded_moe(0, hidden=16, ffn=32, n_experts=4, top_k=1, capacity_factor=2.0)
    opt = torch.optim.SGD(layer.router.parameters(), lr=0.5)
    for _ in range(steps):
        routing = layer.router(x)
        pull = -routing.probs[:, 0].mean()   # the task's pull towards expert 0
        loss = pull + aux_weight * load_balancing_loss(routing, 4)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        return layer(x).tokens_per_expert.tolist()


counts = {"without aux loss": train(0.0), "with aux loss (weight 1)": train(1.0)}
fig, ax = plt.subplots(figsize=(6, 2.5))
for i, (name, c) in enumerate(counts.items()):
    ax.bar([e + 0.4 * i for e in range(4)], c, width=0.4, label=name)
ax.set_xlabel("expert")
ax.set_ylabel("tokens")
ax.legend()
plt.show()
print(counts)

# %%
dropped = {name: 64 - sum(c) for name, c in counts.items()}   # top-1: every token has one slot, kept or dropped
print("dropped at capacity:", dropped)
dropped_guess.reveal(dropped["without aux loss"])

# %% [markdown]
# **Dispatch and combine at W=2**, GShard's way: one expert per rank; each rank writes its kept
# slots into a buffer of `W · C` rows (`C` per expert, zeros where it has fewer), so every split is
# `C` rows and `all_to_all_single` needs no sizes. The all-to-all must be autograd-aware
# (`torch.distributed._functional_collectives.all_to_all_single_autograd`; the older
# `torch.distributed.nn.functional.all_to_all_single` is deprecated in 2.13) or no gradient
# reaches the experts. `ep_job` compares output and gradients with the single-process MoE, and
# also does the **exchange of counts** that uneven splits need: one all-to-all of `W` integers.

# %%
# %%torchrun -n 2 --result runs
from distlab.lab.expert_parallel import ep_job

result = ep_job(tokens=64, hidden=16, ffn=32)

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
# The all-to-alls move **activations** (tokens × hidden, four times per step), the all-reduce of a
# replicated layer moves **parameters** (every expert's gradient): expert parallelism pays off when
# the experts are large against the tokens a rank routes, and the padding (rows sent that hold
# nothing) is what exercise 11's uneven splits save.
#
# **Exercise 11.** In `exercises/ex11_moe_dispatch.py`, write `sort_by_expert` (the kept slots in
# expert order, and the split sizes), `exchange_split_sizes`, `dispatch` and `combine` (uneven
# autograd all-to-alls, and the inverse permutation). The grader runs them at W=2 inside the same
# MoE layer and compares output and gradients with the single-process MoE.

# %%
from autograder import check

check(11, raise_on_fail=False)
