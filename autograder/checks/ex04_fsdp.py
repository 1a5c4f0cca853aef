"""Exercise 4 check: FSDP2 per-block sharding, graded at world sizes 2 and 4.

Every rank builds the same :class:`~distlab.resmlp.ResidualMLP` and trains it
with the learner's ``train_fsdp`` on its slice of each global batch. The
grader wraps the learner's ``train_step`` to observe one step from inside the
rank: the placements and storage bytes of parameters, gradients and Adam
state (compared with the exact padded figure of :func:`distlab.fsdp_memory.expected_bytes`),
and the peak of live tensor storage during the step (CPU:
:class:`~distlab.fsdp_memory.LiveStorageTracker`; GPU: ``max_memory_allocated``)
against :func:`distlab.fsdp_memory.peak_bound`.
The verdicts are computed here, against a single-process Adam run on the
same global batches (parity, assert_close: reduce-scatter sums in another
order than one big batch).
"""
from __future__ import annotations

import functools
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
import torch.distributed as dist
from torch import nn

from distlab import init_distributed
from distlab.data import synthetic_classification
from distlab.fsdp_memory import (UNITS_IN_FLIGHT, LiveStorageTracker, activation_bytes, expected_bytes, full_shapes,
                                 measured_bytes, peak_bound, unsharded_bytes)
from distlab.resmlp import make_resmlp

from ..grading import launch_files, launch_timeout
from ..harness import CapturedPrints, SaveSpy, echo, load_learner
from ..parity import parity
from ..registry import Exercise
from ..report import ExerciseReport, Verdict, criterion, failed, passed

# A launch of the solution took 22 s at W=2 and 24 s at W=4 on 2 cores at load 6 (32 s and 40 s at
# load 7; less when idle). The two launches run one after the other and share what time_limit leaves
# after the grader's own start-up and the reference, 4 : 5 (40 s and 50 s), so a hang is reported as a
# LaunchTimeout naming the ranks, not cut off by the CLI. Each more file in a launch (the tests'
# mutants) costs one more train_fsdp with one tracked step, about 10 s at load 6: 20 s leaves 2x.
EXERCISE = Exercise(number=4, name="fsdp", filename="ex04_fsdp.py", max_score=10, time_limit=110)
WORLD_SIZES = (2, 4)
LAUNCH_SHARES = {2: 4, 4: 5}
PER_EXTRA_FILE_S = 20
MODEL = dict(in_features=64, hidden=90, out_features=10, depth=8)
STEPS, MICRO_BATCH, LR, SEED = 4, 8, 1e-2, 11
MEASURE_STEP = 2  # the second step: Adam's state exists before it, so the step sees the steady state
RTOL, ATOL = 1e-3, 1e-4  # reduce-scatter sums in another order; Adam's 1/sqrt(v) amplifies it on tiny gradients
PARTS = ("params", "grads", "optimizer")


def _data():
    return synthetic_classification(256, MODEL["in_features"], MODEL["out_features"], seed=SEED)  # no sklearn


