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
# # 01 · Data parallelism with DistributedDataParallel (DDP)
#
# Data parallelism trains **one model on W workers**:
#
# 1. **replicate** – every rank holds a full copy of the model, starting from the same weights;
# 2. **split the batch** – each rank takes a different slice of every global batch;
# 3. **all-reduce the gradients** – after backward, every rank's gradient is replaced by the
#    average over all ranks;
# 4. **step** – every rank applies the same update to the same weights, so the copies stay
#    **identical** without ever sending weights around.
#
# Because the mean of the ranks' mean gradients over equal-sized slices *is* the mean gradient
# over the whole batch, W ranks with local batch B compute the same step as one process with
# batch W·B. `torch.nn.parallel.DistributedDataParallel` does steps 1 and 3 for you: it
# broadcasts rank 0's weights when you wrap the model, and all-reduces gradients in *buckets*
# while backward is still running, so communication overlaps computation
# (Li et al., *PyTorch Distributed: Experiences on Accelerating Data Parallel Training*, VLDB 2020).
#
# > Older material uses `torch.nn.DataParallel` (one process, several threads, one GPU doing
# > the reduction: slower and single-machine only) and `python -m torch.distributed.launch`
# > (replaced by `torchrun`). Use DDP under `torchrun`.

# %%
# %load_ext distlab

# %% [markdown]
# ## Three experiments, one job
#
# Starting ranks costs seconds (notebook 00); the experiments below cost milliseconds to a second, so
# one job on two ranks runs all three, and the sections after it look at what each returned.
#
# 1. **Step 3 by hand.** Both ranks build the same model, each takes half of one batch of 64
#    digits, computes its gradient, and averages it with `all_reduce`. We then compute the
#    full-batch gradient in this notebook, in a single process, and compare.
# 2. **The real thing: DDP, with and without.** Both ranks train for 3 epochs, each seeding its
#    model **differently**, the way independent processes would: first side by side without
#    DDP, then with the model wrapped in DDP. A `DistributedSampler` gives each rank its own
#    shard of the 1,792 digits, and `set_epoch` reshuffles every epoch.
# 3. **What DDP saves.** One training step of a deeper MLP, its gradients averaged three ways: step 3's
#    loop (one all-reduce per tensor, after the backward), one all-reduce of every gradient
#    flattened into one tensor, and DDP; each way's collectives and its time per step.

# %%
# Predict before you run: type your guess in the box (or write it in place of guess=None).
from distlab.lab.predict import predict

allreduce_guess = predict(
    "bytes each rank all-reduces per step (every gradient of the MLP, float32)",
    unit="kB", guess=None)

# %%
# And for the third experiment: type your guess in the box (or write it in place of guess=None).
per_tensor_guess = predict("all-reduces per step when step 3's loop averages the gradients of an MLP of 12 hidden "
                           "Linear layers and its output layer (each a weight and a bias)", fmt=".0f", guess=None)

# %%
# %%torchrun -n 2 --result ranks
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

import distlab
from distlab.data import digits
from distlab.models import cpu_state, make_mlp

# on a GPU: sets cuda:LOCAL_RANK (not cuda:RANK) *before* init_process_group; see the section below
device = distlab.init_distributed()           # cuda:LOCAL_RANK under NCCL, the CPU under gloo
rank, world = dist.get_rank(), dist.get_world_size()
data = digits()
result = {}

