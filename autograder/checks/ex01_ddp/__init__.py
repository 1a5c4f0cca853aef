"""Exercise 1 check: single process -> DDP, graded at world sizes 2 and 4.

Each rank builds the model from a *different* seed before handing it to the
learner, so a run that skips DDP's initial broadcast ends with ranks apart.
The data set records which indices each rank read; from those logs the
grader rebuilds every global batch and trains a single-process reference on
them, which the ranks' final parameters must match (CS336-style parity).
Inside the ranks (``probes``) global hooks also record which module
each forward entered (the DDP wrapper or the model inside it), each batch's
size, the weights at the first forward, every DDP built around the model,
the gradients and lr at the first optimizer step, and gradients all-reduced
by hand. ``evaluate_ddp`` then evaluates one model (the same on every rank)
over 21 samples, which neither world size divides: DistributedSampler pads the
shards by repeating samples, and the metric must equal one process's over the
21 (the padding torchmetrics' and accelerate's ``gather_for_metrics`` remove); then over 20, which both divide
(no padding: every sample read counts). On the CPU the 4 ranks run as 2 nodes of 2 (``rank.nodes``: torchrun's
LOCAL_RANK and LOCAL_WORLD_SIZE say so), where ``LOCAL_RANK == 0`` taken for rank 0 logs and saves twice.
Part 2 (``bucketed``): the learner's ``BucketedDDP``, DDP's buckets by hand (Li et al., 2020), trained by the
grader's loop at four caps that make different buckets, then with a parameter the forward never uses; each
gradient's "ready" and each collective are logged in order, so that the buckets and the overlap are judged
from events, not wall-clock.
Each part (``train_ddp``, ``evaluate_ddp``, ``BucketedDDP``, ``teardown``) is kept as it returns, and one that
ends its launch (an error, a hang, gloo's abort on buckets of unequal sizes) is reported and the file launched
again without it: it costs its own marks only (``grader.parts``; a ``setup`` that ends it ends the grading).
A failure names the first cause below that explains them:

| mistake | message |
|---|---|
| forward called on model.module | "all 46 forward passes called model.module(x), bypassing DDP's gradient ..." |
| ranks not synchronised at the start | "the ranks made the same updates but started from different weights ..." |
| model not wrapped in DDP | "the model was never wrapped in DistributedDataParallel: each rank trained alone ..." |
| no DistributedSampler | "every rank read all 1792 samples in each epoch (...): pass a DistributedSampler ..." |
| samplers seeded differently on each rank | "ranks 0 and 1 shared 436 samples in epoch 0 ..." |
| the training sampler built with drop_last=True | "train_ddp built its DistributedSampler with drop_last=True: ..." |
| DistributedSampler built with shuffle=False | "rank 0 read its shard in index order (0, 2, 4, ...) ..." |
| sampler.set_epoch not called | "epoch 0 and epoch 1 read the samples in the same shuffled order: ..." |
| sampler not given the seed | "rank 0 read epoch 0's samples in the order ... with seed=0, its default, not ..." |
| batch_size treated as global | "each rank read 20 samples per step, not batch_size=40: batch_size is per rank ..." |
| the DataLoader built with drop_last=True | "rank 0 read 880 of its 896 samples in each epoch (22 batches of 40) ..." |
| learning rate changed | "the optimizer's learning rate was 0.4, 2x the lr=0.2 given ..." |
| gradients all-reduced by hand on top of DDP | "... 2x the reference's: the gradients were also summed by hand ..." |
| loss multiplied by the world size | "the first step's gradient is 2x the reference's on the same global batch: ..." |
| loss divided by the world size | "the first step's gradient is 0.5x the reference's on the same global batch: ..." |
| nothing printed on rank 0 | "rank 0 printed nothing: print the loss of each epoch on rank 0" |
| evaluation set read whole on every rank | "rank 0 read 21 samples of the 21-sample evaluation set, the whole ..." |
| the sampler's padding counted | "... the mean over the 24 samples the samplers dealt out, not the data set's 21 ..." |
| DistributedSampler built with drop_last=True | "... the metric of only 20 of the 21 samples ..." |
| metric not all-reduced | "the ranks returned different metrics (each its own shard's): ..." |
| the ranks' means averaged | "... the average of the ranks' means; ... the shards hold [6, 5, 5, 5] ..." |
| DataLoader given a sampler and shuffle=True | "a DataLoader takes either sampler= or shuffle=True ..." (raised) |
| device_ids given for a CPU model | "device_ids=[...] is for a model on one GPU ..." (raised) |
| init_process_group called twice | "the process group was initialised twice ..." (raised) |
| parameters not broadcast from rank 0 | "after BucketedDDP(...) rank 1's weights differed from rank 0's ..." |
| all-reduce not waited for | "finish_gradient_synchronization returned while 2 asynchronous all-reduce(s) ..." |
| gradients summed, not averaged | "every .grad held 2x the mean gradient when the optimizer stepped ..." |
| gradients divided by the world size twice | "every .grad held 1/2 of the mean gradient when the optimizer ..." |
| a bucket all-reduced before its gradients were accumulated | "the all-reduce at ... started when the gradients ..." |
| reduced gradients not written back | "3 all-reduce(s) ran, but the .grad of '4.bias', ... still held ..." |
| one all-reduce per parameter | "6 all-reduces per step, one per parameter; a cap of 1448 bytes makes 3 buckets ..." |
| buckets filled in registration order | "the all-reduces moved [...] elements: buckets filled in the order of ..." |
| bucket_cap_mb read as 10**6 bytes | "... the buckets of a 1431-byte cap: bucket_cap_mb=0.00143051 is in MiB ..." |
| buckets not readied for the next backward | "step 0's all-reduces were the buckets the cap implies ..." |
| bucket closed past the cap | "... a bucket was closed only once its bytes exceeded the cap of 1448 ..." |
| a synchronous all-reduce | "the all-reduce at ... was synchronous (async_op not set): the backward waited ..." |
| an all-reduce waited on inside the backward | "the all-reduce started at ... was waited on before ..." |
| all-reduces only after the backward | "all 3 all-reduces started after the backward, in finish_... ..." |
| buckets launched at the end of the backward | "the first all-reduce started only after the first layer's ..." |
| an unused parameter raised an error that does not name it | "with a parameter the forward does not use (...), ..." |
| the bucket of an unused parameter never launched | "..., the all-reduces moved 3016 of the model's 3456 ..." |
"""
from __future__ import annotations