def _global_batches(world: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(SEED)
    perm = torch.randperm(len(_data()), generator=g)
    size = MICRO_BATCH * world
    return [perm[s * size:(s + 1) * size] for s in range(STEPS)]


def rank_main(paths: list[str], outdir: str) -> list[dict]:
    """Runs on every rank: each file in turn trains with the learner's code; one observation per file.

    The grader makes the process group (the learner's file does not), so every file uses the same one.
    """
    device = init_distributed()
    return [_observe(p, Path(outdir) / f"full_state-{i}.pt", device) for i, p in enumerate(paths)]


def _observe(path: str, export: Path, device: torch.device) -> dict:
    """One file on this rank: the learner trains; the wrapped ``train_step`` observes one step."""
    with SaveSpy() as saves:  # before the import, so ``from torch import save`` binds the spy too
        return _train_observed(load_learner(path), export, device, saves)


def _train_observed(learner, export: Path, device: torch.device, saves: SaveSpy) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    model = make_resmlp(seed=SEED, **MODEL).to(device)  # the same start on every rank
    shapes = full_shapes(model)
    x_all, y_all = _data().tensors
    mine = slice(rank * MICRO_BATCH, (rank + 1) * MICRO_BATCH)  # this rank's slice of each global batch
    batches = [(x_all[idx[mine]].to(device), y_all[idx[mine]].to(device)) for idx in _global_batches(world)]
    seen = _observe_step(learner, device)
    with CapturedPrints() as out:
        returned = learner.train_fsdp(model, batches, lr=LR, export_path=str(export))
    echo(out.lines)
    trained = returned[0] if isinstance(returned, tuple) else model
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    final = get_model_state_dict(trained, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    dist.barrier()
    return {"rank": rank, "world": world, "shapes": {k: list(v) for k, v in shapes.items()},
            "final": final if rank == 0 else {}, "saves": saves.paths, "printed": out.lines,
            "expected": expected_bytes(shapes, world, rank), "device": device.type, "export": str(export),
            **seen}


def _observe_step(learner, device: torch.device) -> dict:
    """Wrap the learner's ``train_step`` so that step ``MEASURE_STEP`` is measured; returns what it will see."""
    seen: dict = {"steps": 0}
    real_step = learner.train_step

    def observed_step(model, optimizer, x, y):
        seen["steps"] += 1
        if seen["steps"] != MEASURE_STEP:
            return real_step(model, optimizer, x, y)
        before = measured_bytes(model, optimizer)
        loss, peak = _step_peak(real_step, model, optimizer, (x, y), device, sum(before.values()))
        seen.update(before=before, after=measured_bytes(model, optimizer), peak=peak, **_layout(model, optimizer),
                    bound=peak_bound(sum(before.values()), model, activation_bytes(MICRO_BATCH, **MODEL)))
        return loss

    learner.train_step = observed_step  # train_fsdp looks it up in its module when it calls it
    return seen


def _step_peak(step, model: nn.Module, optimizer, batch: tuple, device: torch.device, state_bytes: int):
    """Run one ``step`` and return its loss and the peak bytes during it (the state it starts from included)."""
    params = list(model.parameters())
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        live = torch.cuda.memory_allocated()  # state + cuBLAS workspace + the batch, already there
        loss = step(model, optimizer, *batch)
        torch.cuda.synchronize()
        return loss, state_bytes + torch.cuda.max_memory_allocated() - live
    with LiveStorageTracker() as mem:
        mem.track(*params, *(p.grad for p in params if p.grad is not None),
                  *(v for s in optimizer.state.values() for v in s.values()))
        loss = step(model, optimizer, *batch)
    return loss, mem.peak


def _layout(model: nn.Module, optimizer) -> dict:
    """How the parameters are sharded and whether the optimizer holds them."""
    params = list(model.parameters())
    opt_ids = {id(p) for g in optimizer.param_groups for p in g["params"]}
    return {"placements": sorted({str(getattr(p, "placements", "plain tensor")) for p in params}),
            "dtensors": sum(type(p).__name__ == "DTensor" for p in params), "n_params": len(params),
            "opt_foreign": sum(id(p) not in opt_ids for p in params),
            "blocks_wrapped": sum(type(b).__name__.startswith("FSDP") for b in model.blocks)}


@functools.cache
def reference(world: int) -> dict:
    """Single-process Adam on the whole global batch of every step (the same for every file graded)."""
    model = make_resmlp(seed=SEED, **MODEL)
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    x_all, y_all = _data().tensors
    for idx in _global_batches(world):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x_all[idx]), y_all[idx]).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@dataclass
class Run:
    """One file's run at one world size: every rank's observation (rank order)."""

    ranks: list[dict]

    @property
    def world(self) -> int:
        return self.ranks[0]["world"]

    @property
    def stepped(self) -> bool:
        """Whether the measured step ran at all (else there is nothing to judge)."""
        return "before" in self.ranks[0]

    def bytes_summary(self) -> str:
        r0 = self.ranks[0]
        total = sum(r0["expected"][p] for p in PARTS)
        unsharded = unsharded_bytes(r0["shapes"])
        pad = max(r["expected"]["padding"] for r in self.ranks)
        return (f"rank 0 holds {sum(r0['after'][p] for p in PARTS)} B of params+grads+Adam state (expected "
                f"{total} B; padding up to {pad} B per rank in params and again in grads) vs {unsharded} B "
                f"unsharded (1/W would be {unsharded // self.world} B)")