# 1. Step 3 by hand
model = make_mlp(seed=0).to(device)           # same seed: identical replicas
x, y = (t.to(device) for t in data.tensors)
mine = slice(rank * 64 // world, (rank + 1) * 64 // world)   # this rank's half of samples 0..63
loss = torch.nn.functional.cross_entropy(model(x[mine]), y[mine])
loss.backward()
# a copy (.cpu() of a CPU tensor is the same tensor), since all_reduce below works in place
result["local"] = {n: p.grad.cpu().clone() for n, p in model.named_parameters()}
for p in model.parameters():
    dist.all_reduce(p.grad)                   # sum over ranks ...
    p.grad /= world                           # ... then average: what DDP does in backward
print(f"by hand: local loss {loss.item():.4f}; gradients averaged over {world} ranks")
result["averaged"] = {n: p.grad.cpu() for n, p in model.named_parameters()}

# 2. DDP, with and without
for use_ddp in (False, True):
    model = make_mlp(seed=100 + rank).to(device)   # a different start on every rank
    ids = [device.index] if device.type == "cuda" else None   # LOCAL_RANK's GPU; [rank] fails on node 2
    net = DDP(model, device_ids=ids) if use_ddp else model   # DDP broadcasts rank 0's weights here
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=32, sampler=sampler)
    opt = torch.optim.SGD(net.parameters(), lr=0.2)
    losses = []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            loss = torch.nn.functional.cross_entropy(net(xb.to(device)), yb.to(device))
            opt.zero_grad()
            loss.backward()                    # with DDP: gradients all-reduced here
            opt.step()
            losses.append(loss.item())
    if rank == 0:
        print(f"{'DDP' if use_ddp else 'no DDP'}: final loss on rank 0's batch {losses[-1]:.3f}")
    result["ddp" if use_ddp else "alone"] = {"state": cpu_state(model), "losses": losses}

# 3. What DDP saves: step 3's averaging per tensor, in one flat tensor, and DDP (distlab/lab/naive_ddp.py)
from distlab.lab.naive_ddp import naive_ddp_report

result["ways"] = naive_ddp_report(depth=12, hidden=256)
distlab.shutdown()

# %% [markdown]
# ## Step 3 by hand: all-reduce makes the half-batch gradients equal the full-batch gradient
#
# The full-batch gradient, computed here in a single process, against what rank 0 held before
# and after the all-reduce:

# %%
import torch

from distlab.data import digits
from distlab.models import make_mlp

model = make_mlp(seed=0)
x, y = digits().tensors
torch.nn.functional.cross_entropy(model(x[:64]), y[:64]).backward()
full = {n: p.grad for n, p in model.named_parameters()}

for name, g in full.items():
    before = (ranks[0]["local"][name] - g).abs().max().item()
    after = (ranks[0]["averaged"][name] - g).abs().max().item()
    print(f"{name:14s} rank 0 alone differs by {before:.2e}; after all-reduce by {after:.2e}")
assert any((ranks[0]["local"][n] - g).abs().max() > 1e-4 for n, g in full.items())  # half a batch is not the batch
torch.testing.assert_close(ranks[0]["averaged"], full)   # tolerance: the sums ran in another order
torch.testing.assert_close(ranks[0]["averaged"], ranks[1]["averaged"], rtol=0, atol=0)
print("averaged gradient == full-batch gradient, and identical on both ranks")

# %%
# the tensors the ranks passed to all_reduce above: what DDP all-reduces (in buckets) every step
allreduce_guess.reveal(sum(g.numel() * g.element_size() for g in ranks[0]["averaged"].values()) / 1e3)

# %% [markdown]
# Those bytes are one term of the course's one memory accounting (`distlab.lab.training_memory`,
# notebook 00): the gradients, 4 bytes a parameter in fp32. A DDP rank holds every term whole,
# whatever W is: replication is ZeRO's level `"none"`, and notebook 04 shards the terms instead.

# %%
from distlab.lab.training_memory import training_memory

n_params = sum(g.numel() for g in ranks[0]["averaged"].values())
for world in (1, 2, 8):
    held = training_memory(n_params, precision="fp32", optimizer="sgd", world=world, level="none")
    print(f"W = {world}: each rank holds {held['params'] / 1e3:.1f} kB of weights and {held['grads'] / 1e3:.1f} kB "
          f"of gradients (plain SGD keeps no state): {held['total'] / 1e3:.1f} kB")
assert training_memory(n_params, optimizer="sgd")["grads"] == sum(
    g.numel() * g.element_size() for g in ranks[0]["averaged"].values())

# %% [markdown]
# ## The real thing: DDP, with and without
#
# The weights each rank ended with, without DDP and with it, and the losses of the DDP run:

# %%
import matplotlib.pyplot as plt

