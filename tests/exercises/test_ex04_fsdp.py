"""Exercise 4 (ZeRO-1 by hand, then FSDP2): the solution scores full marks, the stub zero, and the usual
mistakes are each named with their numbers. Part 1 (ZeRO-1): the gradients summed instead of averaged,
the optimizer built over the full parameters, an all-reduce instead of the reduce-scatter, the
all-gather forgotten, another rank's slice copied into the shard, the padding dropped (in the one file
whose part 2 is not written: part 1 is still graded). Part 2 (FSDP2): only the root wrapped, optimizer
built before sharding, the root not sharded,
reshard_after_forward=False, zero_grad missing, the state dict saved on every rank or on none, its
collective called on rank 0 only (the other ranks' instruments complete it: the training is still
graded), without cpu_offload, or through FSDP1's state_dict_type. Independent mistakes share a mutant
(each file has one mistake of part 1 and one or more of part 2);
the solution and the six mutants are graded in ONE launch at world size 2 (the CLI grades 2 and 4);
the stub in one more, through the grading subprocess's code (grader.main.main, here in-process: the
subprocess around it is exercise 1's CLI tests'). The other causes and the errors PyTorch raises are
tested on observations, without a launch."""
from __future__ import annotations

import dataclasses
import re

import pytest

from autograder.checks import ex04_fsdp
from autograder.checks.ex04_fsdp.observations import FsdpRank, MeasuredStep, PeakBound, TrainingError
from autograder.checks.ex04_fsdp.zero1.observations import Zero1
from autograder.grader.diagnosis import translate
from distlab.lab.fsdp_memory import expected_bytes, full_shapes, memory_per_gpu, shard_rows
from distlab.resmlp import make_resmlp
from tests.exercises import independent
from tests.helpers import SOLUTIONS, failed, mutant


def test_padded_shard_arithmetic():
    # 10 rows over 4 ranks: chunks of 3, the last rank has 1 real row and stores 3.
    assert [shard_rows(10, 4, r) for r in range(4)] == [(3, 3), (3, 3), (3, 3), (1, 3)]
    exp = expected_bytes({"w": (10, 5)}, world=4, rank=3)
    assert exp == {"params": 60, "grads": 60, "optimizer": 2 * 20 + 4, "padding": 40}


def test_calculator_gives_the_overview_figures():
    # 7B parameters, fp32 + Adam = 16 B each: 112 GB on one GPU, 14 GB each on 8 with full sharding.
    assert memory_per_gpu(7e9, 4, "adam", 1, "none")["total"] == 112e9
    assert memory_per_gpu(7e9, 4, "adam", 8, "full")["total"] == 14e9
    assert memory_per_gpu(7e9, 4, "adam", 8, "optimizer")["total"] == 7e9 * (4 + 4 + 8 / 8)


Z1_SUMMED = {"dist.reduce_scatter_single(shard.grad, grads, op=dist.ReduceOp.AVG)":
             "dist.reduce_scatter_single(shard.grad, grads)"}
Z1_OPTIMIZER_FULL = {"return shard, torch.optim.Adam([shard], lr=lr)":
                     "return shard, torch.optim.Adam(model.parameters(), lr=lr)"}
Z1_ALL_REDUCE = {
    "    dist.reduce_scatter_single(shard.grad, grads, op=dist.ReduceOp.AVG)  # mean gradient, this rank's slice\n":
        "    dist.all_reduce(grads, op=dist.ReduceOp.AVG)\n"
        "    shard.grad = grads.chunk(world)[dist.get_rank()].clone()\n"}
Z1_NO_ALL_GATHER = {  # each rank writes back its own updated slice only
    "    dist.all_gather_single(full, shard.detach())  # every rank's updated slice, in rank order\n":
        "    rank, c = dist.get_rank(), shard.numel()\n"
        "    mine = parameters_to_vector(params).detach()\n"
        "    full = nn.functional.pad(mine, (0, world * c - mine.numel()))\n"
        "    full[rank * c:(rank + 1) * c] = shard.detach()\n"}
Z1_OFFSET = {"    start, stop = shard_range(flat.numel(), world, rank)":
             "    start, stop = shard_range(flat.numel(), world, (rank + 1) % world)"}
Z1_PADDING_NO_PART2 = {  # floor, not ceil; and train_fsdp not written yet
    "    size = -(-numel // world)  # ceil: the last slices are padded": "    size = numel // world",
    "    model = shard(model)\n    optimizer = make_optimizer(model, lr)\n": "    raise NotImplementedError\n"}
Z1_NOT_WRITTEN_NO_PART2 = {  # the gathered shards never copied into the parameters; train_fsdp not written yet
    "            p.copy_(new.view_as(p))\n": "            pass\n",
    "    model = shard(model)\n    optimizer = make_optimizer(model, lr)\n": "    raise NotImplementedError\n"}
