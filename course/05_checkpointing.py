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
# # 05 · Checkpoints that survive a crash
#
# Long jobs die: a node fails, a job is pre-empted, a rank runs out of memory. A checkpoint is
# only useful if the run that resumes from it continues **exactly** where the old one stopped.
# Notebook 04 sharded the training state over the ranks; this one saves it without gathering it
# and resumes from it after a crash, with torchrun restarting the job (notebook 06 looks closer
# at torchrun and its restarts).
#
# ## Sharded or full?
#
# * A **full** checkpoint gathers every parameter to one rank and writes one file
#   (`get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))`,
#   exercise 4). Simple to export, but rank 0 must hold the whole model and all others wait.
# * A **sharded** checkpoint lets every rank write its own shards in parallel:
#   `torch.distributed.checkpoint` (DCP) writes one `__R_0.distcp` file per rank plus a
#   `.metadata` file describing where every piece of every tensor lives. Because of that
#   metadata, DCP can **reshard** on load: a checkpoint written by 2 ranks loads into 4.
#
# ## What does a run need to resume exactly?
#
# | state | why | how |
# |---|---|---|
# | model parameters | obviously | DCP, via `get_state_dict(model, optimizer)` |
# | optimizer state (Adam moments, step counts) | the next update depends on them | same |
# | LR scheduler | the next learning rate | `scheduler.state_dict()` |
# | step counter | where the schedule and the log are | an int in the checkpoint |
# | data position | which samples come next (sampler epoch + samples used) | ints in the checkpoint |
# | RNG state of **each** rank | dropout masks, random augmentations | `torch.get_rng_state()` per rank |
#
# Miss any one and the resumed run still trains, just not the same run: the loss curve looks
# plausible and the bug goes unnoticed. torchtitan hit a subtle one (issue #571, fixed by pull
# request #647): after a DCP load some state objects went stale, so a run resumed **twice**
# drifted. Test two resumes, not one.
#
# ## Atomic commits
#
# A crash can also hit *during* a save. If the new checkpoint is written in place, the newest
# directory is half-written and the next start loads garbage (or crashes on load, forever).
# The fix databases use: write into a staging name (`.tmp-step_N`), wait until **every** rank has
# finished, then let one rank **rename** it to `step_N`. On a local POSIX file system a rename
# within it is atomic (`os.replace`), so a reader sees the old set or the new one, never half of
# one; network and parallel file systems (NFS, Lustre) give weaker promises, and object stores
# have no rename at all. Atomic is not durable: after a power loss the rename can be on disk
# before the data, so the files are `fsync`ed first and the parent directory after the rename.
# DCP does part of this itself: every rank fsyncs its shards, and `dcp.save` ends with a
# collective after the coordinator has written `.metadata`, last (through a rename of its own),
# so when `dcp.save` returns on any rank, every rank's shards are written. `distlab.checkpoint`
# has the pieces: `staging_path`, `commit` (fsync, rename, fsync the directory),
# `latest_complete`, and `prune` (keep the last K).
#
# Legacy names: FSDP1 saved with `FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT)`
# and `FSDP.optim_state_dict(model, optim)`, then `dcp.save`; `StateDictType.FULL_STATE_DICT` is
# the full checkpoint. `get_state_dict`/`set_state_dict` replace both, for FSDP2, DDP and plain
# models alike. Older DCP code calls `save_state_dict`/`load_state_dict`; now `dcp.save`/`dcp.load`.
#
# **The optimizer is where FSDP1-era code breaks.** It saves the optimizer with
# `FSDP.full_optim_state_dict(model, optim)` (or `FSDP.optim_state_dict`) and loads it with
# `FSDP.optim_state_dict_to_load(model, optim, osd)` (or `scatter_full_optim_state_dict`)
# followed by `optim.load_state_dict(...)`. Those functions work on FSDP1's
# `FullyShardedDataParallel` wrapper and its flattened parameters; on a `fully_shard` (FSDP2)
# model they fail with an `AttributeError` or an `IndexError` that names nothing you wrote
# (torch 2.13). With FSDP2 the optimizer's state is DTensors like the parameters: take it with
# `get_optimizer_state_dict(model, optim)` and put it back with
# `set_optimizer_state_dict(model, optim, osd)`, or both model and optimizer at once with
# `get_state_dict`/`set_state_dict` as the demo below does.