import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import torch
from torch import nn

from distlab.data import digits
from distlab.models import cpu_state, make_mlp

from ...grader.diagnosis import diagnose
from ...grader.parity import parity
from ...grader.registry import Exercise
from ...grader.report import ExerciseReport, Verdict, criterion, failed, passed
from .causes import (KNOWN_ERRORS, batch_not_per_rank, double_all_reduce, inner_forward, loader_drop_last,
                     loss_over_world, loss_times_world, lr_changed, no_sampler, no_set_epoch, not_synchronised,
                     not_wrapped, sampler_order, seed_not_given, seeded_apart, silent_rank0, train_drop_last,
                     unshuffled)
from .bucketed import causes as bucketed_causes  # noqa: F401 - its @mistake functions are the check's
from .bucketed import criteria as bucketed_criteria
from .evaluation import evaluates_once, evaluates_without_autograd
from .observations import RankObservation, Run
from .probes import ATOL, CONFIG, MODEL, RTOL, checkpoint_dir, rank_main

if TYPE_CHECKING:  # imported where used: see grade
    from ...grader.parts import Parted

__all__ = ["CRITERIA", "EXERCISE", "KNOWN_ERRORS", "WORLD_SIZES", "grade"]

EXERCISE = Exercise(number=1, name="ddp", filename="ex01_ddp.py", max_score=10, time_limit=150)
WORLD_SIZES = (2, 4)

# The causes (causes.py) each criterion asks for, most specific first.
RANKS_APART = [inner_forward, not_synchronised, not_wrapped]
SHARDS = [no_sampler, loader_drop_last, seeded_apart]
SHUFFLE = [unshuffled, no_set_epoch]
STEP = [batch_not_per_rank, lr_changed, double_all_reduce, loss_times_world, loss_over_world]


@criterion("[W={world}] same parameters on every rank", points=2)
def same_parameters(run: Run) -> Verdict:
    # Exact: DDP leaves every rank with the same bits (same broadcast start, same all-reduced grads).
    final = run.ranks[0].final
    gaps = [(parity(r.final, final, rtol=0, atol=0), r.rank) for r in run.ranks[1:]]
    worst, other = max(gaps, key=lambda g: g[0].max_abs_diff)
    if all(g.ok for g, _ in gaps):
        return passed()
    return failed(diagnose(RANKS_APART, run) or f"rank 0 and rank {other} ended with different weights (max abs "
                  f"difference {worst.max_abs_diff:.3g} in '{worst.worst}')")