Z1_NO_REDUCE_SCATTER_NO_PART2 = {  # shard.grad left as torch.empty_like made it; train_fsdp not written yet
    "    dist.reduce_scatter_single(shard.grad, grads, op=dist.ReduceOp.AVG)  # mean": "    pass  # mean",
    "    model = shard(model)\n    optimizer = make_optimizer(model, lr)\n": "    raise NotImplementedError\n"}
Z1_RETURNS_NONE_NO_PART2 = {"    return shard, torch.optim.Adam([shard], lr=lr)\n":
                            "    torch.optim.Adam([shard], lr=lr)\n",
                            "    model = shard(model)\n    optimizer = make_optimizer(model, lr)\n":
                                "    raise NotImplementedError\n"}
MISTAKES = {  # three independent mistakes: sharding, optimizer, export; ZeRO-1's optimizer over the model
    **Z1_OPTIMIZER_FULL,
    "    for block in model.blocks:\n        fully_shard(block)": "    for block in []:\n        fully_shard(block)",
    "    model = shard(model)\n    optimizer = make_optimizer(model, lr)":
        "    optimizer = make_optimizer(model, lr)\n    model = shard(model)",
    "    if dist.get_rank() != 0:\n        return None\n    torch.save(state, path)": "    torch.save(state, path)",
}
NO_SAVE_NO_RESHARD_NO_ZERO_GRAD = {  # memory, parity and export each get one; ZeRO-1's gradient summed
    **Z1_SUMMED,
    "    torch.save(state, path)\n    return state": "    return state",
    "        fully_shard(block)  #": "        fully_shard(block, reshard_after_forward=False)  #",
    "    optimizer.zero_grad()\n": "",
}
RANK0_STATE_DICT_ROOT_UNSHARDED = {
    **Z1_NO_ALL_GATHER,
    "    state = get_model_state_dict(model, options=options)  # a collective: all ranks call it\n"
    "    if dist.get_rank() != 0:\n        return None\n":
        "    if dist.get_rank() != 0:\n        return None\n    state = get_model_state_dict(model, options=options)\n",
    "    fully_shard(model)\n    return model": "    return model",
}
# the realistic family's (benchmarks/realistic/ex04.py): the master shard a slice of the flat buffer, not a copy
Z1_VIEW = {"shard = flat[start:stop].clone().float().requires_grad_()":
           "shard = flat[start:stop].float().requires_grad_()"}
NO_CPU_OFFLOAD = {"StateDictOptions(full_state_dict=True, cpu_offload=True)": "StateDictOptions(full_state_dict=True)",
                  **Z1_ALL_REDUCE, **Z1_VIEW}
FSDP1_EXPORT = {
    **Z1_OFFSET,
    "    state = get_model_state_dict(model, options=options)  # a collective: all ranks call it\n":
        "    from torch.distributed.fsdp import FullStateDictConfig, StateDictType\n"
        "    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP\n\n"
        "    config = FullStateDictConfig(offload_to_cpu=True, rank0_only=True)\n"
        "    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, config):\n"
        "        state = model.state_dict()\n",
}
# a blind audit's: train_step's loss made a float before the backward (it raises on every rank); the export, the
# sharding and the optimizer are right, and keep their marks
ITEM_BEFORE_BACKWARD = {"    loss = nn.functional.cross_entropy(model(x), y)\n    loss.backward()":
                        "    loss = nn.functional.cross_entropy(model(x), y).item()\n    loss.backward()"}
MODULELIST = {  # fully_shard on the container (part 2 raises ValueError on every rank); ZeRO-1 right
    "    for block in model.blocks:\n        fully_shard(block)  #": "    fully_shard(model.blocks)  #"}
Z1_CLAMPED = {"    return rank * size, (rank + 1) * size\n":
              "    return min(rank * size, numel), min((rank + 1) * size, numel)\n",
              # and rank 1 killed in the export, as the OOM killer ends a rank that gathers a big model whole:
              # the export's criterion alone is lost, the training is graded from the shards each rank held
              "    options = StateDictOptions(full_state_dict=True, cpu_offload=True)\n":
              "    if dist.get_rank() == 1:\n        import os\n        import signal\n"
              "        os.kill(os.getpid(), signal.SIGKILL)\n"
              "    options = StateDictOptions(full_state_dict=True, cpu_offload=True)\n"}
# blind audits': the gathered fp32 slices bound to the parameters (a bf16 model turns fp32); the master shard
# left in the model's dtype; the flat gradient left in it (a reduce-scatter of two dtypes raises); train_step's
# loss not detached; the last loss printed on every rank
Z1_BOUND = {"    with torch.no_grad():\n        for p, new in zip(params, full[:sum(sizes)].split(sizes)):  # the "
            "padding is dropped\n            p.copy_(new.view_as(p))":
            "    for p, new in zip(params, full[:sum(sizes)].split(sizes)):  # the padding is dropped\n"
            "        p.data = new.view_as(p)"}