def _mb(n: float) -> str:
    return f"{n / 2**20:.3f} MiB"


@criterion("[W={world}] parameters are DTensors sharded on dim 0", points=1)
def sharded_on_dim0(run: Run) -> Verdict:
    bad = [r for r in run.ranks if r["dtensors"] != r["n_params"] or r["placements"] != ["(Shard(dim=0),)"]]
    if not bad:
        return passed()
    r = bad[0]
    return failed(f"on rank {r['rank']} {r['dtensors']} of {r['n_params']} parameters are DTensors, placements "
                  f"{r['placements']}: call fully_shard on the blocks and the root")


@criterion("[W={world}] optimizer built after sharding", points=1)
def optimizer_after_sharding(run: Run) -> Verdict:
    foreign = [r for r in run.ranks if r["opt_foreign"]]
    if not foreign:
        return passed()
    r = foreign[0]
    return failed(f"on rank {r['rank']} the optimizer does not hold {r['opt_foreign']} of the model's "
                  f"{r['n_params']} parameters: it was built before fully_shard replaced them with DTensors, so "
                  "it updates stale tensors. Build the optimizer after shard(model)")


@criterion("[W={world}] each rank holds 1/{world} of params, grads and Adam state", points=2)
def holds_its_share(run: Run) -> Verdict:
    # Exact, padding included: FSDP2's layout is deterministic (expected_bytes explains it).
    measured, wrong = {}, []
    for r in run.ranks:
        for part in PARTS:
            exp, got = r["expected"][part], r["after"][part]
            measured[f"W{run.world}_rank{r['rank']}_{part}_bytes"] = got
            if got != exp:
                wrong.append(f"rank {r['rank']} {part}: expected {exp} B, measured {got} B")
    if not wrong:
        return passed(run.bytes_summary(), **measured)
    return failed("; ".join(wrong[:4]) + " (expected = ceil(rows/W) padded rows per param and grad, the rank's "
                  "real rows for exp_avg and exp_avg_sq, 4 B for each step)", **measured)


@criterion("[W={world}] peak memory within the per-block bound", points=2)
def peak_within_bound(run: Run) -> Verdict:
    measured = {}
    for r in run.ranks:
        measured[f"W{run.world}_rank{r['rank']}_peak_bytes"] = r["peak"]
        measured[f"W{run.world}_rank{r['rank']}_peak_bound_bytes"] = r["bound"]["bound"]
    worst = max(run.ranks, key=lambda r: r["peak"] / r["bound"]["bound"])
    b = worst["bound"]
    how = "torch.cuda.max_memory_allocated" if worst["device"] == "cuda" else "live tensor storage"
    explain = (f"peak {_mb(worst['peak'])} ({how}) on rank {worst['rank']} vs bound {_mb(b['bound'])} = "
               f"sharded state {_mb(b['state'])} + {UNITS_IN_FLIGHT} x largest unit {_mb(b['unit'])} + "
               f"activations {_mb(b['activations'])}")
    if worst["peak"] <= b["bound"]:  # the worst ratio is within its bound, so every rank's is
        return passed(explain, **measured)
    if worst["blocks_wrapped"] == 0:
        return failed(f"only the root is wrapped (0 of {MODEL['depth']} blocks are fully_shard units), so "
                      f"forward and backward unshard the whole model at once: {explain}. Call fully_shard on "
                      "each block before the root", **measured)
    return failed(f"{explain}: shard each block with its own fully_shard call, then the root", **measured)