@criterion("[W={world}] each rank reads its own shard", points=2)
def own_shard(run: Run) -> Verdict:
    n, local, epochs = len(digits()), run.samples_per_rank, CONFIG["epochs"]
    read = len(run.ranks[0].accessed) / epochs
    if any(len(r.accessed) != epochs * local for r in run.ranks):
        return failed(diagnose(SHARDS, run) or f"each rank should read {local} samples per epoch ({n} / "
                      f"{run.world} ranks) but rank 0 read {read:g}")
    for e in range(epochs):
        seen = [set(run.epoch(r, e)) for r in range(run.world)]
        overlap, covered = len(seen[0] & seen[1]), len(set().union(*seen))
        if overlap or covered != n:
            return failed(diagnose(SHARDS, run) or f"in epoch {e} ranks 0 and 1 shared {overlap} samples and "
                          f"together covered {covered} of {n}")
    return passed()


@criterion("[W={world}] shuffled by the given seed, anew every epoch", points=1, requires=[own_shard])
def reshuffled(run: Run) -> Verdict:
    if run.epoch(0, 0) == run.epoch(0, 1):
        return failed(diagnose(SHUFFLE, run) or "epoch 0 and epoch 1 read the samples in the same order")
    seed = CONFIG["seed"]
    for e in range(CONFIG["epochs"]):
        for r in range(run.world):
            if run.epoch(r, e) != sampler_order(run.world, r, e, seed):
                return failed(diagnose([seed_not_given], run) or
                              f"rank {r} read epoch {e}'s samples in another order than DistributedSampler(dataset, "
                              f"shuffle=True, seed={seed}) with set_epoch({e}) gives")
    return failed(why) if (why := train_drop_last(run)) else passed()  # the contract's sampler, whole


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


@criterion("[W={world}] matches single-process training", points=2, requires=[own_shard, same_parameters])
def matches_reference(run: Run) -> Verdict:
    r0, bs = run.ranks[0], CONFIG["batch_size"]
    match = parity(r0.final, _reference(r0.initial, run.global_batches()), rtol=RTOL, atol=ATOL)
    diff = match.max_abs_diff
    measured = {f"W{run.world}_max_abs_diff_vs_reference": diff}
    if match.ok:
        return passed(f"max abs difference {diff:.2g}", **measured)
    steps = len(run.global_batches())
    return failed(diagnose(STEP, run) or f"weights differ from one process trained on the same global batches of "
                  f"{run.world}x{bs} (max abs difference {diff:.3g} in '{match.worst}', tolerance rtol={RTOL}, "
                  f"atol={ATOL}; rank 0's optimizer stepped {r0.steps} times, {steps} expected): use SGD with "
                  f"lr={CONFIG['lr']} on the mean cross-entropy, one step per batch", **measured)


@criterion("[W={world}] only rank 0 logs", points=1)
def only_rank0_logs(run: Run) -> Verdict:
    noisy = [r for r in run.ranks[1:] if r.printed]
    if noisy:
        r = noisy[0]
        at = f", printed at {r.printed_at}" if r.printed_at else ""
        return failed(f"rank {r.rank} printed {len(r.printed)} lines (first: {r.printed[0]!r}{at}): print only "
                      "where dist.get_rank() == 0")
    if message := silent_rank0(run):
        return failed(message)
    return passed()


@criterion("[W={world}] rank 0 saves the model once", points=1)
def rank0_saves_once(run: Run) -> Verdict:
    r0 = run.ranks[0]
    savers = [r.rank for r in run.ranks if r.saves]
    if not savers:
        return failed("nothing was saved with torch.save: save model.module.state_dict() to checkpoint_path "
                      "on rank 0")
    if savers != [0]:
        return failed(f"torch.save was called on ranks {savers}: save on rank 0 only")
    if len(r0.saves) != 1 or not run.checkpoint.is_file():
        return failed(f"no checkpoint at the checkpoint_path given (rank 0 saved to {r0.saves})")
    state = torch.load(run.checkpoint, weights_only=True)
    if set(state) != set(r0.final):
        return failed("the saved file's keys do not match the model's (a 'module.' prefix? save "
                      "model.module.state_dict())")
    if not (same := parity(state, r0.final, rtol=0, atol=0)):
        return failed(f"the saved weights differ from the trained ones (in '{same.worst}')")
    return passed()


