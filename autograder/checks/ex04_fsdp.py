"""Exercise 4 check: FSDP2 per-block sharding, graded at world sizes 2 and 4.

Every rank builds the same :class:`~distlab.resmlp.ResidualMLP` and trains it
with the learner's ``train_fsdp`` on its slice of each global batch. The
grader wraps the learner's ``train_step`` to observe one step from inside the
rank: the placements and storage bytes of parameters, gradients and Adam
state (compared with the exact padded figure of :func:`distlab.fsdp_memory.expected_bytes`),
and the peak of live tensor storage during the step (CPU:
:class:`~distlab.fsdp_memory.LiveStorageTracker`; GPU: ``max_memory_allocated``).
The verdicts are computed here, against a single-process Adam run on the
same global batches (parity, assert_close: reduce-scatter sums in another
order than one big batch).
"""
from __future__ import annotations

import math
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from distlab import init_distributed
from distlab.data import synthetic_classification
from distlab.fsdp_memory import LiveStorageTracker, expected_bytes, full_shapes, measured_bytes, module_bytes
from distlab.resmlp import make_resmlp

from ..grading import grade_files
from ..harness import CapturedPrints, SaveSpy, echo, load_learner
from ..parity import parity
from ..registry import Exercise
from ..report import ExerciseReport

# A launch of the solution took 22 s at W=2 and 24 s at W=4 on 2 cores at load 6 (less when idle).
# The launch timeouts (about 2x that) sum to 95 s, inside time_limit - 15 s (grader start-up and the
# reference), so a hang is reported as a LaunchTimeout naming the ranks, not cut off by the CLI.
EXERCISE = Exercise(number=4, name="fsdp", filename="ex04_fsdp.py", max_score=10, time_limit=110)
WORLD_SIZES = (2, 4)
LAUNCH_TIMEOUT = {1: 30, 2: 40, 4: 55}
MODEL = dict(hidden=90, depth=8)
STEPS, MICRO_BATCH, LR, SEED = 4, 8, 1e-2, 11
MEASURE_STEP = 2  # the second step: Adam's state exists before it, so the step sees the steady state
RTOL, ATOL = 1e-3, 1e-4  # reduce-scatter sums in another order; Adam's 1/sqrt(v) amplifies it on tiny gradients
# Per-block FSDP keeps at most this many units' worth of unsharded bytes alive at once:
# the unit computing (gathered params + all-gather buffer, then its full gradients + the
# reduce-scatter buffer) and the one being prefetched. Root-only wrapping needs the whole model.
UNITS_IN_FLIGHT = 6


def _data():
    return synthetic_classification(256, 64, 10, seed=SEED)  # no sklearn import in the ranks


def _global_batches(world: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(SEED)
    perm = torch.randperm(len(_data()), generator=g)
    size = MICRO_BATCH * world
    return [perm[s * size:(s + 1) * size] for s in range(STEPS)]


def activation_bytes(micro_batch: int = MICRO_BATCH) -> int:
    """Bound on activations kept for backward: every layer's input and output, fp32."""
    h, depth = MODEL["hidden"], MODEL["depth"]
    per_sample = 64 + h + depth * (h + 2 * h + 2 * h + h) + 10
    return 2 * per_sample * micro_batch * 4


def peak_bound(state_bytes: int, model: nn.Module) -> dict[str, int]:
    """What per-block sharding promises: sharded state + a few unsharded units + activations."""
    units = [module_bytes(b) for b in model.blocks]
    units.append(module_bytes(model) - sum(units))  # the root unit: input layer and head
    one_unit = max(units)
    act = activation_bytes()
    return {"state": state_bytes, "unit": one_unit, "activations": act,
            "bound": state_bytes + UNITS_IN_FLIGHT * one_unit + act}


def _observe(path: str, export: Path, device: torch.device) -> dict:
    """One file on this rank: the learner trains; the wrapped ``train_step`` observes one step."""
    with SaveSpy() as saves:  # before the import, so ``from torch import save`` binds the spy too
        return _train_observed(load_learner(path), export, device, saves)


def _train_observed(learner, export: Path, device: torch.device, saves: SaveSpy) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    model = make_resmlp(seed=SEED, **MODEL).to(device)  # the same start on every rank
    shapes = full_shapes(model)
    x_all, y_all = _data().tensors
    batches = [(x_all[idx[rank * MICRO_BATCH:(rank + 1) * MICRO_BATCH]].to(device),
                y_all[idx[rank * MICRO_BATCH:(rank + 1) * MICRO_BATCH]].to(device))
               for idx in _global_batches(world)]
    seen: dict = {"steps": 0}
    real_step = learner.train_step

    def observed_step(model_, optimizer, x, y):
        seen["steps"] += 1
        if seen["steps"] != MEASURE_STEP:
            return real_step(model_, optimizer, x, y)
        params = list(model_.parameters())
        before = measured_bytes(model_, optimizer)
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            live = torch.cuda.memory_allocated()  # state + cuBLAS workspace + the batch, already there
            loss = real_step(model_, optimizer, x, y)
            torch.cuda.synchronize()
            peak = sum(before.values()) + torch.cuda.max_memory_allocated() - live
        else:
            with LiveStorageTracker() as mem:
                mem.track(*params, *(p.grad for p in params if p.grad is not None),
                          *(v for s in optimizer.state.values() for v in s.values()))
                loss = real_step(model_, optimizer, x, y)
            peak = mem.peak
        opt_ids = {id(p) for g in optimizer.param_groups for p in g["params"]}
        seen.update(
            before=before, after=measured_bytes(model_, optimizer), peak=peak,
            placements=sorted({str(getattr(p, "placements", "plain tensor")) for p in params}),
            dtensors=sum(type(p).__name__ == "DTensor" for p in params), n_params=len(params),
            opt_foreign=sum(id(p) not in opt_ids for p in params),
            blocks_wrapped=sum(type(b).__name__.startswith("FSDP") for b in model_.blocks),
            bound=peak_bound(sum(before.values()), model_),
        )
        return loss

    learner.train_step = observed_step
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
            **{k: v for k, v in seen.items()}}


