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
# # 09 · Communication made visible
#
# Earlier notebooks made three claims about communication and never showed them:
#
# * DDP all-reduces the gradients **in buckets, while backward still computes** (notebook 01;
#   Li et al., *PyTorch Distributed*, VLDB 2020);
# * FSDP moves **1.5x DDP's bytes** (notebook 04; Rajbhandari et al., *ZeRO*, SC'20);
# * scaling is **lost to communication** (notebook 06).
#
# Here they are measured on 2 ranks: a profiler trace of DDP's steps, the bytes of every
# collective counted, the FLOPs of a step counted and set against the machine's peak. The last
# part makes jobs hang on purpose and uses the real tools that say why.
#
# The code is the same on GPUs with NCCL; the figures are this machine's (2 ranks on CPU cores
# with gloo), and where a CPU differs from a GPU the text says how.
#
# ## One job, every measurement
# Starting ranks costs seconds, so one job of 2 ranks runs every measurement of the first three
# parts (`distlab.lab.comm_job.communication`), and the cells after it look at what came back:
#
# 1. DDP trained for a few steps under `torch.profiler` in six configurations (bucket sizes,
#    `gradient_as_bucket_view`, `static_graph`), each rank writing a trace;
# 2. one training step under DDP and under FSDP, every collective counted;
# 3. an all-reduce against a reduce-scatter plus an all-gather, and all-reduce bandwidth from
#    4 KiB to 16 MiB;
# 4. exercise 6's workload at W = 1 and 2, with its FLOPs and the machine's matmul peak.

# %%
import matplotlib.pyplot as plt
import numpy as np

from distlab import torchrun
from distlab.runtime.launch import REPO_ROOT
from distlab.measure.profiling import Span, gantt

TRACES = REPO_ROOT / "runs" / "09_communication"   # runs/ is git-ignored; JupyterLab shows it
TRACES.mkdir(parents=True, exist_ok=True)
print("measuring DDP, FSDP, collectives and MFU on 2 ranks ...", flush=True)
job = torchrun("distlab.lab.comm_job:communication", 2, args=(str(TRACES),), timeout=240, stream=True)
R = job.results   # R[rank]: that rank's figures
print(f"done in {job.wall_s:.0f} s on {job.backend}; seconds per part: "
      + ", ".join(f"{k} {v:.1f}" for k, v in R[0]["seconds"].items()))

# %% [markdown]
# ## 1. DDP's buckets, seen in a trace
# Each configuration ran two steps untimed (the first one uses a single bucket; DDP rebuilds its
# buckets at the second, in the order it saw gradients become ready), then
# `distlab.measure.profiling.profile_steps`: `torch.profiler.profile` with a schedule, one warm-up step
# and one recorded step, written with `export_chrome_trace` (one step keeps the file small).
# The model is a residual MLP of 8.4 M parameters (34 MB of fp32 gradients), batch 64 per rank.
# The recipe:

# %%
import inspect

from distlab.measure import profiling

print(inspect.getsource(profiling.profile_steps))
for r in range(2):
    path = TRACES / f"ddp_rank{r}.json"
    print(f"rank {r}'s trace (DDP defaults, 1 step): {path.relative_to(REPO_ROOT)}, {path.stat().st_size / 1e3:.0f} kB")

# %% [markdown]
# **Open a trace**: download `runs/09_communication/ddp_rank0.json` and drop it on
# <https://ui.perfetto.dev> (or `chrome://tracing`). The main thread shows `ProfilerStep#`,
# `DistributedDataParallel.forward` and one `autograd::engine::evaluate_function` per backward
# operation; gloo's own threads show `gloo:all_reduce`, one per bucket. On a GPU the all-reduce
# is an `ncclDevKernel_AllReduce...` kernel on NCCL's stream, beside the compute stream.
#
# `distlab.measure.profiling.trace_spans` reads the same file back: compute is every operator on the
# thread that runs the step (coloured by phase: forward, backward, DDP copying reduced buckets
# into `.grad`, optimizer), communication is each `gloo:all_reduce` (on a GPU: the NCCL
# kernels). Below, the recorded step of three configurations, each rank on its own clock.
# The **overlap fraction** is the communication time that compute hides, over all communication:
#
# $$\text{overlap} = \frac{|\,\text{comm} \cap \text{compute}\,|}{|\,\text{comm}\,|}$$

# %%
def config(rank: int, label: str) -> dict:
    return next(c for c in R[rank]["ddp"] if c["label"] == label)