# %% [markdown]
# ## Live demo: train, kill a rank, resume
#
# The script below trains a sharded (FSDP2) model on 2 ranks for 20 steps, saving every 5 with an
# atomic commit and keeping 2. It has no dropout and picks each batch from the step number, so
# model, optimizer and step are all it must save (the exercise has to save the rest too). We run
# it twice under `torchrun --max-restarts 1`: once undisturbed, and once while rank 1 **SIGKILLs
# itself after step `KILL_AT`**. torchrun sees the dead rank, stops the other, restarts both, and
# the new processes resume from the last complete checkpoint (the last multiple of 5 before the
# kill). Both the kill and the resume are logged, and the plot below reads them from the logs.

# %%
import os
import shutil
import tempfile
from pathlib import Path

# %load_ext distlab

demo = Path(tempfile.mkdtemp(prefix="distlab-05-"))

# %%
# %%writefile {demo}/train_demo.py
import json
import os
import signal

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import fully_shard

import distlab
from distlab.checkpoint import commit, latest_complete, prune, staging_path
from distlab.data import synthetic_classification
from distlab.resmlp import make_resmlp

STEPS, KILL_AT = 20, 13
demo = os.path.dirname(os.path.abspath(__file__))
dev = distlab.init_distributed()  # this rank's device: the CPU under gloo, its GPU under NCCL
rank, attempt = dist.get_rank(), int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
x_all, y_all = synthetic_classification(1024, 64, 10, seed=1).tensors


def train(name: str, kill_at: int = 0) -> None:
    root = os.path.join(demo, name)
    model = make_resmlp(seed=0, hidden=48, depth=2).to(dev)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    step = 0
    found = latest_complete(root)
    if found is not None:
        model_sd, optim_sd = get_state_dict(model, opt)
        state = {"model": model_sd, "optim": optim_sd, "step": 0}
        dcp.load(state, checkpoint_id=found[1])  # fills the sharded tensors in place
        # FSDP2's optimizer load (not FSDP1's FSDP.optim_state_dict_to_load + optim.load_state_dict)
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        step = state["step"]
        if rank == 0:
            print(f"{name}, attempt {attempt}: resumed from {found[1].name}")
            with open(root + ".jsonl", "a") as f:
                f.write(json.dumps({"attempt": attempt, "resumed_from": step}) + "\n")
    while step < STEPS:
        g = torch.Generator().manual_seed(step)  # the batch depends on the step only
        idx = torch.randint(0, 1024, (32,), generator=g)[rank * 16:(rank + 1) * 16]
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x_all[idx].to(dev)), y_all[idx].to(dev))
        loss.backward()
        opt.step()
        step += 1
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        mean /= dist.get_world_size()
        if rank == 0:
            with open(root + ".jsonl", "a") as f:
                f.write(json.dumps({"attempt": attempt, "step": step, "loss": mean.item()}) + "\n")
        if step % 5 == 0:
            model_sd, optim_sd = get_state_dict(model, opt)
            # dcp.save ends with a collective after .metadata is written: every rank's shard is on disk
            dcp.save({"model": model_sd, "optim": optim_sd, "step": step}, checkpoint_id=staging_path(root, step))
            if rank == 0:
                commit(root, step)  # atomic rename .tmp-step_N -> step_N
                prune(root, keep=2)
            dist.barrier()  # no rank runs ahead (or dies) while rank 0 renames
        if step == kill_at and attempt == 0 and rank == 1:
            print(f"rank 1: SIGKILL after step {step}", flush=True)
            with open(root + ".jsonl", "a") as f:  # rank 0 may not log this step any more: log it here
                f.write(json.dumps({"attempt": attempt, "killed_after": step}) + "\n")
            os.kill(os.getpid(), signal.SIGKILL)