for key, label in [("alone", "without DDP"), ("ddp", "with DDP")]:
    a, b = ranks[0][key]["state"], ranks[1][key]["state"]
    gap = max((a[k] - b[k]).abs().max().item() for k in a)
    print(f"{label:12s}: largest weight difference between rank 0 and rank 1 = {gap:.3g}")
assert all(torch.equal(ranks[0]["ddp"]["state"][k], ranks[1]["ddp"]["state"][k]) for k in ranks[0]["ddp"]["state"])

fig, ax = plt.subplots(figsize=(7, 3))
for rank in (0, 1):
    ax.plot(ranks[rank]["ddp"]["losses"], label=f"rank {rank} with DDP", alpha=0.8)
ax.set_xlabel("step")
ax.set_ylabel("loss on the rank's local batch")
ax.set_title("Each rank sees different data, yet holds the same weights")
ax.legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# With DDP the two ranks end **bit-identical**: they start from rank 0's broadcast weights and
# apply the same averaged gradient every step. Without it they are two unrelated models. The
# loss curves differ because each rank's loss is measured on its own shard.
#
# ## What DDP saves: one all-reduce per tensor, after the backward
#
# Step 3's loop is correct, and it is how DDP's ancestors worked. It pays twice (Li et al., 2020, sec.
# 3.2): every collective has a fixed cost (its latency, its launch), paid once per tensor; and all the
# communication waits for the end of the backward, when nothing is left to compute while it runs.
# Flattening every gradient into one tensor pays the fixed cost once, and still waits. DDP groups the
# gradients into **buckets** of about `bucket_cap_mb`, in the reverse order of the parameters (the
# order the backward produces their gradients), and starts each bucket's all-reduce, without waiting
# for it, as soon as its last gradient is ready: **inside** the backward. The third experiment
# measured the three ways on an MLP of 12 hidden layers of 256, with `bucket_cap_mb=0.25` for DDP.

# %%
ways = ranks[0]["ways"]
for way, got in ways["ways"].items():
    print(f"{way:16s} {got['collectives']}, {got['bytes'] / 1e6:.2f} MB per step, "
          f"{got['seconds'] * 1e3:6.1f} ms per step; gradients differ from DDP's by {got['grad_diff']:.1g}")
fig, ax = plt.subplots(figsize=(6, 2.2))
ax.barh(list(ways["ways"]), [w["seconds"] * 1e3 for w in ways["ways"].values()])
ax.set_xlabel("ms per training step (median, slowest rank)")
plt.tight_layout()
plt.show()
per_tensor_guess.reveal(ways["ways"]["per tensor"]["collectives"]["all-reduce"])
assert ways["ways"]["per tensor"]["collectives"] == {"all-reduce": ways["tensors"]}
assert ways["ways"]["one flat tensor"]["collectives"] == {"all-reduce": 1}
assert 1 < ways["ways"]["DDP"]["collectives"]["all-reduce"] < ways["tensors"]   # buckets
assert all(w["grad_diff"] < 1e-6 for w in ways["ways"].values())