def spans(rank: int, label: str) -> list[Span]:
    return [Span(*s) for s in config(rank, label)["spans"]]


SWEEP = ["1 MB", "25 MB", "default (25 MB, first 1 MB)", "100 MB (one bucket)"]
shown = [SWEEP[0], SWEEP[2], SWEEP[3]]
fig, axes = plt.subplots(len(shown), 1, figsize=(10, 2.3 * len(shown)))
for ax, label in zip(axes, shown):
    first_step = max(config(r, label)["steps"][0][1] for r in range(2))
    overlap = " / ".join(f"{config(r, label)['overlap']:.0%}" for r in range(2))
    gantt(ax, [spans(r, label) for r in range(2)], until=first_step,
          title=f"bucket_cap_mb {label}: {len(config(0, label)['buckets'][-1])} bucket(s), "
                f"overlap {overlap} (rank 0 / 1)")
fig.tight_layout()
plt.show()

# %% [markdown]
# Read the comm rows against the backward (orange). With **one bucket** nothing can start until
# backward has produced the last gradient: the all-reduce follows the backward and overlaps
# nothing. With **1 MB** buckets (one per weight matrix here: a bucket closes once it holds at
# least its cap, and a parameter is never split) the first all-reduce starts after the first
# backward operation and the buckets run while backward continues. **DDP's default** sits
# between: its first bucket (the last layers' gradients, ready first) is capped at 1 MiB
# (`dist._DEFAULT_FIRST_BUCKET_BYTES`), the rest at 25 MiB, so here it has two buckets. Passing
# `bucket_cap_mb=25` explicitly is *not* the default: it drops the small first bucket, and the
# one big bucket is ready only at the end of backward.

# %%
pairs = [[config(r, label) for r in range(2)] for label in SWEEP]
step_ms = [max(c["step_s"] for c in p) * 1e3 for p in pairs]
overlap = [np.mean([c["overlap"] for c in p]) for p in pairs]
fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3))
names = ["1", "25", "default", "100 (one)"]
a1.bar(names, step_ms, color="#4c72b0")
a1.set(xlabel="bucket_cap_mb", ylabel="step time (ms, slower rank)", title="step time")
a2.bar(names, overlap, color="#c44e52")
a2.set(xlabel="bucket_cap_mb", ylabel="overlap fraction", ylim=(0, 1), title="communication hidden under compute")
fig.tight_layout()
plt.show()
print(f"{'bucket_cap_mb':>28} {'buckets (MB)':>26} {'step':>7} {'backward':>9} {'comm':>7} {'overlap':>8} "
      f"{'exposed':>8}")
for label, p in zip(SWEEP, pairs):
    c = p[0]
    sizes = ", ".join(f"{b / 1e6:.1f}" for b in c["buckets"][-1])
    print(f"{label:>28} {sizes:>26} {max(x['step_s'] for x in p) * 1e3:5.0f}ms {c['backward_s'] * 1e3:7.0f}ms "
          f"{c['comm_s'] * 1e3:5.0f}ms {c['overlap']:>8.0%} {c['comm_s'] * (1 - c['overlap']) * 1e3:6.0f}ms")

# %% [markdown]
# (The table is rank 0's; *exposed* = comm x (1 − overlap), the communication nothing hid.)
#
# **What this CPU shows, and what it cannot.** The overlap fraction follows the bucket size as
# the paper says: small buckets hide most of the all-reduce, one bucket hides none. The step
# time does not follow it here. On a CPU the all-reduce is *work for the same cores*: gloo sums
# and copies the buckets on CPU threads while backward computes on the same two cores (and two
# ranks already fill them), so hidden communication slows the backward beside it (compare the
# backward column). On a GPU, NCCL runs on the GPU's own links and a few of its SMs while the
# compute kernels run, so hidden communication is close to free; that is where small buckets
# buy step time, until the per-message latency of too many buckets eats it. The trace is how
# you find out which case you are in.
#
# ### `gradient_as_bucket_view` and `static_graph`
# * `gradient_as_bucket_view=True` makes every `.grad` a view into its bucket. Without it DDP
#   keeps the gradients twice (the `.grad` tensors and the buckets) and copies each reduced
#   bucket back into `.grad` (the purple `bucket copy` in the Gantt).
# * `static_graph=True` promises that every step uses the same parameters in the same order. DDP
#   then records the first iteration and rebuilds its buckets one iteration later; it also
#   supports what a dynamic graph cannot (reentrant activation checkpointing, parameters unused
#   in a static way) without `find_unused_parameters=True`'s graph traversal every step.

