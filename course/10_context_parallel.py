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
# # 10 · Context parallelism
#
# Data parallelism splits the batch, FSDP the weights, pipelines the layers, tensor parallelism
# the matrices. A long sequence is the fifth thing that does not fit: attention's scores are
# `S x S` per head, and even FlashAttention, which never stores them, keeps the activations of
# all `S` positions on one device. **Context parallelism** splits the *sequence*: rank `r` of `W`
# holds positions `r n ... (r + 1) n - 1` (`n = S / W`) of every query, key and value, and every
# layer but attention runs its forward on its shard with no communication (they work position by
# position). The weights are the same on every rank of the CP group, so their gradients are reduced
# over it, as over a data-parallel group (torchtitan folds the CP ranks into FSDP's mesh).
#
# Attention needs each query against every key. **Ring attention** (Liu et al. 2023, *Ring Attention
# with Blockwise Transformers*) passes the key/value shards round a ring: at step `i` rank `r`
# attends to the shard that started on rank `r - i`, while sending it on to `r + 1` and receiving the
# next from `r - 1`. After `W - 1` exchanges every query has seen every key, and no rank ever held more
# than two shards. Each step gives an output normalised over *one block* of keys; blocks merge
# exactly by their **log-sum-exp** `lse = log sum_j exp(s_j)`, the normaliser FlashAttention keeps
# (Dao et al. 2022):
#
# $$\ell = \log(e^{\ell_a} + e^{\ell_b}), \qquad o = e^{\ell_a - \ell}\, o_a + e^{\ell_b - \ell}\, o_b .$$
#
# This notebook runs the **non-causal** ring's forward by hand (`distlab.lab.context_parallel.ring`:
# `dist.batch_isend_irecv`), checks it against attention on the whole sequence,
# then measures what a causal mask does to the work of each rank and how the **zig-zag** layout
# (Llama 3's context parallelism, *The Llama 3 Herd of Models*, 2024, §3.3.2, and the
# `ring-flash-attention` package) balances it, the memory per rank against the sequence length, and
# the bytes each rank sends. The causal ring on the zig-zag layout, and its backward, are exercise 10.
#
# | legacy / elsewhere | PyTorch today |
# |---|---|
# | `dist.isend`/`dist.irecv` pairs posted one by one (and a blocking `dist.send` first on every rank: a deadlock) | `dist.batch_isend_irecv([dist.P2POp(dist.isend, ...), dist.P2POp(dist.irecv, ...)])` |
# | hand-written rings in research code (the `ring-flash-attention` package, picotron's `context_parallel/`, both on flash-attn) | `torch.distributed.tensor.experimental.context_parallel` (a context manager over SDPA, with round-robin load balancing), used by torchtitan; by default it all-gathers the keys and values, as Llama 3 does, and `set_rotate_method("alltoall")` passes them from rank to rank instead |

# %% [markdown]
# ## 1. Two blocks, merged by their log-sum-exp (one process)
# `block_attention(q, k, v)` returns the attention of `q` over one block of keys and that block's
# lse. Cut the keys in two, attend to each half, merge: the result is the softmax over all keys.

# %%
import torch
import torch.nn.functional as F

from distlab.lab.context_parallel.ring import block_attention, merge

g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(1, 2, 16, 8, generator=g) for _ in range(3))
out_a, lse_a = block_attention(q, k[..., :10, :], v[..., :10, :])
out_b, lse_b = block_attention(q, k[..., 10:, :], v[..., 10:, :])
merged, _ = merge(out_a, lse_a, out_b, lse_b)
whole = F.scaled_dot_product_attention(q, k, v)
print(f"max |merged - SDPA| = {(merged - whole).abs().max():.1e};  "
      f"max |(out_a + out_b) / 2 - SDPA| = {((out_a + out_b) / 2 - whole).abs().max():.2f}")
assert torch.allclose(merged, whole, atol=1e-6)

# %% [markdown]
# ## 2. The ring on 4 ranks
# One job measures everything below: the non-causal ring's forward (`ring_forward`) against the whole
# sequence's attention; the causal work of each rank under both layouts; the memory per rank; and the
# ring's time with and without its communication. Autograd does not flow through `isend`/`irecv`, so
# a ring that trains needs its backward written by hand: a second ring, which exercise 10 builds.

# %%
# Predict before you run: type your guess in the box (or write it in place of guess=None).
from distlab.lab.predict import predict

