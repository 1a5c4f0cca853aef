"""Exercise 8 check: a tensor-parallel MLP block (Megatron-LM's f and g), graded at world sizes 2 and 4.

Every rank cuts the same unsplit block ``Linear(16, 96) -> GELU -> Linear(96, 16)`` with the learner's
``ColumnParallelLinear`` and ``RowParallelLinear``, runs one forward and backward through them on a 4x3x16 input
(the contract's ``(..., in)``: 12 rows as 4 sequences of 3 tokens; ``probes``), and returns what each layer holds,
the output, the gradients and every collective it issued. Against the unsplit block run here (Shoeybi et al., 2019,
"Megatron-LM", section 3; huggingface/picotron's ``tensor_parallel.py``) the check verifies:

* each rank holds its 1/W shard of the weights, as new parameters: exact (a copy of a slice);
* the output, the input's gradient and every shard's gradient match the unsplit block's
  (``assert_close``: the all-reduce adds W partial sums over H/W hidden features, another order than
  one sum over H);
* the row layer's bias is in none of the partial sums the all-reduce adds up, and in the output once;
* exactly one all-reduce in the forward (in the row layer) and one in the backward (of the input's
  gradient), and no other collective.

Where the step raised on every rank and a layer does not hold its shard (a weight cut along the wrong
dimension fails on a shape) or its forward raised, the grader steps again with its own layer in place of that
one, calling the learner's ``f`` and ``g`` (``stand_ins``): the shards' criterion, or the output's, costs what
the layer got wrong, and the others, each saying so, judge ``f``, ``g`` and the other layer (issue 37: a crash
in one part never costs another).

| mistake | message |
|---|---|
| f and g swapped: the all-reduce in the wrong operator | "the forward's all-reduce ran in ColumnParallelLinear ..." |
| f on the column layer's output, not its input | "rank 0's backward all-reduced a 4x3x48 tensor, the shape of ..." |
| no all-reduce in the backward (f's backward is the identity) | "the backward made no all-reduce, so each rank's ..." |
| no all-reduce in the forward (g's forward is the identity) | "the forward made no all-reduce, so each rank ..." |
| f all-reduces in the forward | "the forward made an all-reduce in ColumnParallelLinear, ..., besides g's ..." |
| g all-reduces in the backward too | "the backward made 2 all-reduces; its all-reduce 1 summed a 4x3x16 gradient ..." |
| the bias added on every rank, before the all-reduce | "each of the 2 ranks added the row bias before ..." |
| the row bias inside the partial sums | "the output holds the row bias once, but inside the partial sums ..." |
| a shard cut along the wrong dimension | "rank 0's ColumnParallelLinear.weight is 96x8: columns 0:8 of ..." |
| a shard that is not the rank's own | "rank 1's ColumnParallelLinear.weight holds rows 0:48 ..., rank 0's shard" |
| a shard cut by the process's rank, not the rank given | "ColumnParallelLinear(linear, rank=1, ...), built on ..." |
| a shard in torch's default dtype, not the layer's | "built from a float64 block, rank 0's ... is float32 ..." |
| the input not replicated: split across the ranks | "ColumnParallelLinear returned 2x3x48 for the 4x3x16 input ..." |
| a shard that is a view of the unsplit weight | "... is a view ...: its storage is 6,144 B for its own 3,072 B ..." |
| the unsplit layer kept next to the shard | "rank 0's RowParallelLinear also keeps linear.weight (16x96, 6,144 B)" |
| averaged instead of summed | "the output minus the bias is 0.50x the unsplit block's with 2 ranks ..." |
| a backward that returns no gradient | "on rank 0 RowParallelLinear.bias, added after ReduceFromParallelRegion ..." |
| a layer's forward that returns no tensor | "on rank 0 ColumnParallelLinear.forward returned None, not a tensor ..." |
| matmul shapes that do not match: a shard or the input cut wrong | ("mat1 and mat2 shapes cannot ...") "..." |
| a bias of the wrong size | ("The size of tensor a (48) must match the size of tensor b (96)") "..." |
| a forward that takes only a 2-D input | ("mat1 must be a matrix, got 3-D tensor") "... works on a 2-D x only ..." |
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

import torch

from ...grader.diagnosis import diagnose, translate
from ...grader.launches import launch_files, launch_timeout
from ...grader.parity import parity
from ...grader.registry import Exercise
from ...grader.report import ExerciseReport, Verdict, criterion, failed, passed
from .causes import (KNOWN_ERRORS, TWO_D, averaged, bias_in_partial_sums, bias_on_every_rank, describe,
                     forward_returned_nothing, gradient_stopped, input_not_replicated, not_own_shard, summary,
                     multiple_of, unsplit_kept, view_kept, wrong_dimension)
from .builds import rebuilt_wrong
from .comm_causes import (f_on_output, f_reduces_forward, g_reduces_backward, no_backward_reduce, no_forward_reduce,
                          swapped)
from .observations import Run
from .probes import rank_main
from .reference import ATOL, D, LAYER_CLASS, LEAD, PARTS, RTOL, SHARD_DIM, X_SHAPE

__all__ = ["CRITERIA", "EXERCISE", "KNOWN_ERRORS", "WORLD_SIZES", "grade"]

EXERCISE = Exercise(number=8, name="tensor_parallel", filename="ex08_tensor_parallel.py", max_score=10,
                    time_limit=90)
WORLD_SIZES = (2, 4)


def _raised(obs: dict, explain: bool = True) -> str:
    """What a rank raised, where, and (``explain``: when no cause was found) the known mistake it shows."""
    known = explain and translate(obs.error, KNOWN_ERRORS)
    return (f"rank {obs.rank} raised {obs.error}" + (f" at {obs.where}" if obs.where else "")
            + (f": {known}" if known else ""))


HOLDS, OUTPUT = "[W={world}] each rank holds its 1/{world} of the weights, as new parameters", \
    "[W={world}] the output matches the unsplit block"
INPUT_GRAD = "[W={world}] the input's gradient matches the unsplit block"
REPORTED = {"build": ("building the layers raised", HOLDS), "forward": ("the forward raised", OUTPUT),
            "backward": ("the backward raised", INPUT_GRAD)}
# The causes (causes) the criteria ask for, most specific first.
SHARDS = [wrong_dimension, not_own_shard]
FORWARD = [*SHARDS, forward_returned_nothing, input_not_replicated, swapped, no_forward_reduce, averaged,
           bias_on_every_rank]


def _blocked(run: Run, stage: str, owner: bool = False, causes=()) -> Verdict | None:
    """A failure when the step raised at ``stage`` or before: the error and its cause in the criterion
    that ``owner``s the stage that raised, "not checked" in the others; ``None`` when it got past."""
    bad = run.failure(stage)
    if bad is None:
        return None
    what, where = REPORTED[bad.stage]
    if owner and bad.stage == stage:
        why = diagnose(causes, run, stage)
        return failed(f"{why} (then {_raised(bad, explain=False)})" if why else _raised(bad))
    return failed(f"not checked: {what} (see '{where.format(world=run.world)}')")


def _wrong_parameter(run: Run) -> str | None:
    """The first shard, on any rank, that is not an nn.Parameter holding its slice of the unsplit layer."""
    for obs in run.ranks:
        for part in PARTS:
            (layer, name), r = part.split("."), obs.rank
            p, want = obs.param(part), run.expected(part, r)
            if p is None or not p.parameter:
                what = "a plain tensor" if p else "no such attribute"
                return (f"rank {r}'s {LAYER_CLASS[layer]} has no nn.Parameter `{name}` ({what}): keep its shard as "
                        f"self.{name} = nn.Parameter(...), so that it is trained and gets a gradient")
            if p.value.shape != want.shape or not torch.equal(p.value, want):  # exact: a copy of a slice
                return diagnose(SHARDS, run, "shards") or (
                    f"rank {r}'s {LAYER_CLASS[layer]}.{name} ({'x'.join(map(str, p.shape))}) is not "
                    f"{describe(run.ref.weights[part], SHARD_DIM[part], r, run.world)}")
    return None


@criterion(HOLDS, points=2)
def holds_its_shard(run: Run) -> Verdict:
    if stop := _blocked(run, "build", owner=True, causes=SHARDS):
        return stop
    if why := _wrong_parameter(run) or rebuilt_wrong(run) or diagnose([view_kept, unsplit_kept], run, "shards"):
        return failed(why)
    want = sum(run.expected(p, 0).numel() * run.expected(p, 0).element_size() for p in PARTS)
    unsplit = sum(t.numel() * t.element_size() for t in run.ref.weights.values())
    for obs in run.ranks:
        held = [t for layer in obs.layers.values() for t in layer.tensors]
        if sum(t.storage_bytes for t in held) != want:
            return failed(f"rank {obs.rank}'s layers hold {sum(t.storage_bytes for t in held):,} B of tensors "
                          f"({', '.join(t.name for t in held)}); its shard is {want:,} B: keep only the shards")
    return passed(f"each rank holds {want:,} B of the unsplit block's {unsplit:,} B: 1/{run.world} of each weight "
                  f"and of the first bias, and the whole {D}-element second bias",
                  **{f"W{run.world}_bytes_per_rank": want, "unsplit_bytes": unsplit})


@criterion(OUTPUT, points=2)
def output_matches(run: Run) -> Verdict:
    if stop := _blocked(run, "forward", owner=True, causes=FORWARD):
        return stop
    raised = next((o for o in run.ranks if o.raised_in in o.substituted and o.raised_in not in o.off_shard), None)
    if raised is not None:  # a forward that raised though its layer held its shard: the forward's own mistake
        named = input_not_replicated(run, "forward")
        known = translate(raised.replaced, [TWO_D])  # the contract's x is (..., in): the grader's is 3-D
        return failed(f"{named} (then {raised.replaced})" if named else f"{LAYER_CLASS[raised.raised_in]}.forward "
                      f"raised on rank {raised.rank}, though the layer holds its shard: {raised.replaced}"
                      + (f": {known}" if known else ""))
    ref = run.ref.out
    for obs in run.ranks:
        p = parity(obs.out, ref, rtol=RTOL, atol=ATOL)
        if not p.ok:
            shape, r = tuple(obs.out.shape), obs.rank
            return failed(diagnose(FORWARD, run, "forward") or (
                f"rank {r}'s output is {shape}, the unsplit block's {tuple(ref.shape)}" if shape != ref.shape else
                f"rank {r}'s output differs from the unsplit block's by up to {p.max_abs_diff:.3g} (tolerance "
                f"rtol={RTOL}, atol={ATOL})"))
    diff = max(parity(obs.out, ref).max_abs_diff for obs in run.ranks)
    spread = max((obs.out - run.ranks[0].out).abs().max().item() for obs in run.ranks)
    return passed(f"max abs difference {diff:.2g}; " + ("the same output on every rank" if spread == 0 else
                  f"the ranks' outputs differ by up to {spread:.2g}"),
                  **{f"W{run.world}_output_max_abs_diff": diff, f"W{run.world}_output_rank_spread": spread})


@criterion("[W={world}] the row layer's bias is added once, after the all-reduce", points=1)
def bias_once(run: Run) -> Verdict:
    if stop := _blocked(run, "forward"):
        return stop
    fit = run.bias_fit()
    if fit is None:
        return failed(diagnose([swapped, no_forward_reduce], run, "bias") or "RowParallelLinear made no all-reduce in "
                      "its forward, so where its bias goes could not be seen: add it once, after "
                      "ReduceFromParallelRegion")
    if not fit.fits:
        what = ("the partial sum it handed to the all-reduce differs from its hidden features times its row "
                "shard's" if "partial" in fit.unfit else "the output differs from the unsplit block's")
        return failed(diagnose([input_not_replicated, averaged], run, "bias") or f"not checked: {fit.unfit}: {what} "
                      "by more than a multiple of the bias, so the bias's share cannot be measured (see "
                      f"'{OUTPUT.format(world=run.world)}')")
    before, total = fit.before, fit.total
    if max(abs(k) for k in before) < 1e-3 and abs(total - 1) < 1e-3:  # float32 leaves ~1e-7; a misplaced bias >= 1/W
        return passed("no rank's partial sum holds the bias; the output holds it once")
    return failed(diagnose([bias_on_every_rank, bias_in_partial_sums], run, "bias") or
                  f"the output holds {total:.2f}x the bias, {sum(before):.2f}x of it in the partial sums the "
                  "all-reduce added up: add self.bias once, after ReduceFromParallelRegion")


@criterion("[W={world}] one all-reduce in the forward, in RowParallelLinear", points=1)
def forward_communication(run: Run) -> Verdict:
    if stop := _blocked(run, "forward"):
        return stop
    for obs in run.ranks:
        calls = run.calls(obs.rank, "forward")
        if [(c.kind, c.layer) for c in calls] != [("all_reduce", "row")]:
            return failed(diagnose([swapped, f_reduces_forward, no_forward_reduce], run, "communication") or
                          f"rank {obs.rank}'s forward made {summary(calls)}: the block needs one all-reduce, g's, "
                          "of RowParallelLinear's partial sums, and no other collective")
    return passed(f"one all-reduce of {X_SHAPE} per rank")


@criterion(INPUT_GRAD, points=1)
def input_grad_matches(run: Run) -> Verdict:
    causes = [*SHARDS, input_not_replicated, swapped, g_reduces_backward, no_backward_reduce, f_on_output, averaged,
              gradient_stopped]
    if stop := _blocked(run, "backward", owner=True, causes=causes):
        return stop
    ref = run.ref.x_grad
    for obs in run.ranks:
        if obs.x_grad is None:
            return failed(gradient_stopped(run, "x_grad") or f"rank {obs.rank}'s input got no gradient: "
                          "CopyToParallelRegion.backward must return the all-reduced gradient")
        p = parity(obs.x_grad, ref, rtol=RTOL, atol=ATOL)
        if not p.ok:
            return failed(diagnose(causes, run, "x_grad") or f"rank {obs.rank}'s x.grad differs from the unsplit "
                          f"block's by up to {p.max_abs_diff:.3g} (tolerance rtol={RTOL}, atol={ATOL})")
    diff = max(parity(obs.x_grad, ref).max_abs_diff for obs in run.ranks)
    return passed(f"max abs difference {diff:.2g}", **{f"W{run.world}_x_grad_max_abs_diff": diff})


@criterion("[W={world}] each shard's gradient matches the unsplit block's", points=2)
def shard_grads_match(run: Run) -> Verdict:
    if stop := _blocked(run, "backward"):
        return stop
    worst = 0.0
    for obs in run.ranks:
        r, got = obs.rank, obs.grads
        missing = [p for p in PARTS if got[p] is None]
        if missing:
            layer, name = missing[0].split(".")
            bias = bias_once.rule.name.format(world=run.world)
            unused = (f"its forward did not use self.bias on this rank (see '{bias}')" if name == "bias" and not
                      bias_once(run).ok else "use the shard parameters themselves in forward (F.linear(..., "
                      "self.weight, ...))")
            return failed(gradient_stopped(run, "grads") or f"rank {r}'s {LAYER_CLASS[layer]}.{name} has no gradient "
                          f"after the backward: {unused}")
        p = parity(got, {part: run.expected(part, r, of="grads") for part in PARTS}, rtol=RTOL, atol=ATOL)
        if not p.ok:
            return failed(diagnose([*SHARDS, input_not_replicated, swapped, g_reduces_backward, f_on_output], run,
                                   "grads") or
                          f"rank {r}'s gradients differ from the matching slices of the unsplit block's (max abs "
                          f"difference {p.max_abs_diff:.3g} in {p.worst}, tolerance rtol={RTOL}, atol={ATOL})")
        worst = max(worst, p.max_abs_diff)
    return passed(f"max abs difference {worst:.2g}", **{f"W{run.world}_shard_grads_max_abs_diff": worst})


@criterion("[W={world}] one all-reduce in the backward, of the input's gradient", points=1)
def backward_communication(run: Run) -> Verdict:
    if stop := _blocked(run, "backward"):
        return stop
    for obs in run.ranks:
        calls = run.calls(obs.rank, "backward")
        if [(c.kind, c.shape) for c in calls] != [("all_reduce", [*LEAD, D])]:
            return failed(diagnose([swapped, g_reduces_backward, no_backward_reduce, f_on_output], run,
                                   "communication") or
                          f"rank {obs.rank}'s backward made {summary(calls)}: the block needs one all-reduce, f's, "
                          f"of the {X_SHAPE} input's gradient, and no other collective")
    # What the all-reduce produced must be what reached x.grad: the sum of what the ranks put in.
    summed = sum(run.calls(r, "backward")[0].input for r in range(run.world))
    for obs in run.ranks:
        p = None if obs.x_grad is None else parity(obs.x_grad, summed, rtol=RTOL, atol=ATOL)
        if not p:
            ratio = None if obs.x_grad is None else multiple_of(obs.x_grad, summed)
            if ratio is not None and abs(ratio * run.world - 1) < 1e-3:  # the sum, divided after the all-reduce
                return failed(f"rank {obs.rank}'s x.grad is {ratio:.2f}x what the backward's all-reduce produced, "
                              f"its sum divided by the world size ({run.world}): each rank's part is one share of "
                              "the input's gradient, so their sum is it; return the all-reduced gradient as it is")
            return failed(diagnose([swapped, gradient_stopped], run, "communication") or
                          f"rank {obs.rank}'s x.grad is not what the backward's all-reduce produced"
                          + (f" (max abs difference {p.max_abs_diff:.3g})" if p else "") +
                          ": return the all-reduced gradient from CopyToParallelRegion.backward")
    return passed(f"one all-reduce of {X_SHAPE} per rank, into x.grad")


CRITERIA = [holds_its_shard, output_matches, bias_once, forward_communication, input_grad_matches, shard_grads_match,
            backward_communication]


def _stood_in(run: Run) -> tuple[str, str]:
    """What the grader put in place of the learner's layers, where it did (``probes._stand_ins``): in full (said
    once), and in short."""
    obs = next((o for o in run.ranks if o.substituted), None)
    if obs is None:
        return "", ""
    short = f" (with the grader's {' and '.join(LAYER_CLASS[k] for k in obs.substituted)} in place of yours)"
    if not obs.off_shard:  # its forward raised: the output's criterion says so
        return short, short
    return (f"{short[:-1]}, which does not hold its shard (see '{HOLDS.format(world=run.world)}'): with it your step "
            f"raised {obs.replaced})", short)


def _judge(report: ExerciseReport, run: Run, wall_s: float) -> None:
    """One file at one world size: the criteria, or "did not run" when some of it is not written yet."""
    if stub := next((obs.not_implemented for obs in run.ranks if obs.not_implemented), None):
        report.notes.clear()
        report.did_not_run(f"not implemented yet ({stub})")
        return
    judged = len(report.criteria)
    report.judge(CRITERIA, run, world=run.world)
    full, short = _stood_in(run)  # each criterion judged on the step the grader's layer made says so
    for i, c in enumerate(c for c in report.criteria[judged:] if full and c.key != holds_its_shard.__name__):
        c.feedback += full if i == 0 else short
    report.measurements[f"W{run.world}_launch_s"] = round(wall_s, 2)


def grade(paths: Sequence[Path], world_sizes: tuple[int, ...] = WORLD_SIZES) -> list[ExerciseReport]:
    """Grade the files at ``paths`` (tests pass fewer ``world_sizes``); one report each.

    One launch per world size grades every file, the world sizes at once (most of a launch is start-up,
    which two launches overlap); scale_to gives each world size's criteria an equal share.
    """
    reports = [EXERCISE.new_report() for _ in paths]
    timeout = launch_timeout(EXERCISE, files=len(paths))  # the launches run side by side: each gets it all
    with ThreadPoolExecutor(len(world_sizes)) as pool:
        jobs = {w: pool.submit(launch_files, rank_main, paths, world=w, timeout=timeout) for w in world_sizes}
        for world in world_sizes:
            runs, wall_s = jobs[world].result()  # a failed launch raises here, as a sequential one would
            for report, ranks in zip(reports, runs):
                if report.ran:
                    _judge(report, Run.from_wire(ranks), wall_s)
    return [r.scale_to() for r in reports]