# %%
print(f"{'configuration':>34} {'grads outside buckets':>22} {'bucket copy/step':>17} {'step':>7}  "
      "buckets per iteration")
for label in ["default (25 MB, first 1 MB)", "default + gradient_as_bucket_view", "default + static_graph"]:
    c = config(0, label)
    step = max(config(r, label)["step_s"] for r in range(2))
    print(f"{label:>34} {c['grad_copy_bytes'] / 1e6:>19.1f} MB {c['bucket_copy_s'] * 1e3:>14.1f} ms "
          f"{step * 1e3:5.0f}ms  {[len(b) for b in c['buckets']]}")

# %% [markdown]
# Measured: the view saves one full copy of the gradients (34 MB here; the `.grad` storages
# *are* the buckets) and the copy-back time; `static_graph` shows its bucket rebuild one
# iteration later, and no step-time difference on this model, whose graph is the same every
# step anyway. Step times move by more than these savings from run to run on a shared
# 2-core machine, so read the memory and the copy time, not the step time, for these two.
#
# ## 2. What collectives cost
# ### An all-reduce is a reduce-scatter then an all-gather
# The ring all-reduce (Patarasuk & Yuan, 2009) is two halves: a **reduce-scatter** leaves each of
# the n ranks the sum of one n-th of the tensor, an **all-gather** gives every rank every sum.
# Each half sends (n−1)/n of the tensor per rank, hence the all-reduce's 2(n−1)/n (nccl-tests'
# bus bandwidth factor). Run both ways on the same 8 MB (small integers, so every order of
# summation gives the same floats):

# %%
ra = R[0]["rs_ag"]
print(f"all-reduce == reduce-scatter + all-gather, bit for bit: {all(r['rs_ag']['equal'] for r in R)}")
print(f"{ra['bytes'] / 2**20:.0f} MiB on {job.backend}: all-reduce {ra['allreduce_s'] * 1e3:.2f} ms; "
      f"reduce-scatter {ra['reduce_scatter_s'] * 1e3:.2f} ms + all-gather {ra['allgather_s'] * 1e3:.2f} ms "
      f"= {(ra['reduce_scatter_s'] + ra['allgather_s']) * 1e3:.2f} ms")

# %% [markdown]
# The results are equal; the times are the backend's. NCCL's *ring* all-reduce is these two
# phases in one kernel, but NCCL picks its algorithm per call (Ring, Tree, and on hardware that
# has them NVLS and CollNet, which reduce in the switch), and two separate calls pay the
# latency and the launch twice, so the halves add up to the whole only for large messages on a
# ring. gloo's all-reduce is its own algorithm, and its reduce-scatter is not the cheaper half
# of it: on this machine the two calls together cost more than one all-reduce. The ZeRO accounting below counts bytes,
# which are the same either way.
#
# ### Bus bandwidth against message size
# Time per all-reduce of S bytes on n ranks in the α-β model of notebook 00b (Thakur, Rabenseifner
# & Gropp, 2005; `distlab.lab.bandwidth.allreduce_time`, the same function there and in notebook 06): a ring takes 2(n−1) steps, each paying a latency α, and each link carries 2(n−1)/n · S
# bytes at β seconds a byte: $t(S) = 2(n-1)\,\alpha + \frac{2(n-1)}{n}\,S\,\beta$. A latency
# measured at n = 2 (2α) is 7 times larger at n = 8 (14α), so fit α, not "the latency". Fitted
# by least squares of the relative errors (`distlab.lab.bandwidth.fit_latency_bandwidth`, which
# returns α and the bus bandwidth 1/β; in seconds, the largest messages would decide it alone)
# and drawn over the measured points as the bus bandwidth it implies,
# $\text{busbw}(S) = \frac{2(n-1)}{n}\, S / t(S)$.

# %%
# Predict before you run: type your guess in the box (or write it in place of guess=None).
from distlab.lab.predict import predict

allreduce_guess = predict(
    "time of one all-reduce of 8 MiB on 4 ranks, by the α-β model with the α and bus bandwidth the "
    "next cell fits on 2 ranks",
    unit="ms", guess=None)

# %%
from distlab.lab.bandwidth import allreduce_time, bus_factor