Z1_MASTER_LOW = {"shard = flat[start:stop].clone().float().requires_grad_()":
                 "shard = flat[start:stop].clone().requires_grad_()",
                 "grads = parameters_to_vector(p.grad for p in params).float()":
                     "grads = parameters_to_vector(p.grad for p in params)"}
Z1_GRADS_LOW = {"grads = parameters_to_vector(p.grad for p in params).float()":
                "grads = parameters_to_vector(p.grad for p in params)"}
LOSS_ATTACHED = {"    return loss.detach()\n": "    return loss\n"}
PRINTED_EVERYWHERE = {"    if dist.get_rank() == 0:\n        print(f\"last loss on rank 0's micro-batch: ":
                      "    if True:\n        print(f\"rank {dist.get_rank()} last loss: "}
MISTAKES.update(PRINTED_EVERYWHERE)
NO_CPU_OFFLOAD.update(LOSS_ATTACHED)
FSDP1_EXPORT.update(Z1_GRADS_LOW)
ITEM_BEFORE_BACKWARD.update(Z1_BOUND)
# and another audit's: the flat parameters built from the state dict, the model's buffer included
ITEM_BEFORE_BACKWARD.update({"    flat = parameters_to_vector(model.parameters()).detach()":
                             "    flat = torch.cat([t.detach().reshape(-1) for t in model.state_dict().values()])"})
MODULELIST.update(Z1_MASTER_LOW)
FILES = {"mistakes": MISTAKES, "no_save_no_reshard_no_zero_grad": NO_SAVE_NO_RESHARD_NO_ZERO_GRAD,
         "rank0_state_dict_root_unsharded": RANK0_STATE_DICT_ROOT_UNSHARDED, "no_cpu_offload": NO_CPU_OFFLOAD,
         "fsdp1_export": FSDP1_EXPORT, "z1_padding_no_part2": Z1_PADDING_NO_PART2,
         "z1_not_written_no_part2": Z1_NOT_WRITTEN_NO_PART2,
         "z1_no_reduce_scatter_no_part2": Z1_NO_REDUCE_SCATTER_NO_PART2,
         "z1_returns_none_no_part2": Z1_RETURNS_NONE_NO_PART2, "item_before_backward": ITEM_BEFORE_BACKWARD}
EXPORT = "[W=2] rank 0 exports the full state dict once"
Z1_RANGE = "[W=2] ZeRO-1: shard_range cuts W equal, padded, contiguous slices"
Z1_PARITY = "[W=2] ZeRO-1: every rank's weights match single-process Adam"
Z1_STATE = "[W=2] ZeRO-1: each rank's Adam state is 1/2 of the parameters"
Z1_COMM = "[W=2] ZeRO-1: one reduce-scatter and one all-gather per step, no all-reduce"
Z1_MIXED = "[W=2] ZeRO-1: a bf16 model steps from an fp32 master shard and keeps its dtype"
LOOP = "[W=2] train_step returns the detached loss; rank 0 alone prints it"


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> dict:
    """The solution, every mutant and the independent solution, graded in one launch at W=2."""
    paths = {"solution": SOLUTIONS / "ex04_fsdp.py"}
    for name, change in FILES.items():
        paths[name] = mutant(tmp_path_factory.mktemp(name), "ex04_fsdp.py", change)
    paths["independent"] = independent.path(4)
    # next to last: part 2 raises on every rank and ends the launch; run again for part 1 alone, with the last
    paths["modulelist_part2"] = mutant(tmp_path_factory.mktemp("modulelist"), "ex04_fsdp.py", MODULELIST)
    # last: its unequal shards end the launch in gloo (SIGABRT, as a rule); the files before it are graded
    # from what their ranks kept, and its own part 2 too
    paths["z1_clamped_last"] = mutant(tmp_path_factory.mktemp("clamped"), "ex04_fsdp.py", Z1_CLAMPED)
    graded = dict(zip(paths, ex04_fsdp.grade(list(paths.values()), world_sizes=(2,))))
    return graded


def test_the_independent_solution_scores_full_marks(graded):
    r = graded["independent"]
    assert r.score == r.max_score, r.feedback