# %% [markdown]
# The three ways move the same bytes and give the same gradients; what differs is how many
# collectives carry them and when they start. The per-tensor loop pays the fixed cost most often.
# Whether DDP's overlap then beats one flat all-reduce depends on the machine: overlap needs the
# communication to run *beside* the computation. On GPUs it does (NCCL's kernels on their own stream,
# the network card moving the bytes), and the buckets sent during the backward come almost for free.
# Between CPU processes, gloo's threads copy the bytes on the same cores that compute the backward, so
# there is little to overlap, and every extra bucket costs its fixed price: the figures above are this
# machine's. Part 2 of exercise 1 builds DDP's way by hand.
#
# ## Two GPU mistakes the code above avoids
#
# Many DDP examples contain two mistakes that work on one machine, or on this CPU, and fail on
# a cluster. The code above gets both right through `distlab.init_distributed()`
# (`distlab/runtime/distributed.py`), so here they are by name:
#
# * **The global rank used as the GPU index**: `model.to(rank)`, `DDP(model, device_ids=[rank])`,
#   `torch.cuda.set_device(rank)`. On one machine the global rank and the rank on the machine
#   coincide. On the second node of a job with 4 GPUs per node the ranks are 4 to 7 while the
#   node's GPUs are `cuda:0` to `cuda:3`: `cuda:4` does not exist ("invalid device ordinal").
#   The GPU index is **`LOCAL_RANK`**, which torchrun sets on each machine (notebook 06 shows
#   `RANK` and `LOCAL_RANK` side by side). `distlab.device()` returns `cuda:LOCAL_RANK`, and the
#   cell above passes `device_ids=[device.index]`.
# * **`torch.cuda.set_device` called after `init_process_group`.** Until it is called, every
#   process's current GPU is `cuda:0`: whatever the process group does on the GPU before then
#   (a `barrier()`, the creation of NCCL communicators) lands there, so every rank of the node
#   puts a CUDA context on GPU 0 (memory lost there) and a collective can hang on the wrong
#   device (the PyTorch DDP tutorials warn of both). Call `torch.cuda.set_device(local_rank)`
#   **before** `init_process_group`, or pass `device_id=torch.device("cuda", local_rank)` to it,
#   which also binds the group to that GPU; `init_distributed` does both.
#
# ## Exercise 1: from one process to DDP
#
# Open **`exercises/ex01_ddp.py`**. It contains `train_single`, a working single-process loop,
# and five stubs: `setup`, `train_ddp`, `evaluate_ddp`, `BucketedDDP` and `teardown`. Their
# docstrings are the contract. In short: join the process group, shard the data with a `DistributedSampler` (and
# `set_epoch`), wrap the model in DDP, log and save on rank 0 only, evaluate a model over a data
# set with all the ranks, and leave the process group at the end.
#
# **Before you write `evaluate_ddp`, think.** The digits above split evenly over the ranks; most
# data sets do not. A `DistributedSampler` still hands every rank the same number of samples
# (`len(sampler)` is `ceil(n / W)`): with its default `drop_last=False` it makes up the
# difference from the data set itself. Try `list(DistributedSampler(range(10), num_replicas=4,
# rank=r, shuffle=False))` for each `r`: which samples would a metric see twice? Training barely
# notices a repeated sample; a reported accuracy should not count one. And each rank's number is
# only its shard's.
#
# The grader runs your code with torchrun at **2 and 4 ranks** and checks, against a
# single-process reference trained on the same global batches:
#
# * the weights are identical on every rank (each rank starts from a *different* seed, so a
#   missing broadcast shows);
# * each rank read a disjoint shard, together covering the data, reshuffled every epoch;
# * the weights match the single-process reference (`torch.testing.assert_close`);
# * only rank 0 printed, and rank 0 alone saved the unwrapped model; teardown destroys the group;
# * `evaluate_ddp` over 21 samples (which neither 2 nor 4 divides) returns, on every rank, the
#   loss and accuracy one process computes over the 21, each rank reading only its shard.
#
# **Part 2: `BucketedDDP`, DDP by hand.** The measurement above stopped at the two naive ways. Now
# write DDP's: broadcast rank 0's weights; group the parameters into buckets of `bucket_cap_mb` in
# the reverse of their registration order; on each parameter, a `register_post_accumulate_grad_hook`
# that starts the bucket's asynchronous all-reduce when its last gradient is ready; and a
# `finish_gradient_synchronization()` that waits for them and leaves the mean in every `.grad`. Before
# you write it, answer: a parameter the forward did not use gets no gradient, so its hook never runs.
# What happens to the other parameters of its bucket? The grader trains your class at four caps,
# compares it with one process, counts the all-reduces and the elements each moves, and reads the
# order of events (each gradient ready, each all-reduce started), not the clock, to see the overlap.
#
# Run the cell below after each change (`check(1)`), or from a shell in the repository's root:
# `make grade` grades every exercise, `.venv/bin/python -m autograder grade --exercise 1` this one.
# Until you fill the stubs in, it reports "not implemented yet".

# %%
from autograder import check

report = check(1, raise_on_fail=False)