rows, (alpha, busbw) = R[0]["bandwidth"], R[0]["fit"]
sizes = np.array([r["bytes"] for r in rows], dtype=float)
grid = np.logspace(np.log10(sizes[0]), np.log10(sizes[-1]), 100)
model_s = allreduce_time(grid, 2, busbw, alpha)   # 2(n-1)α + 2(n-1)/n · S / busbw at n = 2
fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.2))
a1.loglog(sizes, [r["time_s"] * 1e3 for r in rows], "o", label="measured (median, slower rank)")
a1.loglog(grid, model_s * 1e3, "-",
          label=f"2(n-1)α + 2(n-1)/n·S·β: α = {alpha * 1e6:.0f} µs, 1/β = {busbw / 1e9:.2f} GB/s")
a1.set(xlabel="message size S (bytes)", ylabel="time per all-reduce (ms)")
a2.semilogx(sizes, [r["busbw"] / 1e9 for r in rows], "o")
a2.semilogx(grid, bus_factor(2) * grid / model_s / 1e9, "-")
a2.set(xlabel="message size S (bytes)", ylabel="bus bandwidth (GB/s)")
a1.legend(fontsize=7)
fig.suptitle(f"all-reduce, 2 ranks, {job.backend}", fontsize=10)
fig.tight_layout()
plt.show()
for r in rows:
    print(f"{r['bytes'] / 1024:>8.0f} KiB  {r['time_s'] * 1e3:7.3f} ms  busbw {r['busbw'] / 1e9:5.2f} GB/s")

# %%
# the α-β model at n = 4 with this machine's fit: 2(n-1)α + 2(n-1)/n · S / busbw
allreduce_guess.reveal(allreduce_time(ra["bytes"], 4, busbw, alpha) * 1e3, what="modelled")

# %% [markdown]
# Small messages are all latency (their bus bandwidth is far below 1/β), large ones approach it:
# the reason DDP groups gradients into buckets of megabytes rather than sending each tensor
# alone. Where the points bend away from the line, the model's two numbers are not the whole
# story: gloo changes algorithm with the message size, and on 2 CPU cores the ranks' copies
# compete with each other.
#
# ### DDP's bytes against FSDP's, counted
# `distlab.measure.comm.CollectiveRecorder` is a `TorchDispatchMode` (like PyTorch's `CommDebugMode`)
# that sees every `c10d` collective on its way to the backend, DDP's own included, and records
# its size; a DDP comm hook counts DDP's buckets as a cross-check. One training step of notebook
# 04's model (8 residual blocks, 268 K parameters, Ψ = 1.07 MB), after two warm-up steps:
# under DDP; under FSDP2 with one unit per block and the root (FSDP2 leaves the root
# *unsharded* after forward, since the backward needs it at once); and with the root told to
# reshard (`fully_shard(model, reshard_after_forward=True)`). Wire bytes are what each rank sends
# in the ring algorithms: all-reduce 2(n−1)/n · S, all-gather and reduce-scatter (n−1)/n · S.

# %%
b = R[0]["bytes"]
assert b["ddp"]["hook_bytes_per_step"] == b["ddp"]["all_reduce"]["bytes"], "the comm hook and the counter disagree"
ddp_wire = b["ddp"]["wire_bytes"]
print(f"{'':>22} {'all-gather':>17} {'reduce-scatter':>17} {'all-reduce':>15} {'wire/rank':>10} "
      f"{'ZeRO predicts':>13} {'x DDP':>6}")
for name, label in (("ddp", "DDP"), ("fsdp", "FSDP2, root kept"), ("fsdp_root_resharded", "FSDP2, root resharded")):
    m = b[name]
    pred = m["prediction"]["fsdp"] if "prediction" in m else b["fsdp"]["prediction"]["ddp"]
    cols = [f"{m[k]['calls']:>3} x {m[k]['bytes'] / 1e6:6.3f} MB" if k in m else f"{'-':>14}"
            for k in ("all_gather", "reduce_scatter", "all_reduce")]
    print(f"{label:>22} {cols[0]:>17} {cols[1]:>17} {cols[2]:>15} {m['wire_bytes'] / 1e6:>7.3f} MB "
          f"{pred / 1e6:>10.3f} MB {m['wire_bytes'] / ddp_wire:>6.3f}")
for name in ("fsdp", "fsdp_root_resharded"):
    assert abs(b[name]["wire_bytes"] / b[name]["prediction"]["fsdp"] - 1) < 0.05