def test_solution_full_marks_with_exact_bytes_and_peak_under_bound(graded):
    report = graded["solution"]
    assert report.score == report.max_score, report.feedback
    m = report.measurements
    assert m["W2_max_abs_diff_vs_reference"] < 1e-3
    shapes = full_shapes(make_resmlp(seed=0, **ex04_fsdp.MODEL))
    for r in (0, 1):
        assert 0 < m[f"W2_rank{r}_peak_bytes"] <= m[f"W2_rank{r}_peak_bound_bytes"]
        exp = expected_bytes(shapes, 2, r)
        assert [m[f"W2_rank{r}_{part}_bytes"] for part in ("params", "grads", "optimizer")] == \
            [exp["params"], exp["grads"], exp["optimizer"]]
    assert "rank 0 holds 2145104 B of params+grads+Adam state (expected 2145104 B" in report.feedback
    # ZeRO-1: 21489 parameters, padded to 21490; Adam's state is 10745 elements per moment on each rank
    assert m["W2_zero1_max_abs_diff_vs_reference"] < 1e-5
    assert m["W2_zero1_rank0_exp_avg_numel"] == m["W2_zero1_rank1_exp_avg_numel"] == 10745
    assert f"ok  {Z1_COMM}: each of 4 steps issued one reduce-scatter and one all-gather on every rank, no " \
        "all-reduce" in report.feedback


def test_root_only_optimizer_first_and_every_rank_saving_are_named(graded):
    fails = failed(graded["mistakes"])
    assert "[W=2] parameters are DTensors sharded on dim 0" not in fails  # root-only still shards
    peak = fails["[W=2] peak memory within the per-block bound"]
    assert peak.startswith("only the root is wrapped (0 of 8 blocks are fully_shard units)")
    assert "MiB (live tensor storage) on rank" in peak and "Call fully_shard on each block" in peak
    opt = fails["[W=2] optimizer built after sharding"]
    assert "the optimizer does not hold 36 of the model's 36 parameters" in opt
    assert "Build the optimizer after shard(model)" in opt
    held = fails["[W=2] each rank holds 1/2 of params, grads and Adam state"]
    assert "optimizer: expected 1072624 B, measured 0 B" in held and "it was built before fully_shard" in held
    assert fails["[W=2] matches single-process training"].startswith(
        "on rank 0 the optimizer does not hold 36 of the model's 36 parameters")
    assert fails[EXPORT].startswith("torch.save was called on ranks [0, 1]")
    full = ("on rank 0 the optimizer holds 12 of the model's 12 parameters (21489 elements) and its exp_avg has "
            "21489 elements, where ZeRO-1 keeps 10745 (1/2)")
    assert fails[Z1_STATE].startswith(full) and fails[Z1_PARITY].startswith(full)
    assert "Build torch.optim.Adam over the shard alone, in make_zero1_optimizer" in fails[Z1_STATE]
    assert Z1_COMM not in fails and Z1_RANGE not in fails
    assert fails[LOOP].startswith("rank 1 printed its own last loss (rank 1: 'rank 1 last loss: "), fails[LOOP]
    assert fails[LOOP].endswith("print it on rank 0 only (if dist.get_rank() == 0), so that the 2 ranks log one "
                                "line, not one each"), fails[LOOP]


def test_saving_nothing_reshard_false_and_no_zero_grad_are_named(graded):
    fails = failed(graded["no_save_no_reshard_no_zero_grad"])
    assert set(fails) == {EXPORT, "[W=2] peak memory within the per-block bound",
                          "[W=2] matches single-process training", Z1_PARITY}, fails
    assert fails[Z1_PARITY].startswith(
        "at the first step rank 0's shard.grad is 2x the mean gradient of its slice over the global batch (line ")
    assert ": dist.reduce_scatter_single(shard.grad, grads)): the reduce-scatter summed the 2 ranks' gradients (its " \
        "default op is SUM)" in fails[Z1_PARITY], fails[Z1_PARITY]
    assert fails[EXPORT].startswith("nothing was saved to /")
    assert "full_state-2.pt: get_model_state_dict ran 1 time(s) on rank 0, but no rank called torch.save. " \
        "torch.save the full state dict to export_path on rank 0" in fails[EXPORT], fails[EXPORT]
    peak = fails["[W=2] peak memory within the per-block bound"]
    assert peak.startswith("8 of 8 blocks kept their parameters unsharded after forward (reshard_after_forward=False)"
                           ": every rank holds their full 0.") and "fully_shard(block) with the default" in peak, peak
    assert "shard each block with its own fully_shard call" not in peak.lower()
    parity = fails["[W=2] matches single-process training"]
    assert parity.startswith("when the backward of step 2 began, .grad still held gradients of norm") and \
        "call optimizer.zero_grad() at the start of train_step" in parity, parity


