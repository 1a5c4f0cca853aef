"""Exercise 1 check: single process -> DDP, graded at world sizes 2 and 4.

Each rank builds the model from a *different* seed before handing it to the
learner, so a run that skips DDP's initial broadcast ends with ranks apart.
The data set records which indices each rank read; from those logs the
grader rebuilds every global batch and trains a single-process reference on
them, which the ranks' final parameters must match (CS336-style parity).
"""
from __future__ import annotations

import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

import distlab
from distlab import torchrun
from distlab.data import RecordingDataset, digits
from distlab.models import cpu_state, make_mlp

from ..parity import parity
from ..harness import CapturedPrints, SaveSpy, echo, load_learner
from ..registry import Exercise
from ..report import ExerciseReport

EXERCISE = Exercise(number=1, name="ddp", filename="ex01_ddp.py", max_score=10, time_limit=150)
WORLD_SIZES = (2, 4)
CONFIG = dict(epochs=2, batch_size=32, lr=0.2, seed=7)
MODEL = dict(hidden=64)
RTOL, ATOL = 1e-4, 1e-5  # all-reduce sums in another order than one big batch's mean


def rank_main(path: str, ckpt_dir: str) -> dict:
    """Runs on every rank: set up, train with the learner's code, report what was observed."""
    with SaveSpy() as saves:  # before the import, so ``from torch import save`` binds the spy too
        learner = load_learner(path)
        learner.setup()
        if not dist.is_initialized():
            raise RuntimeError("setup() returned but no process group is initialised")
        rank = dist.get_rank()
        model = make_mlp(seed=1000 + rank, **MODEL).to(distlab.device())  # a different start on every rank
        initial = cpu_state(model)
        data = RecordingDataset(digits())
        ckpt = Path(ckpt_dir) / "model.pt"
        saves.paths.clear()  # only what train_ddp saves counts
        with CapturedPrints() as out:
            trained = learner.train_ddp(model, data, checkpoint_path=str(ckpt), **CONFIG)
    echo(out.lines)
    final = cpu_state(trained if trained is not None else model)
    learner.teardown()
    return {
        "rank": rank, "initial": initial, "final": final, "accessed": data.accessed,
        "printed": out.lines, "saves": saves.paths, "still_initialized": dist.is_initialized(),
    }