# %% [markdown]
# The counts match the ZeRO accounting to the byte. Every block is all-gathered twice (forward,
# then backward: it was freed in between) and reduce-scattered once; with the root resharded too
# that is 3(n−1)/n · Ψ against DDP's 2(n−1)/n · Ψ, **exactly 1.5x**. By default the root (the
# input and output layers, 2.5% of the parameters here) is gathered once, so FSDP sends
# (3Ψ − Ψ_root)/(2Ψ) = 1.487x. The sharded memory is paid for in bytes on the wire.
#
# ## 3. MFU: how much of the machine a step uses
# **Model FLOPs utilisation** (Chowdhery et al., *PaLM*, 2022, appendix B) is the FLOPs a step
# needs, per second, over the hardware's *datasheet* peak. Recomputed work does not count: PaLM's
# **hardware FLOPs utilisation** (HFU) counts it, so with notebook 08's full recomputation a step
# does 8N FLOPs per token for HFU against 6N for MFU (`distlab.lab.mfu.hardware_flops_per_token`).
# The FLOPs: Kaplan et al. (2020) estimate 6N per
# token for N parameters (2N forward, 4N backward); `torch.utils.flop_counter.FlopCounterMode`
# counts the matrix products of a real step. The workload is exercise 6's (notebook 06's MLP,
# width 1024, 3 hidden layers, batch 32 per worker; for an MLP a sample is a token).

# %%
m = R[0]["mfu"]
print(f"parameters N = {m['params']:,}; batch {m['batch']} samples (tokens) per worker")
print(f"FlopCounterMode, one step: {m['flops_per_step'] / 1e6:,.1f} MFLOP")
print(f"6 N x tokens (Kaplan):     {m['six_n'] / 1e6:,.1f} MFLOP  "
      f"(counted / rule = {m['flops_per_step'] / m['six_n']:.4f})")
print(f"6 x weights x tokens - 2 x first-layer weights x tokens: {m['exact'] / 1e6:,.1f} MFLOP "
      f"(equal to the count: {m['exact'] == m['flops_per_step']})")

# %% [markdown]
# The count is 1.1% below 6N, for two reasons the rule ignores: N counts the biases, whose adds
# are not matrix products (a bias is one add per token, not six multiply-adds), and the first
# layer's *input* needs no gradient, so its backward is 2 FLOPs per weight, not 4. Both shrink
# as models grow, which is why 6N is good enough at scale.
#
# **The peak.** A CPU has no datasheet figure, so the table divides by a *measured* peak: the
# best rate of large matrix products (256 to 1024 square, fp32, one thread per rank as torchrun's
# workers have) on the same ranks at the same time as the step. That ratio is the **fraction of
# the measured matmul peak**, not PaLM's MFU, and it is higher wherever the measured peak falls
# short of the datasheet's. On a GPU the last column is MFU as PaLM defines it
# (`distlab.lab.mfu.DATASHEET`: e.g. H100/H200 SXM 989 TFLOP/s bf16 dense, 67 TFLOP/s fp32).

# %%
from distlab.lab.mfu import DATASHEET

print(f"{'W':>2} {'step':>8} {'achieved':>12} {'peak (matmul)':>14} {'of it':>6}  MFU (datasheet)")
for row in m["rows"]:
    sheet = f"{row['mfu_datasheet']:.2%} of {m['device']}" if row["mfu_datasheet"] else "(CPU: no datasheet)"
    print(f"{row['world']:>2} {row['step_s'] * 1e3:6.1f}ms {row['achieved'] / 1e9:8.1f} GF/s "
          f"{row['peak'] / 1e9:9.1f} GF/s {row['mfu']:>6.1%}  {sheet}")
print("datasheet peaks known:", ", ".join(pattern.replace("\\b", "") for pattern, _ in DATASHEET))
fig, ax = plt.subplots(figsize=(4, 2.8))
ax.bar([str(r["world"]) for r in m["rows"]], [r["mfu"] for r in m["rows"]], color="#55a868")
ax.set(xlabel="workers W", ylabel="fraction of the measured matmul peak", ylim=(0, 1), title="exercise 6's workload")
fig.tight_layout()
plt.show()