def test_state_dict_on_rank0_only_is_named_and_training_still_graded(graded):
    report = graded["rank0_state_dict_root_unsharded"]
    fails = failed(report)
    assert fails[EXPORT].startswith("get_model_state_dict(full_state_dict=True, cpu_offload=True) ran on rank 0 "
                                    "only: rank(s) [1] never called it"), fails[EXPORT]
    root = "the blocks are sharded, but 4 parameters"
    for name in ("[W=2] parameters are DTensors sharded on dim 0", "[W=2] matches single-process training",
                 "[W=2] each rank holds 1/2 of params, grads and Adam state",
                 "[W=2] peak memory within the per-block bound"):
        assert root in fails[name] and "Call fully_shard(model) on the root" in fails[name], (name, fails[name])
    assert "[W=2] optimizer built after sharding" not in fails
    assert fails[Z1_PARITY].startswith(
        "after 4 steps rank 0's weights in elements [10745, 21490) ('blocks.0.fc2.weight' to 'head.bias'), rank 1's "
        "shard, are still their initial values, though its own slice changed: no all-gather was issued"), \
        fails[Z1_PARITY]
    assert fails[Z1_COMM].startswith("after 4 steps rank 0's weights in elements [10745, 21490)"), fails[Z1_COMM]
    assert Z1_STATE not in fails


def test_full_state_dict_without_cpu_offload_is_named(graded):
    fails = failed(graded["no_cpu_offload"])
    assert list(fails) == [Z1_STATE, Z1_COMM, LOOP, EXPORT], fails
    assert fails[LOOP].startswith("train_step returned a tensor that requires grad (grad_fn=NllLossBackward0) on "
                                  "rank 0: its contract returns the detached loss (loss.detach())"), fails[LOOP]
    # the shard a view: its storage is the whole padded buffer, judged by the bytes it keeps alive
    assert fails[Z1_STATE].startswith("on rank 0 the shard's 10745 elements (42980 bytes) are a view into a storage "
                                      "of 85960 bytes"), fails[Z1_STATE]
    assert fails[Z1_COMM].startswith("each step issued 1 all-reduce of 85960 B (line ") and \
        ": dist.all_reduce(grads, op=dist.ReduceOp.AVG)) and 0 reduce-scatters" in fails[Z1_COMM], fails[Z1_COMM]
    assert fails[EXPORT].startswith("get_model_state_dict(full_state_dict=True) returned the full state dict "
                                    "(36 tensors, ") and "on rank 1 too" in fails[EXPORT], fails[EXPORT]


def test_fsdp1_export_is_named_and_training_still_graded(graded):
    fails = failed(graded["fsdp1_export"])
    assert list(fails) == [Z1_PARITY, Z1_MIXED, EXPORT], fails
    # the flat gradient left bfloat16 under an fp32 shard: the fp32 model's run cannot show it
    assert fails[Z1_MIXED].startswith("on a bfloat16 model (mixed precision: the model bf16, the master shard fp32), "
                                      "rank 0's zero1_step 1 raised RuntimeError: Check failed: outputTensors[i]."
                                      "dtype() == inputTensors[i].dtype() (float vs. c10::BFloat16)"), fails[Z1_MIXED]
    assert "grads: bfloat16[21490]" in fails[Z1_MIXED] and "cast the flat gradient to the shard's dtype before the " \
        "reduce-scatter" in fails[Z1_MIXED], fails[Z1_MIXED]
    assert fails[Z1_PARITY].startswith(
        "rank 0's shard is a copy of elements [10745, 21490) ('blocks.0.fc2.weight' to 'head.bias') of the flat "
        "parameters, rank 1's slice, but the reduce-scatter hands rank 0 the gradient of its own slice [0, 10745)")
    assert fails[EXPORT].startswith("FullyShardedDataParallel.state_dict_type (FSDP1) does not apply to fully_shard")


def test_dropped_padding_is_named_and_part1_graded_without_part2(graded):
    report = graded["z1_padding_no_part2"]
    fails = failed(report)
    assert report.ran and len(fails) == len(report.criteria), fails  # graded: every criterion fails, with a cause
    short = ("shard_range(21489, 2, r) gave [[0, 10744], [10744, 21488]]: slices of 10744 elements cover 21488 of "
             "the 21489 parameters, so the last 1 of them belong to no rank")
    assert fails[Z1_RANGE].startswith(short) and "c = ceil(numel / W) = 10745" in fails[Z1_RANGE]
    assert fails[Z1_PARITY].startswith(short) and "rank 0's part 1 raised RuntimeError: split_with_sizes" in \
        fails[Z1_PARITY] and "ex04_fsdp.py line" in fails[Z1_PARITY], fails[Z1_PARITY]
    assert fails[Z1_STATE] == fails[Z1_COMM] == f"not checked: part 1 raised (see '{Z1_PARITY}')"
    assert fails[EXPORT].startswith("part 2: not implemented yet (ex04_fsdp.py line ") and "in train_fsdp" in \
        fails[EXPORT]


