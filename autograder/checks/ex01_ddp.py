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
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
import torch.distributed as dist
from torch import nn

import distlab
from distlab.data import RecordingDataset, digits
from distlab.models import cpu_state, make_mlp

from ..grading import launch_files, launch_timeout
from ..harness import CapturedPrints, SaveSpy, echo, load_learner, own_rendezvous
from ..parity import parity
from ..registry import Exercise
from ..report import ExerciseReport, Verdict, criterion, failed, passed

EXERCISE = Exercise(number=1, name="ddp", filename="ex01_ddp.py", max_score=10, time_limit=150)
WORLD_SIZES = (2, 4)
CONFIG = dict(epochs=2, batch_size=32, lr=0.2, seed=7)
MODEL = dict(hidden=64)
RTOL, ATOL = 1e-4, 1e-5  # all-reduce sums in another order than one big batch's mean


def rank_main(paths: list[str], ckpt_dir: str) -> list[dict]:
    """Runs on every rank: each file in turn trains with the learner's code; returns what was observed."""
    out = []
    for i, path in enumerate(paths):
        with own_rendezvous(f"file{i}"):  # the learner's setup() makes the process group, once per file
            out.append(_observe(path, Path(ckpt_dir) / str(i)))
    return out


def _observe(path: str, ckpt_dir: Path) -> dict:
    with SaveSpy() as saves:  # before the import, so ``from torch import save`` binds the spy too
        learner = load_learner(path)
        learner.setup()
        if not dist.is_initialized():
            raise RuntimeError("setup() returned but no process group is initialised")
        rank = dist.get_rank()
        model = make_mlp(seed=1000 + rank, **MODEL).to(distlab.device())  # a different start on every rank
        initial = cpu_state(model)
        data = RecordingDataset(digits())
        saves.paths.clear()  # only what train_ddp saves counts
        with CapturedPrints() as out:
            trained = learner.train_ddp(model, data, checkpoint_path=str(ckpt_dir / "model.pt"), **CONFIG)
    echo(out.lines)
    final = cpu_state(trained if trained is not None else model)
    learner.teardown()
    return {
        "rank": rank, "initial": initial, "final": final, "accessed": data.accessed,
        "printed": out.lines, "saves": saves.paths, "still_initialized": dist.is_initialized(),
    }


@dataclass
class Run:
    """One file's run at one world size: every rank's observation, and where rank 0 was told to save."""

    ranks: list[dict]
    world: int
    checkpoint: Path

    @property
    def samples_per_rank(self) -> int:
        return len(digits()) // self.world

    def epoch(self, rank: int, e: int) -> list[int]:
        local = self.samples_per_rank
        return self.ranks[rank]["accessed"][e * local:(e + 1) * local]

    def global_batches(self) -> list[list[int]]:
        """Every optimizer step's global batch: the ranks' local batches, concatenated in rank order."""
        local, bs = self.samples_per_rank, CONFIG["batch_size"]
        return [sum((self.epoch(r, e)[s:s + bs] for r in range(self.world)), [])
                for e in range(CONFIG["epochs"]) for s in range(0, local, bs)]


@criterion("[W={world}] same parameters on every rank", points=2)
def same_parameters(run: Run) -> Verdict:
    # Exact: DDP leaves every rank with the same bits (same broadcast start, same all-reduced grads).
    final = run.ranks[0]["final"]
    gaps = [(parity(r["final"], final, rtol=0, atol=0), r["rank"]) for r in run.ranks[1:]]
    worst, other = max(gaps, key=lambda g: g[0].max_abs_diff)
    if all(g.ok for g, _ in gaps):
        return passed()
    return failed(f"rank 0 and rank {other} ended with different weights (max abs difference "
                  f"{worst.max_abs_diff:.3g} in '{worst.worst}'): wrap the model in DistributedDataParallel so "
                  "it broadcasts rank 0's weights and averages gradients")


@criterion("[W={world}] each rank reads its own shard", points=2)
def own_shard(run: Run) -> Verdict:
    n, local, epochs = len(digits()), run.samples_per_rank, CONFIG["epochs"]
    hint = "did you pass a DistributedSampler to the DataLoader?"
    read = len(run.ranks[0]["accessed"]) / epochs
    if any(len(r["accessed"]) != epochs * local for r in run.ranks):
        return failed(f"each rank should read {local} samples per epoch ({n} / {run.world} ranks) but rank 0 "
                      f"read {read:g}: {hint}")
    for e in range(epochs):
        seen = [set(run.epoch(r, e)) for r in range(run.world)]
        overlap, covered = len(seen[0] & seen[1]), len(set().union(*seen))
        if overlap or covered != n:
            return failed(f"in epoch {e} ranks 0 and 1 shared {overlap} samples and together covered "
                          f"{covered} of {n}: {hint}")
    return passed()