# %% [markdown]
# One worker already leaves most of the peak unused: batch 32 makes the matrix products small
# (32 x 1024 by 1024 x 1024) and Python and the optimizer take their share. At W = 2 every
# worker also all-reduces 8.7 MB of gradients per step, and on this machine that costs more
# than the compute: the fraction falls by more than half, the efficiency loss of notebook 06 seen as
# FLOPs. W = 4 needs 4 cores (`make bench` measures it where it has them; with fewer cores the
# workers would wait for a core, not for the network).
#
# ## 4. Debugging a hang
# A collective finishes only when *every* rank calls it, with matching shapes, in the same
# order. A rank that skips one (a branch only some ranks take) or calls two in another order
# leaves the others waiting without a word until the process group's timeout: 30 minutes for
# gloo, 10 for NCCL. Our launcher sets seconds; without these tools, all a gloo job says then is
# `Timed out waiting ... ms for recv operation to complete`, with no hint of which collective.
#
# Two jobs hang on purpose below, each bounded by short timeouts; they mostly wait, so they
# start together and the cells after this one show what each printed.

# %%
from concurrent.futures import ThreadPoolExecutor

from distlab.lab.hang import detail_report, short_report, stuck_job

hang_demos = ThreadPoolExecutor(max_workers=2)
detail_started = hang_demos.submit(detail_report, timeout=60)
stuck_started = hang_demos.submit(stuck_job, barrier_timeout_s=3, timeout=60)

# %% [markdown]
# ### `TORCH_DISTRIBUTED_DEBUG=DETAIL`: a mismatch report instead of a hang
# With `DETAIL`, every collective is checked before it runs: the ranks exchange a fingerprint of
# it (operation, sequence number, shapes, dtypes) and raise if they differ. Below, each rank
# all-reduces two metrics, `loss` (1 value) and `per_class_correct` (10), but rank 1 in the other
# order (a dict built differently on each rank).

# %%
detail = detail_started.result()
print("launcher:", detail["error"][:90], "...")
for rank in sorted(detail["reports"]):
    print(f"\nrank {rank} raised:\n{short_report(detail['reports'][rank])}")

# %% [markdown]
# Each rank names its own collective and its peer's, and the difference (the shapes). One trap
# in torch 2.13: when the two fingerprints have different *lengths* (an all-reduce of one tensor
# against a barrier, which has none), the peer's half is misread and shows as, e.g.,
# `OpType=GATHER` with no shapes; each rank's description of *its own* collective is always
# right, so read every rank's report (a rank that torchrun ended before it raised has none).
# `DETAIL` runs three extra collectives before each one, on a helper gloo group: a monitored
# barrier, then an all-gather of the fingerprint's length and one of the fingerprint (a profiler
# on 2 ranks counts, per all-reduce, one `gloo:send`, one `gloo:recv` and two `gloo:all_gather`):
# a debugging switch, not a default.
#
# ### `monitored_barrier` names the missing rank; a stack dump shows where each rank is
# Now rank 0 skips an all-reduce that rank 1 enters, and goes on to
# `dist.monitored_barrier(wait_all_ranks=True)`, which waits a few seconds and then names every
# rank that did not arrive (gloo only). While both are stuck, the notebook dumps every rank's
# Python stack twice:
#
# * **faulthandler** (standard library, nothing to install): each rank ran
#   `faulthandler.register(signal.SIGUSR1, file=..., all_threads=True)` at start, so
#   `kill -USR1 <pid>` makes it write every thread's stack without stopping it;
# * **py-spy** (`pip install py-spy`): `py-spy dump --pid <pid>` reads the stack from outside,
#   with no cooperation from the process, if it may *ptrace* it (a container may need
#   `--cap-add SYS_PTRACE`; when it cannot, its error is printed below and faulthandler still works).

# %%
stuck = stuck_started.result()
hang_demos.shutdown()
print("rank 0's monitored_barrier raised:", stuck["monitored_barrier"].get(0, "(nothing printed)"))
for rank, error in sorted(stuck["errors"].items()):
    print(f"rank {rank}'s own error: {error[:150]}")
for rank in (0, 1):
    print(f"\n--- rank {rank}, said it blocks in {stuck['blocked_in'].get(rank)}: faulthandler")
    print(stuck["faulthandler"].get(rank, "(no dump)"))
    print(f"--- rank {rank}: py-spy dump")
    print(stuck["py_spy"].get(rank, "(no dump)"))
print("\nprocesses of the job still running:", stuck["left_running"] or "none")

