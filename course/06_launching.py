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
# # 06 · Launching: torchrun, many machines, failures, and how well it scales
#
# Every notebook so far started its ranks with `distlab.torchrun`, a thin wrapper around
# PyTorch's launcher `torchrun` (`python -m torch.distributed.run`): it calls torchrun's own
# engine with the arguments of `torchrun --standalone --nproc-per-node=N`, from a server process
# that imported torch once, so that each rank is a fork of it (`--start-method=fork`) instead of
# a new interpreter importing torch again. For a script, the CLI line is all you need. This notebook looks at the
# launcher itself: what it gives each worker, how several machines form one job, what happens
# when a worker dies, how to run on a Slurm cluster, and finally how to measure whether adding
# workers pays off (exercise 6).
#
# ## What torchrun sets
# `torchrun --nproc-per-node=2 train.py` starts 2 workers and gives each its place in the job
# through environment variables, which `init_process_group()` reads:
#
# | variable | meaning |
# |---|---|
# | `RANK` | global rank, 0 … WORLD_SIZE-1 |
# | `LOCAL_RANK` | rank on this machine: which GPU to use |
# | `WORLD_SIZE` | workers in the whole job |
# | `LOCAL_WORLD_SIZE` | workers on this machine |
# | `GROUP_RANK` | which machine (node) this is, 0 … nnodes-1 |
# | `MASTER_ADDR`, `MASTER_PORT` | where the process group's store listens |
# | `TORCHELASTIC_RESTART_COUNT` | how many times the workers were restarted |
#
# The GPU index is `LOCAL_RANK`, never `RANK`: on the second machine the global ranks start
# where the first machine's ended, and `.to(rank)` or `device_ids=[rank]` asks for a GPU that
# does not exist (notebook 01 names this mistake and the order of `set_device`).
#
# Here they are, from a live run of 2 workers on this machine, started the way two *machines*
# would start them (more on that below): two torchrun agents, one worker each. Each worker also
# joins the process group and all-reduces its rank, on its own device (the GPU under NCCL), to
# prove both are in one world. Starting a job costs seconds, so the same job then measures what
# the scaling section at the end of this notebook needs (`probe=`: compute, a DDP step and
# all-reduce bandwidth on these 2 workers; more on it there).

# %%
import matplotlib.pyplot as plt

from distlab.lab.launching import spawn_demo
from distlab.runtime.multinode import ENV_VARS, command_lines, multinode_torchrun


def env_table(results: list[dict], keys=ENV_VARS[:8]) -> None:
    print(" ".join(f"{k:>16}" for k in keys))
    for r in results:
        print(" ".join(f"{r[k]:>16}" for k in keys))


HIDDEN, BATCH = 1024, 32   # the scaling section's MLP: 2.2 M parameters, 8.7 MB of gradients, little compute per sample
multi = multinode_torchrun("distlab.lab.launching:whoami", nnodes=2, nproc_per_node=1, timeout=90,
                           kwargs=dict(probe=dict(hidden=HIDDEN, batch=BATCH)))
env_table(multi.results)
print(f"an all-reduce of the ranks gave {multi.results[0]['rank_sum']} on every rank: one world of "
      f"{multi.results[0]['world']} ({multi.backend}, devices {[r['device'] for r in multi.results]})")
assert [r["RANK"] for r in multi.results] == ["0", "1"] and multi.results[0]["rank_sum"] == 1

# %% [markdown]
# ## `mp.spawn` against torchrun
# Older tutorials start workers with `torch.multiprocessing.spawn(fn, nprocs=N)`: the
# notebook's own process starts the workers as fresh interpreters (start method `spawn`, so
# the function must be importable, not defined in the notebook), so *you* choose `MASTER_ADDR`/`MASTER_PORT`, pass
# the rank as an argument, set `WORLD_SIZE`, and handle a hung or crashed worker yourself.
# It works on one machine:

# %%
for line in spawn_demo(2):
    print(line[:120])

# %% [markdown]
# Notice that none of torchrun's variables are set: the function got its rank as an argument.
# **torchrun is recommended** because it does all of that for you, the same way on one machine
# and on many: it picks the ranks at a *rendezvous*, sets the environment, watches the workers,
# tears the whole group down when one fails, and can restart them (*elastic* training). The
# training script stays a plain script with no launcher code in it.
#
# **Rendezvous backends.** `c10d` (`--rdzv-backend=c10d`; also what `--standalone` uses, on
# `localhost:0`; without either, torchrun uses `static` with `MASTER_ADDR`/`MASTER_PORT`) hosts a TCP store in one of the torchrun agents: nothing
# to install. `etcd`/`etcd-v2` use an external etcd server (older deployments). Without a
# rendezvous backend, the *static* form `--nnodes=2 --node-rank=K --master-addr=… --master-port=…`
# makes you number the machines yourself.
#
# ## Two machines, on one machine
# On a cluster every machine runs one torchrun agent with the **same** command; the agents meet
# at the rendezvous endpoint (the first machine's address) and agree on the world. The table at
# the top came from exactly that: two agents on this machine, the endpoint on `127.0.0.1` and a
# free port. `GROUP_RANK` is the node (agent) number, `LOCAL_RANK`/`LOCAL_WORLD_SIZE` the
# worker's place on its node, `RANK`/`WORLD_SIZE` its place in the whole job. The command each
# agent ran, as used here (the port was free when the job started), then for two real machines
# whose first one is `10.0.0.1` with 4 GPUs each (run it on both; torchrun decides which one is
# node 0):