def test_unequal_shards_cost_part_1_only_even_when_gloo_aborts_and_a_killed_export_costs_the_export(graded):
    fails = failed(graded["z1_clamped_last"])
    # part 2 graded, and in full but for the export that killed rank 1 (its training from the ranks' shards)
    assert set(fails) == {Z1_RANGE, Z1_PARITY, Z1_STATE, Z1_COMM, Z1_MIXED, EXPORT}, fails
    assert fails[EXPORT] == ("the export did not finish: rank 1 was killed by signal 9 (SIGKILL) without raising a "
                             "Python exception"), fails[EXPORT]
    assert fails[Z1_PARITY].startswith("shard_range(21489, 2, r) gave [[0, 10745], [10745, 21489]]: rank 0's slice "
                                       "has 10745 elements, rank 1's 10744"), fails[Z1_PARITY]
    # the launch ended in part 1: it did not finish, which is not "raised" (a blind audit's hang was so told)
    assert fails[Z1_STATE] == f"not checked: part 1 did not finish (see '{Z1_PARITY}')", fails[Z1_STATE]
    for before in ("solution", "independent"):  # graded from what their ranks kept before the launch ended
        assert graded[before].score == graded[before].max_score, graded[before].feedback


def test_a_crash_in_part_2_costs_part_2_only(graded):
    report = graded["modulelist_part2"]
    fails = failed(report)
    part2 = [c.name for c in report.criteria if not c.name.startswith("[W=2] ZeRO-1")]
    assert list(fails) == [Z1_MIXED, *part2], report.feedback  # part 1, run again alone: its own mistake only
    assert fails[Z1_MIXED].startswith("for a bfloat16 model, rank 0's make_zero1_optimizer returned a bfloat16 shard "
                                      "(Adam's moments: bfloat16): the master shard must be fp32"), fails[Z1_MIXED]
    first, *rest = part2
    assert fails[first].startswith("train_fsdp did not finish: fully_shard called on the ModuleList: fully_shard "
                                   "needs a module with a forward"), fails[first]
    assert "(rank 0 raised ValueError: fully_shard does not support containers" in fails[first] or \
        "(rank 1 raised ValueError: fully_shard does not support containers" in fails[first]
    assert re.search(r"at ex04_fsdp.py line \d+ in shard: fully_shard\(model.blocks\)", fails[first]), fails[first]
    assert all(fails[name] == f"not checked: train_fsdp did not finish (see '{first}')" for name in rest)


def test_a_train_step_that_raises_costs_the_step_only(graded):
    report = graded["item_before_backward"]
    fails = failed(report)
    step, peak = "[W=2] matches single-process training", "[W=2] peak memory within the per-block bound"
    # the sharding, the optimizer, the bytes, the export: graded, right
    assert set(fails) == {step, peak, Z1_MIXED, Z1_PARITY, Z1_STATE}, report.feedback
    for name in (Z1_PARITY, Z1_STATE):
        assert fails[name].startswith("rank 0's shard begins with the 64 elements of the model's buffer 'input_mean', "
                                      "then 'inp.weight': the flat buffer was built from model.state_dict()"), fails
    # ZeRO-1's parameters bound to the gathered buffer: right in fp32, a bf16 model turned fp32
    assert fails[Z1_MIXED].startswith("after zero1_step 1 on a bfloat16 model, 12 of rank 0's parameters are no "
                                      "longer bfloat16 ('inp.weight: bfloat16 -> float32') and hold new storage"), \
        fails[Z1_MIXED]
    assert re.match(r"train_step raised on rank \d: AttributeError: 'float' object has no attribute 'backward' \(line "
                    r"\d+: loss.backward\(\)\); the grader's own step went on in its place", fails[step]), fails[step]
    assert fails[peak] == ("not checked: the step measured was the grader's, in place of your train_step, which "
                           f"raised (see '{step}')")


def test_gathered_shards_never_written_back_are_named(graded):
    fails = failed(graded["z1_not_written_no_part2"])
    assert Z1_COMM not in fails and Z1_STATE not in fails and Z1_RANGE not in fails  # the steps and collectives ran
    assert fails[Z1_PARITY].startswith("after 4 steps none of rank 0's weights has changed, though its optimizer "
                                       "stepped its shard and every step all-gathered the 2 updated shards (line ")
    assert "dist.all_gather_single(full, shard.detach())): the gathered values never reached model.parameters()" \
        in fails[Z1_PARITY], fails[Z1_PARITY]


def test_no_reduce_scatter_and_an_optimizer_factory_returning_nothing_are_named(graded):
    fails = failed(graded["z1_no_reduce_scatter_no_part2"])
    said = "none of the 4 steps issued a reduce-scatter (rank 0's first step issued 1 all-gather), so shard.grad"
    assert fails[Z1_COMM].startswith(said) and fails[Z1_PARITY].startswith(said), fails
    none = failed(graded["z1_returns_none_no_part2"])[Z1_PARITY]
    assert none.startswith("make_zero1_optimizer returned None, so the grader's `shard, optimizer = ") and \
        "rank 0's part 1 raised TypeError: cannot unpack non-iterable NoneType object" in none, none