# %% [markdown]
# Rank 0's `monitored_barrier` said *"Ranks 1 failed to pass monitoredBarrier"*; rank 1 only
# learnt that its peer was gone (`Connection closed by peer`) when rank 0's error ended the job.
# The stacks say the rest: rank 0 waits in `monitored_barrier`, rank 1 in `all_reduce`, each at
# its line of `distlab/lab/hang.py`. Ranks in *different* collectives, or at different lines, is the
# signature of a skipped or reordered collective; all ranks in the same collective points
# instead at a rank that is slow or dead before it.
#
# ### On GPUs: NCCL's flight recorder and `NCCL_DEBUG`
# * **Flight recorder**: with `TORCH_FR_BUFFER_SIZE=2000` (torch 2.13's name; older releases read
#   `TORCH_NCCL_TRACE_BUFFER_SIZE`) every rank keeps its last 2000 collectives in a ring buffer:
#   operation, sequence number, sizes, state (scheduled, started, completed) and the Python
#   stack that issued it. With `TORCH_NCCL_DUMP_ON_TIMEOUT=1` each rank writes the buffer when
#   NCCL's watchdog sees a timeout, to `TORCH_FR_DUMP_TEMP_FILE` + rank (older:
#   `TORCH_NCCL_DEBUG_INFO_TEMP_FILE`), and `torchfrtrace <folder> -p <prefix>` (installed with
#   torch) lines the ranks' buffers up and reports the first collective on which they disagree
#   and the ranks that never reached it. In torch 2.13 it records gloo's collectives too.
# * **`NCCL_DEBUG=INFO`** (with `NCCL_DEBUG_SUBSYS=COLL` for every collective) makes NCCL print
#   its set-up (the rings and trees it built, over which transports) and its calls: the first
#   thing to read when a job hangs at start or runs at a fraction of the expected bandwidth.
#
# ## Summary
# * The profiler's trace shows DDP's buckets all-reducing while backward computes; the overlap
#   fraction grows as buckets shrink. Whether that buys step time depends on whether
#   communication has its own hardware (GPUs: yes; a CPU: no).
# * Counted bytes match the ZeRO accounting: FSDP sends 1.5x DDP's bytes (less when the root
#   stays gathered).
# * FLOPs counted with `FlopCounterMode` match 6N up to biases and the first layer; MFU shows the
#   scaling loss of notebook 06 as unused FLOPs.
# * A hang has tools: `TORCH_DISTRIBUTED_DEBUG=DETAIL`, `monitored_barrier`, faulthandler or
#   py-spy stacks, and on GPUs the flight recorder.
#
# ## Exercise 9: find the hang, then fix it
# `exercises/ex09_hang.py` gives `train_broken`, a data-parallel loop written by hand: each rank
# sums the loss of the samples of its batch that count (`keep`: padding and ignored labels do
# not), all-reduces the number kept and every gradient, and steps on the mean over the global
# batch. At some steps a rank keeps nothing (rank 1 at step 1, both ranks at step 4), and
# `train_broken` then skips the step. Run it on 2 ranks with `TORCH_DISTRIBUTED_DEBUG=DETAIL`, each
# rank printing the steps it takes (`distlab.lab.hang.masked_job`), with collectives that give up
# after 2 s:

# %%
from distlab import LaunchError
from distlab.lab.hang import rank_errors


def steps_only(line: str) -> None:   # the ranks' own prints, not torchrun's report of the failure
    if "step" in line or "returned" in line:
        print(line)