@criterion("[W={world}] new shuffle every epoch", points=1, requires=[own_shard])
def reshuffled(run: Run) -> Verdict:
    if run.epoch(0, 0) != run.epoch(0, 1):
        return passed()
    return failed("epoch 0 and epoch 1 read the samples in the same order: call sampler.set_epoch(epoch) at "
                  "the start of every epoch")


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


@criterion("[W={world}] matches single-process training", points=2, requires=[own_shard])
def matches_reference(run: Run) -> Verdict:
    r0, bs = run.ranks[0], CONFIG["batch_size"]
    match = parity(r0["final"], _reference(r0["initial"], run.global_batches()), rtol=RTOL, atol=ATOL)
    diff = match.max_abs_diff
    measured = {f"W{run.world}_max_abs_diff_vs_reference": diff}
    if match.ok:
        return passed(f"max abs difference {diff:.2g}", **measured)
    return failed(f"weights differ from one process trained on the same global batches of {run.world}x{bs} "
                  f"(max abs difference {diff:.3g} in '{match.worst}', tolerance rtol={RTOL}, atol={ATOL}): "
                  f"use SGD with lr={CONFIG['lr']} on the mean cross-entropy, one step per batch, and let DDP "
                  "average the gradients (do not also all-reduce them yourself)", **measured)


@criterion("[W={world}] only rank 0 logs", points=1)
def only_rank0_logs(run: Run) -> Verdict:
    noisy = [(r["rank"], r["printed"]) for r in run.ranks[1:] if r["printed"]]
    if noisy:
        rank, lines = noisy[0]
        return failed(f"rank {rank} printed {len(lines)} lines (first: {lines[0]!r}): print only where "
                      "dist.get_rank() == 0")
    if not run.ranks[0]["printed"]:
        return failed("rank 0 printed nothing: print the loss of each epoch on rank 0")
    return passed()


@criterion("[W={world}] rank 0 saves the model once", points=1)
def rank0_saves_once(run: Run) -> Verdict:
    r0 = run.ranks[0]
    savers = [r["rank"] for r in run.ranks if r["saves"]]
    if not savers:
        return failed("nothing was saved with torch.save: save model.module.state_dict() to checkpoint_path "
                      "on rank 0")
    if savers != [0]:
        return failed(f"torch.save was called on ranks {savers}: save on rank 0 only")
    if len(r0["saves"]) != 1 or not run.checkpoint.is_file():
        return failed(f"no checkpoint at the checkpoint_path given (rank 0 saved to {r0['saves']})")
    state = torch.load(run.checkpoint, weights_only=True)
    if set(state) != set(r0["final"]):
        return failed("the saved file's keys do not match the model's (a 'module.' prefix? save "
                      "model.module.state_dict())")
    if not (same := parity(state, r0["final"], rtol=0, atol=0)):
        return failed(f"the saved weights differ from the trained ones (in '{same.worst}')")
    return passed()


@criterion("[W={world}] teardown destroys the process group", points=1)
def teardown_destroys(run: Run) -> Verdict:
    left_open = [r["rank"] for r in run.ranks if r["still_initialized"]]
    if not left_open:
        return passed()
    return failed(f"after teardown() the process group was still initialised on ranks {left_open}: call "
                  "dist.destroy_process_group()")


CRITERIA = [same_parameters, own_shard, reshuffled, matches_reference, only_rank0_logs, rank0_saves_once,
            teardown_destroys]


def grade(paths: Sequence[Path], world_sizes: tuple[int, ...] = WORLD_SIZES) -> list[ExerciseReport]:
    """Grade the files at ``paths`` (tests pass fewer ``world_sizes`` to run faster); one report each.

    One launch per world size grades every file; the world sizes are launched at once: most of a
    launch is process start-up (importing torch), which two launches overlap on the machine's cores,
    and each job rendezvouses on its own free port. Each world size is worth the same share.
    """
    reports = [EXERCISE.new_report() for _ in paths]
    timeout = launch_timeout(EXERCISE, files=len(paths))  # the launches run side by side: each gets it all
    with tempfile.TemporaryDirectory(prefix="ex01-") as tmp, ThreadPoolExecutor(len(world_sizes)) as pool:
        folders = {w: [Path(tmp) / f"W{w}" / str(i) for i in range(len(paths))] for w in world_sizes}
        for folder in sum(folders.values(), []):
            folder.mkdir(parents=True)  # here, before the launch hands the scratch space to the learner user
        jobs = {w: pool.submit(launch_files, rank_main, paths, world=w, timeout=timeout,
                               args=(str(Path(tmp) / f"W{w}"),)) for w in world_sizes}
        for world in world_sizes:
            runs, wall_s = jobs[world].result()  # a failed launch raises here, as a sequential one would
            for report, ranks, folder in zip(reports, runs, folders[world]):
                report.judge(CRITERIA, Run(ranks, world, folder / "model.pt"), world=world)
                report.measurements[f"W{world}_launch_s"] = round(wall_s, 2)
    return [r.scale_to() for r in reports]