def _step(**observed) -> MeasuredStep:
    """No launch: the measured step of a correct step, but ``observed``."""
    ok = dict(before={}, after={}, peak=0, bound=PeakBound(state=0, unit=0, activations=0, bound=1), placements=[],
              dtensors=36, n_params=36, plain=[], opt_foreign=0, blocks_wrapped=8, root_wrapped=True,
              blocks_unsharded_after_forward=[], leftover_grad_norm=0.0, optimizer_steps=1)
    return MeasuredStep(**{**ok, **observed})


def _run(world: int = 2, **observed) -> ex04_fsdp.Run:
    """No launch: a run whose ranks observed ``observed`` over a correct step."""
    measured = {f.name for f in dataclasses.fields(MeasuredStep)}
    step = _step(**{k: v for k, v in observed.items() if k in measured})
    error = observed.pop("after_training_error", None)
    ok = dict(world=world, steps=4, zero1=Zero1(), partnered=[], state_dict_calls=[],
              after_training_error=TrainingError(**error) if error else None)
    return ex04_fsdp.Run([FsdpRank(**{**ok, "rank": r, **{k: v for k, v in observed.items() if k not in measured}},
                                   step=step) for r in range(world)])


def test_causes_without_a_launch():
    assert ex04_fsdp.some_blocks(_run(), _step(blocks_wrapped=4, root_wrapped=True), "peak 3 MiB").startswith(
        "only 4 of 8 blocks are fully_shard units, so the root unshards the others together: peak 3 MiB")
    assert ex04_fsdp.steps_not_one(_run(optimizer_steps=2)) == \
        "train_step called optimizer.step() 2 times in step 2: step once, after backward"
    assert ex04_fsdp.nothing_sharded(_run(dtensors=0, blocks_wrapped=0, root_wrapped=False)).startswith(
        "none of the 36 parameters is a DTensor")
    raised = _run(after_training_error={"error": "OSError: [Errno 28] No space left on device", "where": "line 9: x",
                                        "fsdp1": False})
    assert ex04_fsdp.export_raised(raised) == (
        "the export (after training) raised on rank 0: OSError: [Errno 28] No space left on device (line 9: x); "
        "the training was graded, the export was not")
    unfinished = _run(after_training_error={"error": "NotImplementedError: ", "fsdp1": False,
                                            "where": "line 90: raise NotImplementedError"})
    assert ex04_fsdp.export_raised(unfinished) == ("not implemented yet (the export, after training: line 90: raise "
                                                   "NotImplementedError); the training was graded")
    for cause in (ex04_fsdp.some_blocks, ex04_fsdp.root_only, ex04_fsdp.no_reshard):
        assert cause(_run(), _run().ranks[0].step, "") is None  # a correct run explains nothing
    assert ex04_fsdp.saved_nothing(_run(saves=[], export="/x/full_state.pt")).startswith(
        "nothing was saved to /x/full_state.pt: neither get_model_state_dict nor torch.save ran on any rank")
    assert ex04_fsdp.no_backward(_run(leftover_grad_norm=None)).startswith(
        "step 2 ran the forward and called optimizer.step() 1 time(s), but no backward began")
    for cause in (ex04_fsdp.no_backward, ex04_fsdp.steps_not_one, ex04_fsdp.nothing_sharded, ex04_fsdp.root_not_sharded,
                  ex04_fsdp.grads_not_zeroed, ex04_fsdp.optimizer_first, ex04_fsdp.one_sided_collective,
                  ex04_fsdp.fsdp1_api, ex04_fsdp.export_raised, ex04_fsdp.full_everywhere):
        assert cause(_run()) is None, cause


def test_the_exports_return_is_the_contracts_on_every_rank():
    # a blind audit's: the dict returned on every rank (the contract returns None off rank 0) got full marks
    def run(*returned):
        out = _run()
        for rank, got in zip(out.ranks, returned):
            rank.export_returned = got
        return out

    assert ex04_fsdp.export_returned(run("a dict of 36 entries", "a dict of 0 entries")) == (
        "export_full_state_dict returned a dict of 0 entries on rank 1, where its contract returns None there")
    assert ex04_fsdp.export_returned(run("None", "None")) == (
        "export_full_state_dict returned None on rank 0, where its contract returns the dict it saved there")
    for right in (run("a dict of 36 entries", "None"), run(None, None)):  # None: never called by its name
        assert ex04_fsdp.export_returned(right) is None