try:
    torchrun("distlab.lab.hang:masked_job", 2, args=(str(REPO_ROOT / "exercises" / "ex09_hang.py"),),
             timeout=30, stream=steps_only, env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
except LaunchError as exc:
    print("launcher:", str(exc)[:120])
    for rank, error in sorted(rank_errors(exc.output).items()):
        print(f"rank {rank}'s last error: {error[:120]}")

# %% [markdown]
# Read it as the tools above taught. `DETAIL` raised *no* mismatch: at step 1 rank 1 skipped
# the step, so its step-2 all-reduce of the count met rank 0's step-1 one, and the two have the
# same fingerprint (one float), as do the gradients' after them. gloo paired collectives of
# different steps and summed them, silently; rank 1 returned one step early, and rank 0 waited
# in its last all-reduce until `DETAIL`'s monitored barrier named rank 1. The printed steps
# show where the ranks parted. The signature of a skipped collective: a branch on one rank's
# own data (`if not keep.any(): continue`) in front of a collective.
#
# Write `train` in `exercises/ex09_hang.py`: the same job, without the hang, and with the same
# meaning. The grader runs it on 2 ranks with every collective checked against the other rank's
# *before* it runs (its step, kind and shapes, which is more than `DETAIL` compares), so a job
# that would hang is stopped at once and each rank's line is named. A fixed job must
#
# * finish, with the same collectives on every rank, in the same order;
# * make the same all-reduces on every rank at every step (counted with `CollectiveRecorder`):
#   removing the communication removes the hang and the job with it;
# * match one process trained with SGD on the mean loss over every rank's kept samples
#   (`torch.testing.assert_close`);
# * keep the meaning: a rank with nothing to keep takes part, with a zero gradient and a count of
#   0, and the other ranks still learn from theirs (skipping the step everywhere drops them).
#
# ### Part 2, harder: ranks with uneven numbers of batches
# A data set rarely splits evenly over the ranks. `DistributedSampler` hides it by repeating samples
# until every rank has as many (notebook 01's evaluation showed what that padding costs a metric); a
# stream (an `IterableDataset` read in shards, a file per rank) cannot, and some rank runs out first.
# The loop of a single-process script, `for x, y in batches:`, then ends on that rank while the others
# still have data, and DDP's all-reduce of their next step has a rank missing.
#
# Below, rank 0 has 2 batches and rank 1 has 4, each running that loop around DDP, each printing the
# batches it finished. The launcher ends a job when no rank has advanced for a while and one waits in a
# collective (here after 3 s; by default 10 s): predict first.

# %%
uneven_guess = predict("rank 0 has 2 batches, rank 1 has 4, and each runs the loop of a single-process script "
                       "around DDP: how many batches does rank 1 finish before the job is ended?",
                       unit="batches", guess=None)

# %%
UNEVEN_JOB = TRACES / "uneven_ddp.py"   # a script: torchrun's ranks run it as __main__
UNEVEN_JOB.write_text("""import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import distlab
from distlab.lab.hang import small_classifier

distlab.init_distributed()
rank = dist.get_rank()
model = DistributedDataParallel(small_classifier())
opt = torch.optim.SGD(model.parameters(), lr=0.5)
gen = torch.Generator().manual_seed(rank)
for step in range([2, 4][rank]):   # this rank's batches: 2 on rank 0, 4 on rank 1
    x, y = torch.randn(4, 8, generator=gen), torch.randint(0, 4, (4,), generator=gen)
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()   # DDP all-reduces the gradients in here
    opt.step()
    print(f"batch {step} done", flush=True)
print("out of data: left the loop", flush=True)
""")
finished = {0: [], 1: []}


def batches_done(line: str) -> None:   # each rank's own lines, as it printed them
    for r in finished:
        if line.startswith(f"[rank{r}] "):
            finished[r].append(line.removeprefix(f"[rank{r}] "))
            print(line)


try:
    torchrun(str(UNEVEN_JOB), 2, timeout=60, stream=batches_done, hang_after_s=3)
except LaunchError as exc:
    print("\nlauncher:", str(exc).splitlines()[0])

# %%
uneven_guess.reveal(sum(line.startswith("batch ") for line in finished[1]))

# %% [markdown]
# Rank 1 finished the two steps it shared with rank 0; in its third, DDP's all-reduce waited for a
# rank that had left its loop, and nothing said so until the launcher looked. In a real job rank 0
# would have gone on to evaluate or save, and rank 1 would have waited until the process group's
# timeout. The launcher's report names rank 1's line (`backward()`, where DDP's reducer all-reduces), and
# the prints the reason: rank 0 was out of data.
#
# Write `train_uneven` in `exercises/ex09_hang.py`: its docstring is the contract. The job runs as
# many steps as the longest rank has batches, and each step means one process's SGD step on the mean
# loss over the samples of the ranks that still have a batch; a rank out of data takes part in every
# step's collectives, adding nothing, until no rank has a batch left. You may write the collectives by
# hand or use DDP, as long as the job means that. The grader runs it on 2 ranks with 2 and 4
# batches (the longest rank is not rank 0), 0 and 2 (a rank with no batch at all) and 2 and 2, each
# collective checked against the other rank's before it runs, so the loop above is reported, not left
# hanging: "the job hangs with ranks with 2 and 4 batches: rank 1 waits in all_reduce of [212] at
# ex09_hang.py:N (...backward()) (its collective 8, at its batch 2 of 4), while rank 0 had returned from
# train_uneven after 7 collectives, out of data after its 2 batches". It then compares every rank with
# one process that replays the global stream of batches, at each batch's forward and at the end.
#
# Or from a shell: `.venv/bin/python -m autograder grade --exercise 9`.

# %%
from autograder import check

check(9, raise_on_fail=False)