memory_guess = predict(
    "how many times less peak memory one rank of the 4-rank ring needs than attention over the whole "
    "sequence on one process, at S = 512 (both materialise each block's scores)",
    unit="x", fmt=".1f", guess=None)
balance_guess = predict(
    "with a causal mask and contiguous shards on 4 ranks, the busiest rank's unmasked scores over the mean rank's",
    unit="x", fmt=".2f", guess=None)

# %%
# %load_ext distlab

# %%
# %%torchrun -n 4 --result runs
import distlab
from distlab.lab.context_parallel.allgather import variants_report, weight_gradients_report
from distlab.lab.context_parallel.jobs import memory_report, overlap_report, parity_report, work_report

distlab.init_distributed()
result = {"parity": parity_report(seq=64), "work": {lay: work_report(lay, seq=512) for lay in ("contiguous", "zigzag")},
          "memory": memory_report([64, 128, 256, 512]), "overlap": overlap_report(seq=256),
          "variants": variants_report(seq=64), "weights": weight_gradients_report(seq=64)}
distlab.shutdown()

# %%
W = len(runs)
for r, run in enumerate(runs):
    p = run["parity"]
    print(f"rank {r}: max diff from SDPA on the whole sequence {p['out']:.1e}; sends {p['sends']}, bytes {p['bytes']}")
assert all(run["parity"]["out"] < 1e-5 and run["parity"]["other_ops"] == [] for run in runs)

# %% [markdown]
# Each rank sent `W - 1 = 3` messages forward, each its `(k, v)` shard: `2 x shard` bytes, so
# `2 (W - 1) S / W x H x D x 4` bytes in all, **the same as one all-gather of `k` and `v`**, but never
# more than two shards held at once. The backward (exercise 10's) sends `(k, v, dk, dv)` `W - 1` times
# and `(dk, dv)` once more, home: twice the forward's bytes plus one shard pair. The communication per
# rank does not shrink with `W`: it is `~2 S H D` elements (`x 4` bytes in fp32) whatever the split,
# while each rank's compute per step falls as `(S / W)^2`. That ratio is why the ring pays only while
# a block's compute hides its transfer (section 5).
#
# ## 3. The causal mask makes the work uneven; zig-zag evens it
# With a causal mask query `i` sees keys `j <= i`. On contiguous shards, rank 0 (the first
# positions) has one triangle to compute and the last rank all of its shard against every earlier
# shard: the ring waits for the last rank at every step. Zig-zag cuts the sequence into `2W` chunks
# and gives rank `r` chunks `r` and `2W - 1 - r`, an early and a late one. Counted exactly
# (`work_per_rank`: query-key pairs under the mask, and the `S/2W x S/2W` blocks a blockwise kernel
# computes, skipping those the mask hides) and timed (each rank's blocks, one rank at a time so
# that the 2 cores of a laptop are not shared):

# %%
import matplotlib.pyplot as plt

from distlab.lab.context_parallel.sharding import attention_flops, imbalance, work_per_rank

fig, axes = plt.subplots(1, 2, figsize=(11, 3.2))
for i, layout in enumerate(("contiguous", "zigzag")):
    counted = work_per_rank(layout, 512, W)
    timed = [run["work"][layout] for run in runs]
    assert [c["blocks"] for c in counted] == [t["blocks"] for t in timed]
    print(f"{layout:>10}: pairs per rank {[c['pairs'] for c in counted]} (busiest / mean {imbalance(counted):.2f}), "
          f"GFLOP {[round(attention_flops(c['pairs'], 16, heads=2) / 1e9, 4) for c in counted]}, "
          f"blocks {[c['blocks'] for c in counted]}, ms {[round(t['seconds'] * 1e3, 2) for t in timed]}")
    axes[0].bar([r + 0.4 * i for r in range(W)], [c["pairs"] for c in counted], width=0.4, label=layout)
    axes[1].bar([r + 0.4 * i for r in range(W)], [t["seconds"] * 1e3 for t in timed], width=0.4, label=layout)
axes[0].set(title="unmasked scores per rank (counted)", xlabel="rank")
axes[1].set(title="causal blocks per rank (ms, measured)", xlabel="rank")
axes[0].legend()
plt.show()
balance_guess.reveal(imbalance(work_per_rank("contiguous", 512, W)), what="counted")