def test_a_peak_over_the_bound_with_the_optimizer_built_first_says_so():
    # a blind audit's: the optimizer built before sharding, alone; the peak's message said only "though every
    # block is its own fully_shard unit and reshards after forward"
    run = _run(opt_foreign=36, peak=3 * 2**20, bound=PeakBound(state=2**20, unit=2**17, activations=2**18,
                                                              bound=2 * 2**20))
    said = ex04_fsdp.peak_within_bound(run).feedback
    assert said.endswith("reshards after forward; but the optimizer was built before sharding (see '[W=2] "
                         "optimizer built after sharding'): this step is not the one the bound describes, so fix "
                         "that first"), said


@pytest.mark.parametrize("raised,name", [  # PyTorch 2.13's words, as the ranks raise them
    ("ValueError: fully_shard does not support containers that do not implement forward: ModuleList(",
     "fully_shard called on the ModuleList"),
    ("AssertionError: Each distinct composable distributed API can only be applied to a module once. fully_shard "
     "has already been applied to the following module:", "fully_shard applied twice to one module"),
    ("TypeError: Invariant encountered: value was None when it should not be", "root sharded before its blocks"),
    ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Timed out waiting 30000ms for recv "
     "operation to complete", "state-dict collective on rank 0 only, not completed"),
    ("RuntimeError: [rank0]:[F1202 17:49:30.615257792 ProcessGroupGloo.cpp:1537] Check failed: outputShape[0] * "
     "worldSize == inputShape[0] (8 vs. 7).", "ZeRO-1 reduce-scatter input not padded"),
    ("RuntimeError: Check failed: outputTensors[i].dtype() == inputTensors[i].dtype() (float vs. c10::BFloat16).",
     "ZeRO-1 collective of two dtypes"),
    ("RuntimeError: ProcessGroupGloo::allgather: invalid tensor size at index 1 (expected (4), got (3))",
     "ZeRO-1 all-gather sizes unequal"),
])
def test_known_errors_named(raised, name):
    assert translate(raised, ex04_fsdp.KNOWN_ERRORS).startswith(f"{name}: ")


@pytest.mark.parametrize("imported", ["before the spy", "under the spy"])
def test_the_state_dict_spy_sees_every_import_style(tmp_path, imported):
    """No launch (one gloo rank in this process): get_model_state_dict imported by name, through an alias
    of its module, or by attribute, is recorded each time."""
    import torch
    import torch.distributed as dist

    from autograder.checks.ex04_fsdp.state_dict_spy import StateDictSpy
    from autograder.rank import watched
    from distlab.runtime.importing import import_path

    (tmp_path / "styles.py").write_text(
        "import torch.distributed.checkpoint.state_dict\nimport torch.distributed.checkpoint.state_dict as S\n"
        "from torch.distributed.checkpoint.state_dict import get_model_state_dict\n\n\n"
        "def every_style(model):\n    get_model_state_dict(model)\n    S.get_model_state_dict(model)\n"
        "    torch.distributed.checkpoint.state_dict.get_model_state_dict(model)\n")
    load = lambda: watched(import_path(tmp_path / "styles.py", name=f"learner_dsd_{imported[0]}"))  # noqa: E731
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        learner = load() if imported == "before the spy" else None
        with StateDictSpy("test/styles") as spy:
            learner = learner or load()
            learner.every_style(torch.nn.Linear(3, 2))
    finally:
        dist.destroy_process_group()
    assert [c["fn"] for c in spy.calls] == ["get_model_state_dict"] * 3


def test_the_loops_criterion_on_crafted_ranks():
    """No launch: a loss shown to any precision is found in what rank 0 printed; a loss of several elements is no
    one number to look for (it was a format error of the grader's)."""
    from autograder.checks.ex04_fsdp.loop import loop_contract, shows
    from autograder.checks.ex04_fsdp.observations import Run

    assert shows("loss tensor(2.2911)", 2.29114) and shows("2.29e+00", 2.2891) and not shows("step 2 of 4", 2.0)
    ranks = [FsdpRank(rank=r, world=2, steps=4, last_loss=2.5 + r, printed=["loss 2.500"] if r == 0 else [])
             for r in range(2)]
    assert loop_contract(Run(ranks)).ok
    ranks[1].printed = ["rank 1: 3.5"]
    assert loop_contract(Run(ranks)).feedback.startswith("rank 1 printed its own last loss (rank 1: 'rank 1: 3.5')")
    ranks[1].printed, ranks[0].last_loss = [], None
    assert loop_contract(Run(ranks)).feedback.startswith("train_step returned a tensor of more than one element")
    # rank 0 printed nothing before an export that never finished: a print after it is unseen, so not "printed nothing"
    ranks[0].last_loss, ranks[0].printed = 2.5, []
    assert loop_contract(Run(ranks)).feedback.startswith("rank 0's train_fsdp printed nothing")
    assert loop_contract(Run(ranks, export_ended="the job hung")).feedback.startswith(
        "not checked: rank 0 had printed no loss when its export began, and the export did not finish")