if attempt == 0:
    train("uninterrupted")
train("killed", kill_at=KILL_AT)
distlab.shutdown()

# %% [markdown]
# One job runs both: first the undisturbed run, then the one that loses rank 1 (the restarted
# attempt skips the first). The cell prints only the lines about the crash and the resume.

# %%
# Predict before you run: type your guess in the box (or write it in place of guess=None).
from distlab.lab.predict import predict

lost_guess = predict(
    "steps trained twice because of the crash (killed after step 13; a checkpoint every 5 steps)",
    unit="steps", guess=None)

# %%
from distlab import torchrun

run = torchrun(str(demo / "train_demo.py"), 2, max_restarts=1, timeout=150,
               stream=lambda line: print(line) if "resumed" in line or "SIGKILL" in line else None)

# %%
import json

import matplotlib.pyplot as plt

logs = {n: [json.loads(ln) for ln in (demo / f"{n}.jsonl").read_text().splitlines()]
        for n in ("uninterrupted", "killed")}
ref = {r["step"]: r["loss"] for r in logs["uninterrupted"] if "loss" in r}
crashed = [r for r in logs["killed"] if "loss" in r]
killed_after = next(r["killed_after"] for r in logs["killed"] if "killed_after" in r)
resumed_from = {r["attempt"]: r["resumed_from"] for r in logs["killed"] if "resumed_from" in r}
fig, ax = plt.subplots(figsize=(8, 3.5))
ax.plot(list(ref), list(ref.values()), "k-", lw=8, alpha=0.2, label="uninterrupted")
for attempt in sorted({r["attempt"] for r in crashed}):
    pts = [r for r in crashed if r["attempt"] == attempt]
    ax.plot([r["step"] for r in pts], [r["loss"] for r in pts], "o-", ms=3,
            label=f"interrupted run, attempt {attempt}"
            + (f" (resumed from step {resumed_from[attempt]})" if attempt in resumed_from else ""))
ax.axvline(killed_after, color="C3", ls=":", label=f"rank 1 SIGKILLed after step {killed_after}")
ax.set_xlabel("step"); ax.set_ylabel("mean loss over ranks"); ax.legend(fontsize=8)
plt.tight_layout(); plt.show()

after = [r for r in crashed if r["attempt"] == 1]
worst = max(abs(r["loss"] - ref[r["step"]]) for r in after)
print(f"rank 1 was killed after step {killed_after}; attempt 1 resumed from the checkpoint of step "
      f"{resumed_from[1]}, trained from step {after[0]['step']} to step {after[-1]['step']}; "
      f"largest loss difference from the uninterrupted run: {worst}")
from distlab import pick_backend

if pick_backend(2) == "gloo":  # bit-identical on the CPU; NCCL may reorder reductions
    assert worst == 0.0, worst
print("checkpoints kept:", sorted(p.name for p in (demo / "killed").iterdir()))
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from distlab.checkpoint import latest_complete, size_bytes
from distlab.lab.training_memory import training_memory
from distlab.resmlp import make_resmlp

files = size_bytes(latest_complete(demo / "killed")[1])
print("files of the last one (bytes):", files)
# what a checkpoint must hold, in the course's one accounting: the weights and Adam's moments (fp32,
# so the weights are the master copy), not the gradients, which the next step recomputes
n_params = sum(p.numel() for p in make_resmlp(seed=0, hidden=48, depth=2).parameters())
state = training_memory(n_params, precision="fp32", optimizer="adam")
kept = state["params"] + state["master"] + state["optimizer"]
meta = dcp.FileSystemReader(latest_complete(demo / "killed")[1]).read_metadata()
tensors = {fqn: m for fqn, m in meta.state_dict_metadata.items() if isinstance(m, TensorStorageMetadata)}
payload = sum(m.size.numel() * torch.empty((), dtype=m.properties.dtype).element_size() for m in tensors.values())
steps = [fqn for fqn in tensors if fqn.endswith(".step")]   # Adam's step count, one scalar per parameter tensor
shards = sum(n for name, n in files.items() if name.endswith(".distcp"))
print(f"{n_params:,} parameters: the accounting's weights + Adam's moments are {kept:,.0f} B (12 a parameter); "
      f"DCP's .metadata lists {payload:,} B of tensors: those + {len(steps)} step counts of 4 B")