# %% [markdown]
# Contiguous: the busiest rank does `2 - 1/W` times the mean (1.75 at `W = 4`), so a causal ring is
# that much slower than the balanced one. Zig-zag: every rank computes the same number of pairs and
# blocks. The contiguous times grow with the blocks, but less than in proportion: every rank has
# its 2 diagonal blocks, and here a diagonal block costs more than a full one (the mask is built and
# applied; a fused kernel would skip the hidden half instead). Zig-zag's ranks have the same counts of
# both kinds, and the same time. Llama 3 and PyTorch's `context_parallel` balance this way
# (PyTorch calls it round-robin); striped attention (Brandon et al. 2023) interleaves single positions instead.
#
# ## 4. Memory per rank against sequence length
# `PeakMemory` (`distlab.measure.memory`; on the CPU it follows the live tensor storages) around the
# ring's forward on each rank, and around the same attention of the whole sequence on one process,
# written the same way (its `S x S` scores materialised, as `block_attention` does):

# %%
rows = runs[0]["memory"]
seqs = [row["seq"] for row in rows]
for row in rows:
    print(f"S = {row['seq']:>4}: whole sequence {row['whole_peak'] / 1024:8.1f} KiB, ring per rank "
          f"{row['ring_peak'] / 1024:7.1f} KiB  ({row['whole_peak'] / row['ring_peak']:.1f}x less)")
plt.figure(figsize=(5, 3.2))
plt.loglog(seqs, [r["whole_peak"] for r in rows], "o-", label="whole sequence, one process")
plt.loglog(seqs, [r["ring_peak"] for r in rows], "o-", label=f"ring, per rank (W = {W})")
plt.xlabel("sequence length S")
plt.ylabel("peak bytes")
plt.legend()
plt.show()
assert all(r["ring_peak"] < r["whole_peak"] for r in rows)
memory_guess.reveal(rows[-1]["whole_peak"] / rows[-1]["ring_peak"])

# %% [markdown]
# Both grow as `S^2` here, because each block's scores are materialised, but the ring's are
# `(S / W)^2` per step: `W^2` less for the scores, `W` less for `q`, `k`, `v` and the output. With a
# FlashAttention kernel per block (no scores stored) the ring's memory is `O(S / W)`: what lets a
# model read a million tokens on many GPUs.
#
# ## 5. Overlap: posted before the compute, measured here
# `ring_exchange` posts the next shard's send and receive *before* computing with the current one,
# so that on GPUs (NCCL on its own stream, NVLink) the transfer hides behind the block's compute.
# Measured: the ring's forward against the same blocks and merges with no communication at all.

# %%
for r, run in enumerate(runs):
    o = run["overlap"]
    print(f"rank {r}: ring {o['ring_s'] * 1e3:.2f} ms, its compute alone {o['compute_s'] * 1e3:.2f} ms "
          f"(communication not hidden: {max(o['ring_s'] - o['compute_s'], 0) * 1e3:.2f} ms)")

# %% [markdown]
# On a 2-core laptop the overlap cannot pay off: gloo copies each message through the loopback with
# the same cores that compute, 4 ranks share 2 cores, and the blocks are tiny, so the ring is slower
# than its compute by about the transfers themselves. On GPUs the same code overlaps, when a block's
# compute (`~4 (S/W)^2 D` FLOPs per head) takes longer than sending its `2 (S/W) D` values.
#
# ## 6. As practised: the all-gather variant, and the weights' gradients
# Llama 3 does not pass the keys and values round a ring (§3.3.2): every rank **all-gathers** `k` and `v`,
# attends its own queries to the whole sequence, and in the backward reduce-scatters `dk` and `dv`. Its
# reasons: with grouped-query attention `k` and `v` are a fraction of `q` (8 heads of 128 against 32 in Llama
# 3 8B), any mask works (documents packed in one sequence), and the gather is one collective a library
# tunes. PyTorch's `context_parallel` all-gathers by default too. The same cell ran both variants on the
# same shards (`distlab.lab.context_parallel.allgather`: `all_gather_single` forward,
# `reduce_scatter_single` backward, torch 2.13's names for `all_gather_into_tensor` and
# `reduce_scatter_tensor`; the ring forward only), and the weights that make `q`, `k`, `v` from
# each rank's positions, through the all-gather variant:

# %%
for name in ("ring", "all-gather"):
    v = runs[0]["variants"][name]
    backward = "backward: exercise 10" if v["backward_bytes"] is None else \
        f"{v['backward_bytes'] / 1024:.0f} KiB backward"
    print(f"{name:>10}: max diff from one process {v['max_diff']:.1e}; sends {v['forward_bytes'] / 1024:.0f} KiB "
          f"forward, {backward} ({', '.join(v['ops'])}); forward peak {v['peak'] / 1024:.1f} KiB")
for r, run in enumerate(runs):
    w = run["weights"]
    print(f"rank {r}: its weight gradient differs from one process's by {w['before']:.2f} (largest entry "
          f"{w['scale']:.2f}); summed over the {W} ranks, by {w['after']:.1e}")
assert all(run["variants"][n]["max_diff"] < 1e-5 for run in runs for n in ("ring", "all-gather"))
assert all(run["weights"]["after"] < 1e-4 for run in runs)

# %% [markdown]
# * **The same bytes forward**: a ring all-gather moves each rank's `(k, v)` to `W - 1` others, as the ring's
#   `W - 1` sends do. **Fewer backward**: the gather reduce-scatters `(dk, dv)` once, where the ring carries
#   `(k, v, dk, dv)` round and `(dk, dv)` home.
# * **More memory**: every rank holds the whole sequence's `k` and `v` at once (`W` shards, against the ring's
#   two), and no transfer hides behind a block's compute. With GQA's small `k, v` neither costs much, which is
#   why Llama 3 chose it; for `k, v` as large as `q` at very long sequences the ring is the one that fits.
# * **The weights' gradients are partial.** Outside attention every layer is the same on every rank of the
#   CP group, but each rank's backward sees only its positions: its gradient of the projection is a part of
#   the whole. Summed over the CP group (one all-reduce, as over a data-parallel group; torchtitan folds `cp`
#   into FSDP's mesh so that one reduce-scatter does both) it is one process's, to within float32's rounding.
#
# ## Exercise 10: the balanced causal ring by hand
# In `exercises/ex10_ring_attention.py` you write `ring_attention(q, k, v)`: the ring above, but
# **causal**, on the **zig-zag** layout of section 3: rank `r` holds chunk `r` then chunk `2W - 1 - r`
# (`c = S / 2W` positions each). Three things need thought. The mask is by *global* positions, so you
# need each shard's two chunks' places in the sequence. Against another rank's shard some pairs of
# chunks are wholly visible and some wholly hidden, depending on whether that rank is earlier or later
# than yours; only your own shard is cut by the diagonal. And what you merge must stay finite (a row
# that sees no key of a block has nothing to merge). The grader runs it on 2 and on 4 ranks, compares
# each rank's output with its rows of `F.scaled_dot_product_attention(is_causal=True)` on the whole
# sequence, counts your sends and receives (`W - 1` shards to one neighbour, from the other, no
# collective) and counts the scores each rank computes from its matrix products' shapes (FLOPs, by
# `FlopCounterMode`): the same on every rank, and nothing for a pair of chunks the mask hides entirely.
# The work section above stops at counting: which blocks to skip, and how to merge what is left into
# the right rows, is the exercise.
#
# Then `ring_attention_backward(q, k, v, out, lse, dout)`, the backward of the same ring, graded on
# its own (it is given the exact `out` and `lse`, so it does not depend on your forward). What it must
# compute, per block of keys of the shard in hand (FlashAttention-2's backward, Dao 2023), with
# `c = 1 / sqrt(D)`:
#
# $$P = \exp(c\, q k^\top - \ell) \text{ (0 where the key's global position is after the query's)},
# \qquad dV \mathrel{+}= P^\top dO, \qquad dS = P \circ (dO\, v^\top - \Delta),$$
# $$dQ \mathrel{+}= c\, dS\, k, \qquad dK \mathrel{+}= c\, dS^\top q, \qquad
# \Delta_i = \textstyle\sum_d dO_{id}\, O_{id} .$$
#
# $\ell$ is the *merged* lse of the whole row (so `P` is the softmax over the whole sequence, cut to
# the block), and $\Delta$ is one number per query from the *merged* output. `dQ` stays on its rank;
# a shard's `dK, dV` sum the contributions of the queries of other ranks, so they travel round the
# ring with that shard and take one hop more, home: `4 W - 2` shards' worth of bytes per rank. The
# grader compares `dq`, `dk`, `dv` with autograd through `F.scaled_dot_product_attention(is_causal=True)`
# on the whole sequence, in the same launches, and checks that every rank's backward did the same work.

# %%
from autograder import check

check(10, raise_on_fail=False)