def _reference(initial: dict, global_batches: list[list[int]]) -> dict:
    """Single-process SGD on exactly the global batches the ranks formed."""
    model = make_mlp(seed=0, **MODEL)
    model.load_state_dict(initial)
    x_all, y_all = digits().tensors
    opt = torch.optim.SGD(model.parameters(), lr=CONFIG["lr"])
    for idx in global_batches:
        loss = nn.functional.cross_entropy(model(x_all[idx]), y_all[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return cpu_state(model)


def _check_world(report: ExerciseReport, results: list[dict], world: int, ckpt: Path) -> None:
    n, epochs, bs = len(digits()), CONFIG["epochs"], CONFIG["batch_size"]
    tag = f"[W={world}]"
    # 1. identical parameters on every rank
    # Exact: DDP leaves every rank with the same bits (same broadcast start, same all-reduced grads).
    gaps = [(parity(r["final"], results[0]["final"], rtol=0, atol=0), r["rank"]) for r in results[1:]]
    worst, other = max(gaps, key=lambda g: g[0].max_abs_diff)
    report.check(f"{tag} same parameters on every rank", 2, all(g.ok for g, _ in gaps),
                 f"rank 0 and rank {other} ended with different weights (max abs difference "
                 f"{worst.max_abs_diff:.3g} in '{worst.worst}'): wrap the model in DistributedDataParallel so "
                 "it broadcasts rank 0's weights and averages gradients")
    # 2. disjoint shards that cover the data set, per epoch
    per_rank = [r["accessed"] for r in results]
    local = n // world
    shards_ok = all(len(a) == epochs * local for a in per_rank)
    msg = ""
    if not shards_ok:
        msg = (f"each rank should read {local} samples per epoch ({n} / {world} ranks) but rank 0 "
               f"read {len(per_rank[0]) / epochs:g}: did you pass a DistributedSampler to the DataLoader?")
    else:
        for e in range(epochs):
            seen = [set(a[e * local:(e + 1) * local]) for a in per_rank]
            overlap = len(seen[0] & seen[1])
            covered = len(set().union(*seen))
            if overlap or covered != n:
                shards_ok = False
                msg = (f"in epoch {e} ranks 0 and 1 shared {overlap} samples and together covered "
                       f"{covered} of {n}: did you pass a DistributedSampler to the DataLoader?")
                break
    report.check(f"{tag} each rank reads its own shard", 2, shards_ok, msg)
    # 3. the shuffle changes between epochs
    a0 = per_rank[0]
    reshuffled = shards_ok and a0[:local] != a0[local:2 * local]
    report.check(f"{tag} new shuffle every epoch", 1, reshuffled,
                 "epoch 0 and epoch 1 read the samples in the same order: call "
                 "sampler.set_epoch(epoch) at the start of every epoch" if shards_ok else
                 "not checked: needs one shard per rank first")
    # 4. parity with a single-process run on the same global batches
    if shards_ok:
        batches = [sum((a[s:s + bs] for a in per_rank), []) for e in range(epochs)
                   for s in range(e * local, (e + 1) * local, bs)]
        match = parity(results[0]["final"], _reference(results[0]["initial"], batches), rtol=RTOL, atol=ATOL)
        diff, key = match.max_abs_diff, match.worst
        report.measurements[f"W{world}_max_abs_diff_vs_reference"] = diff
        report.check(f"{tag} matches single-process training", 2, match.ok,
                     f"weights differ from one process trained on the same global batches of "
                     f"{world}x{bs} (max abs difference {diff:.3g} in '{key}', tolerance rtol={RTOL}, "
                     f"atol={ATOL}): use SGD with lr={CONFIG['lr']} on the mean cross-entropy, one step "
                     "per batch, and let DDP average the gradients (do not also all-reduce them yourself)",
                     pass_note=f"max abs difference {diff:.2g}")
    else:
        report.check(f"{tag} matches single-process training", 2, False,
                     "not checked: needs one shard per rank first")
    # 5. rank 0 logs, nobody else does
    noisy = [(r["rank"], r["printed"]) for r in results[1:] if r["printed"]]
    quiet_ok = bool(results[0]["printed"]) and not noisy
    report.check(f"{tag} only rank 0 logs", 1, quiet_ok,
                 f"rank {noisy[0][0]} printed {len(noisy[0][1])} lines (first: {noisy[0][1][0]!r}): "
                 "print only where dist.get_rank() == 0" if noisy else
                 "rank 0 printed nothing: print the loss of each epoch on rank 0")
    # 6. rank 0 saves the unwrapped model, once
    savers = [r["rank"] for r in results if r["saves"]]
    saved_ok = savers == [0] and len(results[0]["saves"]) == 1 and ckpt.is_file()
    detail = ""
    if saved_ok:
        state = torch.load(ckpt, weights_only=True)
        if set(state) != set(results[0]["final"]):
            saved_ok = False
            detail = ("the saved file's keys do not match the model's (a 'module.' prefix? save "
                      "model.module.state_dict())")
        elif not (same := parity(state, results[0]["final"], rtol=0, atol=0)):
            saved_ok = False
            detail = f"the saved weights differ from the trained ones (in '{same.worst}')"
    elif not savers:
        detail = "nothing was saved with torch.save: save model.module.state_dict() to checkpoint_path on rank 0"
    elif savers != [0]:
        detail = f"torch.save was called on ranks {savers}: save on rank 0 only"
    else:
        detail = f"no checkpoint at the checkpoint_path given (rank 0 saved to {results[0]['saves']})"
    report.check(f"{tag} rank 0 saves the model once", 1, saved_ok, detail)
    # 7. teardown leaves the process group
    left_open = [r["rank"] for r in results if r["still_initialized"]]
    report.check(f"{tag} teardown destroys the process group", 1, not left_open,
                 f"after teardown() the process group was still initialised on ranks {left_open}: "
                 "call dist.destroy_process_group()")


def grade(path: Path, world_sizes: tuple[int, ...] = WORLD_SIZES) -> ExerciseReport:
    """Grade the file at ``path`` (tests pass fewer ``world_sizes`` to run faster).

    The world sizes are launched at once: most of a launch is process start-up
    (importing torch), which two launches overlap on the machine's cores, and
    each job rendezvouses on its own free port.
    """
    report = ExerciseReport(EXERCISE.number, EXERCISE.name, EXERCISE.max_score)
    with tempfile.TemporaryDirectory(prefix="ex01-") as tmp, ThreadPoolExecutor(len(world_sizes)) as pool:
        dirs = {w: Path(tmp) / f"W{w}" for w in world_sizes}
        for d in dirs.values():
            d.mkdir()
        jobs = {w: pool.submit(torchrun, rank_main, w, args=(str(path), str(dirs[w])), timeout=60)
                for w in world_sizes}
        for world in world_sizes:
            run = jobs[world].result()  # a failed launch raises here, as a sequential one would
            _check_world(report, run.results, world, dirs[world] / "model.pt")
            report.measurements[f"W{world}_launch_s"] = round(run.wall_s, 2)
    # Each world size is worth half the marks.
    for c in report.criteria:
        c.points, c.earned = c.points / len(world_sizes), c.earned / len(world_sizes)
    return report