def rank_main(paths: list[str], outdir: str) -> list[dict]:
    """Runs on every rank: each file in turn, one observation per file."""
    device = init_distributed()
    return [_observe(p, Path(outdir) / f"full_state-{i}.pt", device) for i, p in enumerate(paths)]


def reference(world: int) -> dict:
    """Single-process Adam on the whole global batch of every step."""
    model = make_resmlp(seed=SEED, **MODEL)
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    x_all, y_all = _data().tensors
    for idx in _global_batches(world):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x_all[idx]), y_all[idx]).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _mb(n: float) -> str:
    return f"{n / 2**20:.3f} MiB"


def _check_world(report: ExerciseReport, results: list[dict]) -> None:
    """The verdicts for one file at one world size, from every rank's observations."""
    r0 = results[0]
    world, export = r0["world"], Path(r0["export"])
    tag = f"[W={world}]"
    if "before" not in r0:
        report.fail_all(f"{tag} train_fsdp returned without calling train_step {MEASURE_STEP} times "
                        f"(it called it {r0['steps']} times for {STEPS} micro-batches)")
        return
    # 1. parameters are DTensors sharded on dim 0
    bad = [r for r in results if r["dtensors"] != r["n_params"] or r["placements"] != ["(Shard(dim=0),)"]]
    report.check(f"{tag} parameters are DTensors sharded on dim 0", 1, not bad,
                 f"on rank {bad[0]['rank']} {bad[0]['dtensors']} of {bad[0]['n_params']} parameters are "
                 f"DTensors, placements {bad[0]['placements']}: call fully_shard on the blocks and the root"
                 if bad else "")
    # 2. optimizer built after sharding
    foreign = [r for r in results if r["opt_foreign"]]
    report.check(f"{tag} optimizer built after sharding", 1, not foreign,
                 f"on rank {foreign[0]['rank']} the optimizer does not hold {foreign[0]['opt_foreign']} of the "
                 f"model's {foreign[0]['n_params']} parameters: it was built before fully_shard replaced them "
                 "with DTensors, so it updates stale tensors. Build the optimizer after shard(model)"
                 if foreign else "")
    # 3. exact per-rank bytes, padding included
    lines, exact = [], True
    for r in results:
        exp, got = r["expected"], r["after"]
        for part in ("params", "grads", "optimizer"):
            report.measurements[f"W{world}_rank{r['rank']}_{part}_bytes"] = got[part]
            if got[part] != exp[part]:
                exact = False
                lines.append(f"rank {r['rank']} {part}: expected {exp[part]} B, measured {got[part]} B")
    total = sum(r0["expected"][p] for p in ("params", "grads", "optimizer"))
    unsharded = sum(4 * torch.Size(s).numel() for s in r0["shapes"].values()) * 4
    pad = max(r["expected"]["padding"] for r in results)
    summary = (f"rank 0 holds {sum(r0['after'][p] for p in ('params', 'grads', 'optimizer'))} B of "
               f"params+grads+Adam state (expected {total} B; padding up to {pad} B per rank in params and "
               f"again in grads) vs {unsharded} B unsharded (1/W would be {unsharded // world} B)")
    report.notes.append(f"{tag} {summary}")
    report.check(f"{tag} each rank holds 1/{world} of params, grads and Adam state", 2, exact,
                 "; ".join(lines[:4]) + " (expected = ceil(rows/W) padded rows per param and grad, "
                 "the rank's real rows for exp_avg and exp_avg_sq, 4 B for each step)",
                 pass_note=summary)
    # 4. peak live memory during a step
    over = [r for r in results if r["peak"] > r["bound"]["bound"]]
    worst = max(results, key=lambda r: r["peak"] / r["bound"]["bound"])
    b = worst["bound"]
    how = "torch.cuda.max_memory_allocated" if r0["device"] == "cuda" else "live tensor storage"
    explain = (f"peak {_mb(worst['peak'])} ({how}) on rank {worst['rank']} vs bound {_mb(b['bound'])} = "
               f"sharded state {_mb(b['state'])} + {UNITS_IN_FLIGHT} x largest unit {_mb(b['unit'])} + "
               f"activations {_mb(b['activations'])}")
    for r in results:
        report.measurements[f"W{world}_rank{r['rank']}_peak_bytes"] = r["peak"]
        report.measurements[f"W{world}_rank{r['rank']}_peak_bound_bytes"] = r["bound"]["bound"]
    if over and worst["blocks_wrapped"] == 0:
        msg = (f"only the root is wrapped (0 of {MODEL['depth']} blocks are fully_shard units), so forward "
               f"and backward unshard the whole model at once: {explain}. Call fully_shard on each block "
               "before the root")
    else:
        msg = f"{explain}: shard each block with its own fully_shard call, then the root"
    report.check(f"{tag} peak memory within the per-block bound", 2, not over, msg, pass_note=explain)
    # 5. parity with one process on the whole global batch
    ref = reference(world)
    final = r0["final"]
    par = parity(final, ref, rtol=RTOL, atol=ATOL)
    report.measurements[f"W{world}_max_abs_diff_vs_reference"] = par.max_abs_diff
    where = (f"max abs difference {par.max_abs_diff:.3g} in '{par.worst}'" if math.isfinite(par.max_abs_diff)
             else f"the trained state dict does not match the model's: {par.worst}")
    report.check(f"{tag} matches single-process training", 2, par.ok,
                 f"after {STEPS} Adam steps (lr={LR}) the weights differ from one process trained on the "
                 f"global batches of {world}x{MICRO_BATCH} ({where}, rtol={RTOL}, atol={ATOL}): zero the "
                 "gradients, step once per micro-batch, and build the optimizer on the sharded parameters",
                 pass_note=f"max abs difference {par.max_abs_diff:.2g}")
    # 6. export: a full state dict, saved on rank 0 only
    savers = [r["rank"] for r in results if r["saves"]]
    detail = ""
    if savers != [0]:
        detail = (f"torch.save was called on ranks {savers}: every rank must call get_model_state_dict "
                  "(it is a collective), but only rank 0 saves" if savers else
                  f"nothing was saved to {export}: torch.save the full state dict to export_path on rank 0")
    elif not export.is_file():
        detail = f"rank 0 saved to {r0['saves']}, not to the export_path given"
    else:
        saved = torch.load(export, weights_only=True)
        if set(saved) != set(ref) or any(type(v) is not torch.Tensor for v in saved.values()):
            detail = (f"the saved dict has keys {sorted(saved)[:3]}... of types "
                      f"{sorted({type(v).__name__ for v in saved.values()})}: save the full state dict "
                      "(full_state_dict=True, cpu_offload=True) so it holds plain tensors")
        elif any(not torch.equal(saved[k], final[k]) for k in final):
            detail = "the saved weights differ from the trained model's: export after training"
    report.check(f"{tag} rank 0 exports the full state dict once", 2, not detail, detail)


def grade_many(paths: list[Path], world: int = 2) -> list[ExerciseReport]:
    """Grade several files at one world size in a single launch (the tests grade the solution and a mutant)."""
    with tempfile.TemporaryDirectory(prefix="ex04-") as outdir:
        return grade_files(EXERCISE, rank_main, paths, world=world, timeout=LAUNCH_TIMEOUT[world] * len(paths),
                           verdict=_check_world, args=(outdir,))


def grade(path: Path, world_sizes: tuple[int, ...] = WORLD_SIZES) -> ExerciseReport:
    """Grade the file at ``path`` (tests pass fewer ``world_sizes`` to run faster)."""
    report = ExerciseReport(EXERCISE.number, EXERCISE.name, EXERCISE.max_score)
    for world in world_sizes:
        (one,) = grade_many([path], world)
        report.criteria += one.criteria
        report.notes += one.notes
        report.measurements.update(one.measurements)
        report.measurements[f"W{world}_launch_s"] = report.measurements.pop("launch_s")
        if one.criteria and one.criteria[0].name == "runs":
            return one
    for c in report.criteria:  # each world size is worth an equal share
        c.points, c.earned = c.points / len(world_sizes), c.earned / len(world_sizes)
    return report