# %%
print(" ".join(multi.commands[0]), f"   # endpoint used here: {multi.endpoint}")
print(" ".join(command_lines(2, 4, "10.0.0.1:29400", "myjob", ["train.py"])[0]))

# %% [markdown]
# ## When a worker dies: elastic restarts
# With `--max-restarts=K`, when a worker fails torchrun stops **all** workers of the group (the
# others were waiting in a collective for the dead one and would hang until their timeout) and
# starts them all again, up to K times. The new processes rejoin a fresh process group
# (`TORCHELASTIC_RESTART_COUNT` tells them which attempt this is) and must resume from their
# last checkpoint (notebook 05). Below, rank 1 crashes in attempt 0:

# %%
from distlab import torchrun

restart = torchrun("distlab.lab.launching:flaky_worker", 2, max_restarts=1, timeout=90)
for line in restart.lines:
    if "attempt" in line:
        print(line)
print("returned:", restart.results)
assert [r["attempt"] for r in restart.results] == [1, 1]

# %% [markdown]
# Both ranks came back as new processes in attempt 1, rank 0 too although it had not failed.
# Without restarts (`--max-restarts=0`, the default) torchrun ends the surviving workers and
# exits with an error; `distlab.torchrun` then raises `RankFailure` naming the rank that failed
# first. On several machines an agent that loses its workers triggers a new rendezvous among
# all agents.
#
# ## On a Slurm cluster
# `course/slurm/train.sbatch` is a ready batch script: one task (one torchrun agent) per node,
# GPUs-per-node workers each, rendezvous on the allocation's first node, a port derived from
# the job id. The task's CPUs are shared by its workers: each gets `OMP_NUM_THREADS` = CPUs per
# task ÷ workers per node (16 CPUs and 4 workers: 4 threads each; 16 each would put 64 threads
# on 16 CPUs), and `srun` is given `--cpus-per-task` explicitly. Submit it with
# `sbatch course/slurm/train.sbatch train.py --your-args`.

# %%
from distlab.runtime.launch import REPO_ROOT

print((REPO_ROOT / "course" / "slurm" / "train.sbatch").read_text().split("set -euo pipefail")[1].strip())

# %% [markdown]
# ## How well does it scale? (exercise 6)
# With W workers, data parallelism does W times the work per step, plus an all-reduce of the
# gradients. A simple model of one step, with the all-reduce in the α-β model of notebook 00b
# (Thakur, Rabenseifner & Gropp, 2005; `distlab.lab.bandwidth.allreduce_time` there, here and in
# notebook 09): a ring takes 2(W−1) steps, each paying a latency α, and each link
# carries 2(W−1)/W of the bytes at β seconds a byte:
#
# $$t_\text{step}(W) = t_\text{compute} + \underbrace{2(W-1)\,\alpha + \frac{2(W-1)}{W}\cdot\text{bytes}\cdot\beta}_{\text{ring all-reduce}}\qquad \text{efficiency}(W) = \frac{t_\text{step}(1)}{t_\text{step}(W)}$$
#
# The latency grows with W: fitted at W = 2 (2α), it is 7 times that at W = 8 (14α).
# `busbw` = 1/β is the *bus bandwidth* as nccl-tests defines it (`bytes × 2(n-1)/n / time`), measured
# below on this machine. DDP overlaps the all-reduce with the backward, so the model is
# pessimistic where communication is small; it is honest about one more thing: on a CPU, W
# workers share the machine's cores.
#
# **This machine.** Workers here are processes on the CPU cores, gloo moves gradients through
# shared memory and loopback TCP, and more workers than cores are *oversubscribed*: they take
# turns on the cores, so their step time grows for reasons that have nothing to do with
# communication. A CPU can show the method and the shape of the model; it cannot show the
# efficiency of GPUs on NVLink or InfiniBand. Below: one worker timed here, two workers measured
# in one job, the one at the top of this notebook (compute alone, a DDP step, and all-reduces of
# 4 KiB up to the gradients' size to fit α and β; two agents of one worker each
# on one machine are the same two processes as one agent of two), and the model's prediction from
# those inputs up to 8 workers.

# %%
# Predict before you run: type your guess in the box (or write it in place of guess=None).
from distlab.lab.predict import predict