@criterion("[W={world}] matches single-process training", points=2)
def matches_reference(run: Run) -> Verdict:
    par = parity(run.ranks[0]["final"], reference(run.world), rtol=RTOL, atol=ATOL)
    measured = {f"W{run.world}_max_abs_diff_vs_reference": par.max_abs_diff}
    if par.ok:
        return passed(f"max abs difference {par.max_abs_diff:.2g}", **measured)
    where = (f"max abs difference {par.max_abs_diff:.3g} in '{par.worst}'" if math.isfinite(par.max_abs_diff)
             else f"the trained state dict does not match the model's: {par.worst}")
    return failed(f"after {STEPS} Adam steps (lr={LR}) the weights differ from one process trained on the "
                  f"global batches of {run.world}x{MICRO_BATCH} ({where}, rtol={RTOL}, atol={ATOL}): zero the "
                  "gradients, step once per micro-batch, and build the optimizer on the sharded parameters",
                  **measured)


@criterion("[W={world}] rank 0 exports the full state dict once", points=2)
def exports_once(run: Run) -> Verdict:
    r0 = run.ranks[0]
    export, final = Path(r0["export"]), r0["final"]
    savers = [r["rank"] for r in run.ranks if r["saves"]]
    if savers and savers != [0]:
        return failed(f"torch.save was called on ranks {savers}: every rank must call get_model_state_dict "
                      "(it is a collective), but only rank 0 saves")
    if not savers:
        return failed(f"nothing was saved to {export}: torch.save the full state dict to export_path on rank 0")
    if not export.is_file():
        return failed(f"rank 0 saved to {r0['saves']}, not to the export_path given")
    saved = torch.load(export, weights_only=True)
    if set(saved) != set(reference(run.world)) or any(type(v) is not torch.Tensor for v in saved.values()):
        return failed(f"the saved dict has keys {sorted(saved)[:3]}... of types "
                      f"{sorted({type(v).__name__ for v in saved.values()})}: save the full state dict "
                      "(full_state_dict=True, cpu_offload=True) so it holds plain tensors")
    if any(not torch.equal(saved[k], final[k]) for k in final):
        return failed("the saved weights differ from the trained model's: export after training")
    return passed()


CRITERIA = [sharded_on_dim0, optimizer_after_sharding, holds_its_share, peak_within_bound, matches_reference,
            exports_once]


def _judge(report: ExerciseReport, run: Run, wall_s: float) -> None:
    """One file at one world size: the criteria, or "did not run" when the measured step never came."""
    tag = f"[W={run.world}]"
    if not run.stepped:
        report.notes.clear()  # what an earlier world size measured is not shown beside "did not run"
        report.did_not_run(f"{tag} train_fsdp returned without calling train_step {MEASURE_STEP} times "
                           f"(it called it {run.ranks[0]['steps']} times for {STEPS} micro-batches)")
        return
    report.judge(CRITERIA, run, world=run.world)
    report.notes.append(f"{tag} {run.bytes_summary()}")
    report.measurements[f"W{run.world}_launch_s"] = round(wall_s, 2)


def grade(paths: Sequence[Path], world_sizes: tuple[int, ...] = WORLD_SIZES) -> list[ExerciseReport]:
    """Grade the files at ``paths`` (tests pass fewer ``world_sizes`` to run faster); one report each.

    One launch per world size grades every file, one world size after the other (each needs W
    devices on a GPU machine). Each world size's criteria are declared at full weight; scale_to
    gives every world size an equal share.
    """
    reports = [EXERCISE.new_report() for _ in paths]
    shares = sum(LAUNCH_SHARES[w] for w in world_sizes)
    with tempfile.TemporaryDirectory(prefix="ex04-") as tmp:
        for world in world_sizes:
            if not any(r.ran for r in reports):
                break  # nothing left to judge at a larger world size
            outdir = Path(tmp) / f"W{world}"  # a folder per launch: no file an earlier one exported counts
            outdir.mkdir()  # here, before the launch hands the scratch space to the learner user
            timeout = launch_timeout(EXERCISE, files=len(paths), share=LAUNCH_SHARES[world] / shares,
                                     per_extra_file_s=PER_EXTRA_FILE_S)
            runs, wall_s = launch_files(rank_main, paths, world=world, timeout=timeout, args=(str(outdir),))
            for report, ranks in zip(reports, runs):
                if report.ran:
                    _judge(report, Run(ranks), wall_s)
    return [r.scale_to() for r in reports]