@criterion("[W={world}] setup() makes the process group, teardown() destroys it", points=1)
def teardown_destroys(run: Run) -> Verdict:
    if raised := [(r.rank, r.setup_error) for r in run.ranks if r.setup_error]:
        backend = " (distlab.backend() names gloo where there is no GPU)" if "NCCL" in raised[0][1] else ""
        return failed(f"setup() raised on every rank, on rank {raised[0][0]}: {raised[0][1]}{backend}; the grader "
                      "made the process group in its place, so that your other functions were graded")
    if raised := [(r.rank, r.teardown_error) for r in run.ranks if r.teardown_error]:
        return failed(f"teardown() raised on rank {raised[0][0]}: {raised[0][1]}")
    left_open = [r.rank for r in run.ranks if r.still_initialized]
    if not left_open:
        return passed()
    return failed(f"after teardown() the process group was still initialised on ranks {left_open}: call "
                  "dist.destroy_process_group()")


BUCKETED_CRITERIA = bucketed_criteria.CRITERIA
CRITERIA = [same_parameters, own_shard, reshuffled, matches_reference, only_rank0_logs, rank0_saves_once,
            evaluates_once, evaluates_without_autograd, teardown_destroys, *BUCKETED_CRITERIA]


# The parts of a file, in the order the ranks run them (probes._observe), after the learner's setup().
PARTS = ["train", "evaluate", "bucketed", "teardown"]
# Each part's criteria, in CRITERIA's order, with the function it grades.
JUDGED = {"train": ("train_ddp", CRITERIA[:6]), "evaluate": ("evaluate_ddp", CRITERIA[6:8]),
          "teardown": ("teardown", [teardown_destroys]), "bucketed": ("BucketedDDP", BUCKETED_CRITERIA)}


def _ranks(file: Parted, world: int) -> list[RankObservation]:
    """Each rank's observation, its parts in one (a part that ended its launch stands empty: not judged)."""
    train = file.part("train") or [RankObservation(rank=r, initial={}).to_wire() for r in range(world)]
    later = [file.part(p) or [{} for _ in range(world)] for p in ("evaluate", "teardown")]
    bucketed = file.part("bucketed") or [None] * world
    return [RankObservation.from_wire({**t, **e, **d, "bucketed": b})
            for t, e, d, b in zip(train, *later, bucketed)]


def grade(paths: Sequence[Path], world_sizes: tuple[int, ...] = WORLD_SIZES) -> list[ExerciseReport]:
    """Grade the files at ``paths`` (tests pass fewer ``world_sizes`` to run faster); one report each.

    One launch per world size grades every file; the world sizes are launched at once: most of a
    launch is process start-up (importing torch), which two launches overlap on the machine's cores,
    and each job rendezvouses on its own free port. Each world size is worth the same share.
    """
    # Here, not at the top: every rank imports this package to reach ``probes``, and the launcher's modules
    # (psutil, the warm server's client) cost each of the six ranks about 25 ms it has no use for.
    from ...grader.launches import launch_timeout
    from ...grader.parts import judge_parts, launch_parts

    reports = [EXERCISE.new_report() for _ in paths]
    timeout = launch_timeout(EXERCISE, files=len(paths))  # the launches run side by side: each gets it all
    with tempfile.TemporaryDirectory(prefix="ex01-") as tmp, ThreadPoolExecutor(len(world_sizes)) as pool:
        for world in world_sizes:
            for path in paths:  # here, before the launch hands the scratch space to the learner user
                checkpoint_dir(Path(tmp) / f"W{world}", path).mkdir(parents=True, exist_ok=True)
        jobs = {w: pool.submit(launch_parts, rank_main, paths, world=w, timeout=timeout, parts=PARTS,
                               args=(str(Path(tmp) / f"W{w}"),), known=KNOWN_ERRORS)
                for w in world_sizes}
        for world in world_sizes:
            parted, wall_s = jobs[world].result()  # a failed launch raises here, as a sequential one would
            for report, path, file in zip(reports, paths, parted):
                run = Run(_ranks(file, world), world, checkpoint_dir(Path(tmp) / f"W{world}", path) / "model.pt")
                judge_parts(report, JUDGED, file.ended, run, world=world)
                if wall_s is not None:
                    report.measurements[f"W{world}_launch_s"] = round(wall_s, 2)
    return [r.scale_to() for r in reports]