efficiency_guess = predict(
    "scaling efficiency t_step(1) / t_step(2) that 2 workers measured on this machine",
    fmt=".2f", guess=None)

# %%
import torch
from torch import nn

from distlab.lab.bandwidth import allreduce_time, predicted_efficiency
from distlab.models import make_mlp
from distlab.measure.timing import cpu_cores, median_seconds

cores = cpu_cores()
torch.set_num_threads(1)   # like each torchrun worker (OMP_NUM_THREADS=1)
model = make_mlp(seed=0, hidden=HIDDEN, depth=3)   # the model the 2 workers measured (top of the notebook)
x, y = torch.randn(BATCH, 64), torch.randint(0, 10, (BATCH,))
opt = torch.optim.SGD(model.parameters(), lr=0.01)


def local_step():
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()


t1 = median_seconds(local_step)   # warm-up, then the median per call (torch.utils.benchmark)
p = multi.results[0]["probe"]     # the 2 workers' figures (every rank returned the same)
print(f"2 workers measured at the top ({'one core each' if cores >= 2 else 'oversubscribed'} on {cores} cores)")

# %%
print(f"one worker: {t1 * 1e3:.1f} ms per step; gradients {p['grad_bytes'] / 1e6:.1f} MB; "
      f"fitted: busbw {p['busbw'] / 1e9:.2f} GB/s, α {p['alpha_s'] * 1e6:.0f} us a ring step")
print(f"{'W':>2} {'all-reduce ms':>14} {'compute ms':>11} {'step ms':>8} {'predicted eff':>14} {'measured eff':>13}")
comm = allreduce_time(p["grad_bytes"], 2, p["busbw"], p["alpha_s"])
slowdown = p["compute_s"] / t1     # compute on 2 workers at once, measured: includes sharing cores
measured = t1 / p["step_s"]
print(f"{2:>2} {comm * 1e3:>14.1f} {p['compute_s'] * 1e3:>11.1f} {p['step_s'] * 1e3:>8.1f} "
      f"{predicted_efficiency(t1, p['grad_bytes'], 2, p['busbw'], p['alpha_s'], slowdown=slowdown):>14.0%} "
      f"{measured:>13.0%}")

ws = [1, 2, 3, 4, 6, 8]
fig, ax = plt.subplots(figsize=(5.5, 3.2))
ax.plot(ws, [predicted_efficiency(t1, p["grad_bytes"], w, p["busbw"], p["alpha_s"]) for w in ws], "o--",
        label="model: one core per worker, this α and busbw")
ax.plot([1, 2], [1.0, measured], "s-", label="measured here")
ax.axhline(1.0, color="gray", lw=0.8)
ax.axvline(cores, color="red", lw=0.8, ls=":", label=f"{cores} cores")
ax.set(xlabel="workers W", ylabel="efficiency", xticks=ws, ylim=(0, 1.1), title="DDP scaling")
ax.legend(fontsize=8)
plt.show()

# %%
efficiency_guess.reveal(measured)

# %% [markdown]
# Read the table from left to right: the all-reduce time follows from the measured bus
# bandwidth; the compute column shows what sharing cores costs (at W > cores it alone breaks
# linear scaling, which the dashed model line leaves out: it assumes a core per worker, as on
# a GPU per worker); the measured step is usually a little *below* compute + all-reduce,
# because DDP overlaps the all-reduce with the backward. Where prediction and measurement disagree,
# something the model leaves out dominates — find it before trusting a scaling figure.
#
# ### Exercise 6: measure it yourself, then predict
# In `exercises/ex06_scaling.py` you write the measurement: throughput counting every rank's
# samples, warm-up excluded, the window bracketed by barriers (and `torch.cuda.synchronize()` on
# GPUs). The grader first runs your `measure_throughput` on a synthetic step whose duration it
# controls, at 1, 2 and 4 workers, and checks your figure against the window your own clock reads
# span (it brackets each of them with its clock, so a busy machine cannot fail a correct method),
# then runs your benchmark on the real model and shows you the figures.
#
# Then the model above, in two parts this notebook leaves to you. The fit here used one world
# size; a real campaign measures all-reduces at several (2 and 4 workers here, some sizes at some
# of them only), and each measurement is one equation in the same α and β: fit them all at once
# (`fit_alpha_beta`). And the table's model adds the whole all-reduce to the step, where DDP
# runs it *during* the backward: `predict_efficiency` predicts the efficiency at a W you never
# ran when the backward hides what it can of the all-reduce. Before you write it, ask which
# of the two terms decides at W = 64 with small gradients, and which at W = 8 with large ones.
# `run_scaling()` in your file then fits the all-reduces it timed at 2 and 4 workers, predicts
# the efficiency at 8, and writes `scaling.json` and `scaling.png` (measured and predicted).

# %%
from autograder import check

report = check(6, raise_on_fail=False)