print(f"the shard files hold {shards:,} B: DCP writes each of {len(meta.storage_data)} pieces as a torch.save "
      f"record of its own, and on tensors this small the records' framing is {1 - payload / shards:.0%} of the files")
assert payload == kept + 4 * len(steps)
print(f"the whole job, both runs and the restart: {run.wall_s:.1f} s")
shutil.rmtree(demo, ignore_errors=True)  # the demo's checkpoints and logs

# %%
lost_guess.reveal(killed_after - resumed_from[1])

# %% [markdown]
# The two curves are one: after the restart, the steps between the checkpoint and the kill are
# redone and produce exactly the losses they produced before (on the CPU the difference printed
# above is 0.0, not merely small: same inputs, same reduction order, same bits). The cost of the crash is the lost steps since the last
# checkpoint plus the restart, which is why you checkpoint often enough and make saving cheap
# (sharded, in parallel; `dcp.async_save` overlaps it with training).
#
# ## A data position at another world size
# DCP reshards the weights and Adam's state when 4 ranks load what 2 wrote; the data position is yours.
# With `W` ranks, rank `r`'s `DistributedSampler` deals it every `W`-th index of the epoch's one shuffled
# order, from `r` on, so a step uses the next `W x BATCH_SIZE` samples of that global order. A per-rank
# offset ("my next batch is my batch `b`", what most tutorials save) names a place in the data only at the
# world size that wrote it:

# %%
skip_guess = predict(
    "a 2-rank job (batches of 16, 256 samples) checkpoints after 3 steps of an epoch as 'batch 3'; resumed "
    "at 4 ranks from batch 3 of each rank's share, how many samples of the epoch does it never train on",
    unit="samples", guess=None)

# %%
from torch.utils.data import DistributedSampler


def share(world: int, rank: int, n: int = 256) -> list[int]:
    """The indices rank ``rank`` of ``world`` is dealt in epoch 0."""
    sampler = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=True, seed=0)
    sampler.set_epoch(0)
    return list(sampler)


B = 16
before = {i for r in range(2) for i in share(2, r)[:3 * B]}   # what the 2-rank job trained
after = {i for r in range(4) for i in share(4, r)[3 * B:]}    # what the 4-rank job trains from "batch 3" on
never = set(range(256)) - before - after
print(f"trained before the checkpoint {len(before)}, after the resume {len(after)}, "
      f"seen twice {len(before & after)}, never {len(never)}")

# %%
skip_guess.reveal(len(never), what="counted")

# %% [markdown]
# Exercise 5 asks for a position that keeps its meaning when the number of ranks changes, and the
# grader resumes a 2-rank checkpoint with 4 ranks to check that the job continues the same stream.
#
# ## Exercise 5
#
# Open `exercises/ex05_checkpoint.py`. Your `train` must save and load **everything**: model and
# optimizer with DCP, the scheduler, the step, the data position and each rank's RNG state, with
# atomic commits and only the last K checkpoints kept. There each rank writes its RNG file *after*
# `dcp.save`, so the barrier before the commit is needed again. The grader kills a rank with SIGKILL at
# steps it chooses (once in the middle of a checkpoint write), resumes with torchrun's
# `--max-restarts` and with a fresh job, twice, and compares the final weights bit for bit with a run that
# was never interrupted; then it resumes the 2-rank run's checkpoint of step 9 with 4 ranks and checks where
# that job starts: the same weights and Adam state, and the next samples of the same stream.

# %%
from autograder import check

report = check(5, raise_on_fail=False)
