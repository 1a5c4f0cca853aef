"""Exercise 8 (a tensor-parallel MLP block by hand): the solution scores full marks at W=2 and W=4, the
stub 0 ("not implemented"), and each known mistake fails with its own feedback, naming the cause with
numbers. One launch per world size grades every file: the W=2 one stays in the fast tier, the W=4 one
is `slow`."""
from __future__ import annotations

import re

import pytest

from autograder.checks import ex08_tensor_parallel as check
from autograder.grader.diagnosis import translate
from tests.exercises import independent
from tests.helpers import EXERCISES, SOLUTIONS, failed, mutant

FILE = check.EXERCISE.filename
COLUMN_FORWARD = "        return F.linear(CopyToParallelRegion.apply(x), self.weight, self.bias)\n"
SPLIT = "        x = x.chunk(dist.get_world_size(){})[dist.get_rank()]\n"
COLUMN_WEIGHT, ROW_WEIGHT = ("linear.weight.detach().chunk(world_size, dim=0)",
                             "linear.weight.detach().chunk(world_size, dim=1)")
ROW_FORWARD = "ReduceFromParallelRegion.apply(F.linear(x, self.weight)) + self.bias"
ROW_INIT = "        ### BEGIN SOLUTION\n        # A column slice"
G_BACKWARD = "    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:\n        ### BEGIN SOLUTION\n"
F_REDUCE = "        dist.all_reduce(grad)  # op=ReduceOp.SUM, the default\n"
MISTAKES = {
    "f and g swapped": {"F.linear(CopyToParallelRegion.apply(x)": "F.linear(ReduceFromParallelRegion.apply(x)",
                        ROW_FORWARD: "CopyToParallelRegion.apply(F.linear(x, self.weight)) + self.bias"},
    # a blind audit's (its feedback named only the shapes): f wrapping the column layer's output, not its input
    "f on the column output": {"F.linear(CopyToParallelRegion.apply(x), self.weight, self.bias)":
                               "CopyToParallelRegion.apply(F.linear(x, self.weight, self.bias))"},
    "no backward all-reduce": {"        dist.all_reduce(grad)  # op=ReduceOp.SUM, the default\n": ""},
    "no forward all-reduce": {"        dist.all_reduce(out)  # op=ReduceOp.SUM: each": "        # each"},
    "bias on every rank": {ROW_FORWARD: "ReduceFromParallelRegion.apply(F.linear(x, self.weight, self.bias))"},
    "column cut by input features": {COLUMN_WEIGHT: ROW_WEIGHT},
    "row cut by output features": {ROW_WEIGHT: COLUMN_WEIGHT},
    "batch split": {COLUMN_FORWARD: SPLIT.format("") + COLUMN_FORWARD},
    "features split": {COLUMN_FORWARD: SPLIT.format(", dim=-1") + COLUMN_FORWARD},
    "every rank keeps shard 0": {"chunk(world_size, dim=0)[rank]": "chunk(world_size, dim=0)[0]"},
    "views, not copies": {"[rank].clone())": "[rank])"},
    "unsplit layer kept": {ROW_INIT: ROW_INIT.replace("SOLUTION\n", "SOLUTION\n        self.linear = linear\n")},
    "averaged": {"dist.all_reduce(out)": "dist.all_reduce(out, op=dist.ReduceOp.AVG)"},
    "g's backward returns nothing": {G_BACKWARD + "        return grad\n": G_BACKWARD + "        pass\n"},
    "f's backward returns nothing": {F_REDUCE + "        return grad\n": F_REDUCE},
    "column forward returns nothing": {"        return F.linear(CopyToParallelRegion":
                                       "        F.linear(CopyToParallelRegion"},
    # f communicating in the forward (a classic of Megatron's conjugate pair); g through an autograd all-reduce,
    # whose backward all-reduces again; the row bias inside the partial sums, split or on rank 0 only
    "f reduces in the forward": {"        ### BEGIN SOLUTION\n        return x\n":
                                 "        ### BEGIN SOLUTION\n        x = x.clone()\n        dist.all_reduce(x)\n"
                                 "        return x\n"},
    "g by torch.distributed.nn": {"import torch.distributed as dist\n": "import torch.distributed as dist\n"
                                  "import torch.distributed.nn.functional as dist_nn\n",
                                  ROW_FORWARD: "dist_nn.all_reduce(F.linear(x, self.weight)) + self.bias"},
    "bias split over the ranks": {ROW_FORWARD: "ReduceFromParallelRegion.apply(F.linear(x, self.weight, "
                                  "self.bias / dist.get_world_size()))"},
    # a blind audit's: y = x W in the row layer's forward (its shard right): the forward raises on every rank
    "row forward without the transpose": {ROW_FORWARD: "ReduceFromParallelRegion.apply(x @ self.weight) + self.bias"},
    # a blind audit's: the bias inside rank 0's partial sum only (rank 1's bias then gets no gradient at all)
    "bias on rank 0 only": {ROW_FORWARD: "ReduceFromParallelRegion.apply(F.linear(x, self.weight, "
                            "self.bias if dist.get_rank() == 0 else None))"},
    # The blind audit's: shards taken every W-th row and column (the bias, placed right, is judged so), and the
    # input's gradient divided by the world size after f's all-reduce (DDP's habit)
    "strided shards": {"linear.weight.detach().chunk(world_size, dim=0)[rank].clone()":
                       "linear.weight.detach()[rank::world_size].clone()",
                       "linear.bias.detach().chunk(world_size, dim=0)[rank].clone()":
                       "linear.bias.detach()[rank::world_size].clone()",
                       "linear.weight.detach().chunk(world_size, dim=1)[rank].clone()":
                       "linear.weight.detach()[:, rank::world_size].clone()"},
    "f divides after its all-reduce": {F_REDUCE: F_REDUCE + "        grad /= dist.get_world_size()\n"},
    # blind audits': the column layer cut by the process's rank, not the rank given (right when each rank builds
    # its own); its weight made with torch's default dtype and copied into (right from a float32 block)
    "column cut by the process's rank": {"        ### BEGIN SOLUTION\n        # chunk(..)[rank]":
                                         "        ### BEGIN SOLUTION\n        rank = dist.get_rank()\n"
                                         "        # chunk(..)[rank]"},
    "column weight in the default dtype": {
        "self.weight = nn.Parameter(linear.weight.detach().chunk(world_size, dim=0)[rank].clone())":
        "self.weight = nn.Parameter(torch.empty(linear.out_features // world_size, linear.in_features))\n"
        "        with torch.no_grad():\n"
        "            self.weight.copy_(linear.weight.chunk(world_size, dim=0)[rank])"},
    # Right numbers, one collective too many: no cause to name, the count by kind says it.
    "input broadcast first": {COLUMN_FORWARD: "        with torch.no_grad():\n            dist.broadcast(x, src=0)\n"
                              + COLUMN_FORWARD},
    # a blind audit's: torch.addmm takes matrices only, where the contract's x is (..., in) (10 of 10 on a 2-D x)
    "column forward on 2-D x only": {COLUMN_FORWARD: "        return torch.addmm(self.bias, "
                                     "CopyToParallelRegion.apply(x), self.weight.t())\n"},
}
# The criteria's names at W=2 (the W=4 tests look for phrases, not names).
HOLDS = "[W=2] each rank holds its 1/2 of the weights, as new parameters"
OUTPUT = "[W=2] the output matches the unsplit block"
BIAS = "[W=2] the row layer's bias is added once, after the all-reduce"
FWD_COMM = "[W=2] one all-reduce in the forward, in RowParallelLinear"
X_GRAD = "[W=2] the input's gradient matches the unsplit block"
GRADS = "[W=2] each shard's gradient matches the unsplit block's"
BWD_COMM = "[W=2] one all-reduce in the backward, of the input's gradient"


def _grade(tmp_path_factory, world: int, stub: bool) -> dict:
    """The solution, the independent one, (the stub,) and every mutant."""
    paths = [SOLUTIONS / FILE, independent.path(8)] + ([EXERCISES / FILE] if stub else [])
    for i, change in enumerate(MISTAKES.values()):
        paths.append(mutant(tmp_path_factory.mktemp(f"w{world}m{i}"), FILE, change))
    graded = dict(zip(["solution", "independent"] + (["stub"] if stub else []) + list(MISTAKES),
                      check.grade(paths, world_sizes=(world,))))
    return graded


@pytest.fixture(scope="module")
def w2(tmp_path_factory):
    """Every file in one 2-rank launch: the one launch of this file in the fast tier."""
    return _grade(tmp_path_factory, 2, stub=True)


@pytest.fixture(scope="module")
def w4(tmp_path_factory):
    return _grade(tmp_path_factory, 4, stub=False)


def test_solution_full_marks_at_w2_exact_where_exact(w2):
    r = w2["solution"]
    assert r.score == r.max_score, r.feedback
    # Bit-identical by construction: the all-reduce hands every rank the same sum, and each adds the same bias.
    assert r.measurements["W2_output_rank_spread"] == 0
    # Exact by construction: 1/2 of 96x16 + 96 and of 16x96 floats, plus the 16-float second bias, 4 B each.
    assert (r.measurements["W2_bytes_per_rank"], r.measurements["unsplit_bytes"]) == (6400, 12736)


def test_the_independent_solution_scores_full_marks_at_w2(w2):
    r = w2["independent"]
    assert r.score == r.max_score, r.feedback


def test_the_stub_scores_zero_not_implemented(w2):
    r = w2["stub"]
    assert (r.ran, r.score) == (False, 0)
    assert "not implemented yet (ex08_tensor_parallel.py line " in r.feedback
    assert "raise NotImplementedError" in r.feedback


def test_swapped_f_and_g_is_named_everywhere_it_shows(w2):
    f = failed(w2["f and g swapped"])
    assert set(f) == {OUTPUT, BIAS, FWD_COMM, X_GRAD, GRADS, BWD_COMM}  # the shards themselves are right
    for name, said in f.items():
        assert "f and g are swapped" in said, name
    assert "all-reduce ran in ColumnParallelLinear, on its 4x3x16 input" in f[OUTPUT] and "with 2·x" in f[OUTPUT]
    assert "the backward's all-reduce summed the output's gradient" in f[BWD_COMM]


def test_no_backward_all_reduce_shows_each_ranks_part_adding_up(w2):
    f = failed(w2["no backward all-reduce"])
    assert set(f) == {X_GRAD, BWD_COMM}  # the forward and the shards' gradients do not need it
    for said in f.values():
        assert "the backward made no all-reduce" in said and "the 2 ranks' parts add up to the unsplit block's" in said
        assert "CopyToParallelRegion.backward must all-reduce (sum)" in said


def test_f_on_the_column_layers_output_is_named_by_what_it_all_reduced(w2):
    f = failed(w2["f on the column output"])
    assert set(f) == {X_GRAD, GRADS, BWD_COMM}, f  # f's forward is the identity: the forward is right
    for said in f.values():
        assert said.startswith("rank 0's backward all-reduced a 4x3x48 tensor, the shape of ColumnParallelLinear's "
                               "output on a rank (its 48 of the 96 hidden features), not the 4x3x16 gradient"), said
        assert "f (the identity forward, an all-reduce in the backward) goes on the column layer's input x" in said


def test_no_forward_all_reduce_shows_the_partial_sums_adding_up(w2):
    f = failed(w2["no forward all-reduce"])
    assert set(f) == {OUTPUT, BIAS, FWD_COMM}  # g's backward is the identity either way: the gradients are right
    for said in f.values():
        assert "the forward made no all-reduce" in said and "the 2 ranks' partial sums add up" in said


def test_bias_on_every_rank_is_counted(w2):
    f = failed(w2["bias on every rank"])
    assert set(f) == {OUTPUT, BIAS}
    for said in f.values():
        assert "partial sum holds 1.00x the bias" in said and "summed it 2 times" in said
        assert "plus 1x the bias" in said and "once, after ReduceFromParallelRegion" in said


def test_f_in_the_forward_g_in_the_backward_and_a_split_bias_are_named(w2):
    assert "an all-reduce in ColumnParallelLinear, on its 4x3x16 input (the same x on every rank, so the column " \
        "layer computed with 2·x), besides g's in RowParallelLinear" in failed(w2["f reduces in the forward"])[FWD_COMM]
    g = failed(w2["g by torch.distributed.nn"])
    assert FWD_COMM not in g and OUTPUT not in g  # its forward is right
    assert "its all-reduce 1 summed a 4x3x16 gradient that was the same on every rank" in g[BWD_COMM]
    bias = failed(w2["bias split over the ranks"])[BIAS]
    assert "(rank 0's 0.50x, rank 1's 0.50x)" in bias and "once, after ReduceFromParallelRegion" in bias
    rank0 = failed(w2["bias on rank 0 only"])
    assert "(rank 0's 1.00x, rank 1's 0.00x)" in rank0[BIAS], rank0
    assert rank0["[W=2] each shard's gradient matches the unsplit block's"] == (
        "rank 1's RowParallelLinear.bias has no gradient after the backward: its forward did not use self.bias on this "
        f"rank (see '{BIAS}')")


def test_a_shard_cut_along_the_wrong_dimension_is_located(w2):
    col, row = failed(w2["column cut by input features"]), failed(w2["row cut by output features"])
    assert "ColumnParallelLinear.weight is 96x8: columns 0:8 of the unsplit 96x16 weight, that is input" in col[HOLDS]
    assert "keeps rows 0:48 of the unsplit 96x16 weight" in col[HOLDS]
    assert "RowParallelLinear.weight is 8x96: rows 0:8 of the unsplit 16x96 weight, that is output" in row[HOLDS]
    assert "keeps columns 0:48 of the unsplit 16x96 weight and the whole bias" in row[HOLDS]
    # The forward raises on every rank: the grader's layer stands in for the one that does not hold its shard, so
    # f, g and the other layer keep their marks (a blind audit's 0 of 10 before), each saying so
    assert set(col) == set(row) == {HOLDS}, (col, row)
    said = {c.name: c.feedback for c in w2["column cut by input features"].criteria}
    assert re.search(
        re.escape(f"(with the grader's ColumnParallelLinear in place of yours, which does not hold its shard (see "
                  f"'{HOLDS}'): with it your step raised RuntimeError: mat1 and mat2 shapes cannot be multiplied "
                  "(12x16 and 8x96) at ex08_tensor_parallel.py line ") + r"\d+" +
        re.escape(" in forward: return F.linear(CopyToParallelRegion.apply(x), self.weight, self.bias))") + "$",
        said[OUTPUT]), said[OUTPUT]
    assert said[BWD_COMM].endswith(" (with the grader's ColumnParallelLinear in place of yours)"), said[BWD_COMM]
    said = {c.name: c.feedback for c in w2["row cut by output features"].criteria}
    assert "grader's RowParallelLinear in place of yours" in said[OUTPUT] and "(12x48 and 96x8)" in said[OUTPUT]


def test_an_input_split_across_the_ranks_is_named(w2):
    batch, features = failed(w2["batch split"]), failed(w2["features split"])
    assert set(batch) == {OUTPUT, BIAS, X_GRAD, GRADS, BWD_COMM}  # its one forward all-reduce is in place
    for name in (OUTPUT, X_GRAD):
        assert "ColumnParallelLinear returned 2x3x48 for the 4x3x16 input on rank 0: 6 of its 12 rows" in batch[name]
        assert "splits the weights, not the batch" in batch[name]
    assert "Mismatch in shape" in batch[X_GRAD]  # what the backward raised, after the cause
    assert set(features) == {OUTPUT}, features  # the grader's ColumnParallelLinear stood in: f, g and the row layer
    assert "ColumnParallelLinear's matmul got a 12x8 input on rank" in features[OUTPUT]
    assert "8 of x's 16 features" in features[OUTPUT] and "(12x8 and 16x48)" in features[OUTPUT]


def test_a_forward_that_raises_though_its_layer_holds_its_shard_costs_the_output_only(w2):
    # a blind audit's y = x W in RowParallelLinear (2 of 10 before, said as "a shard or the input cut wrong")
    f = failed(w2["row forward without the transpose"])
    assert set(f) == {OUTPUT}, f
    assert f[OUTPUT].startswith("RowParallelLinear.forward raised on rank ") and "though the layer holds its shard: " \
        "RuntimeError: mat1 and mat2 shapes cannot be multiplied (12x48 and 16x48)" in f[OUTPUT], f[OUTPUT]
    assert f[OUTPUT].endswith("(with the grader's RowParallelLinear in place of yours)"), f[OUTPUT]


def test_a_forward_on_2d_x_only_raises_on_the_contracts_3d_input_and_costs_the_output_only(w2):
    # a blind audit's torch.addmm(bias, x, weight.t()) in ColumnParallelLinear: 10 of 10 while x was 2-D
    f = failed(w2["column forward on 2-D x only"])
    assert set(f) == {OUTPUT}, f
    assert re.search(re.escape("ColumnParallelLinear.forward raised on rank 0, though the layer holds its shard: "
                               "RuntimeError: mat1 must be a matrix, got 3-D tensor at ex08_tensor_parallel.py line ")
                     + r"\d+" + re.escape(" in forward: return torch.addmm(self.bias, "), f[OUTPUT]), f[OUTPUT]
    assert "a forward that takes only a 2-D input: " in f[OUTPUT] and "x has shape (..., in): the grader's is " \
        "4x3x16" in f[OUTPUT], f[OUTPUT]
    assert f[OUTPUT].endswith("(with the grader's ColumnParallelLinear in place of yours)"), f[OUTPUT]


def test_a_shard_that_is_not_the_ranks_own_is_located(w2):
    f = failed(w2["every rank keeps shard 0"])
    said = "rank 1's ColumnParallelLinear.weight holds rows 0:48 of the unsplit 96x16 weight, rank 0's shard"
    for name in (HOLDS, OUTPUT, X_GRAD, GRADS):
        assert said in f[name] and "rows r·48:(r+1)·48" in f[name], name


def test_a_shard_cut_by_the_process_or_in_the_default_dtype_costs_the_holding_criterion(w2):
    by_process = failed(w2["column cut by the process's rank"])
    default = failed(w2["column weight in the default dtype"])
    assert list(by_process) == list(default) == [HOLDS]  # each rank's own step is right
    assert by_process[HOLDS].startswith("ColumnParallelLinear(linear, rank=1, world_size=2), built on rank 0, holds as "
                                        "its weight rows 0:48 of the unsplit 96x16 weight, rank 0's, where rank 1's is "
                                        "rows 48:96"), by_process[HOLDS]
    assert "the shard follows the process's rank, not the rank it is given" in by_process[HOLDS]
    assert default[HOLDS].startswith("built from a float64 block, rank 0's ColumnParallelLinear.weight is float32, "
                                     "torch's default dtype, not the layer's float64"), default[HOLDS]


def test_views_and_the_unsplit_layer_cost_the_memory_criterion_only(w2):
    views, kept = failed(w2["views, not copies"]), failed(w2["unsplit layer kept"])
    assert list(views) == list(kept) == [HOLDS]  # the maths is right: only what each rank holds is wrong
    assert "ColumnParallelLinear.weight is a view into the unsplit layer's tensor: its storage is 6,144 B for its " \
           "own 3,072 B" in views[HOLDS] and ".clone()" in views[HOLDS]
    assert "RowParallelLinear also keeps linear.weight (16x96, 6,144 B), the unsplit layer's" in kept[HOLDS]


def test_an_averaging_all_reduce_is_named(w2):
    f = failed(w2["averaged"])
    assert set(f) == {OUTPUT, BIAS}
    for said in f.values():
        assert "the output minus the bias is 0.50x the unsplit block's with 2 ranks" in said
        assert "op=ReduceOp.SUM" in said


def test_an_extra_collective_is_reported_by_kind_and_layer(w2):
    f = failed(w2["input broadcast first"])
    assert list(f) == [FWD_COMM]
    assert f[FWD_COMM].startswith("rank 0's forward made 2 collectives: broadcast in ColumnParallelLinear (4x3x16), "
                                  "all_reduce in RowParallelLinear (4x3x16): the block needs one all-reduce")


def test_a_backward_or_forward_that_returns_nothing_is_named_where_the_gradient_or_value_stopped(w2):
    g, f, column = (failed(w2[k]) for k in ("g's backward returns nothing", "f's backward returns nothing",
                                            "column forward returns nothing"))
    assert "got its gradient, but none of ColumnParallelLinear.weight" in g[GRADS]
    assert "use the shard parameters" not in g[GRADS]  # they did: the gradient never reached them
    assert "every shard got its gradient but the input x got none: CopyToParallelRegion.backward returned None " \
           "(its all-reduce of 4x3x16 ran)" in f[X_GRAD]
    assert column[OUTPUT].startswith("on rank 0 ColumnParallelLinear.forward returned None, not a tensor")


def test_known_errors_are_translated():
    matmul = "RuntimeError: mat1 and mat2 shapes cannot be multiplied (12x16 and 8x96)"
    assert translate(matmul, check.KNOWN_ERRORS).startswith("matmul shapes that do not match")
    bias = "RuntimeError: The size of tensor a (48) must match the size of tensor b (96) at non-singleton dimension 1"
    assert translate(bias, check.KNOWN_ERRORS).startswith("a bias of the wrong size")
    for two_d in ("RuntimeError: mat1 must be a matrix, got 3-D tensor", "RuntimeError: self must be a matrix",
                  "RuntimeError: t() expects a tensor with <= 2 dimensions, but self is 3D"):
        assert translate(two_d, check.KNOWN_ERRORS).startswith("a forward that takes only a 2-D input"), two_d


def test_the_spy_sees_an_all_reduce_inside_an_autograd_functions_backward():
    """What the backward's criteria rest on, checked in this process (one rank, gloo, no launch)."""
    import torch
    import torch.distributed as dist

    from autograder.checks.ex08_tensor_parallel.probes import CommSpy

    class Copy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x

        @staticmethod
        def backward(ctx, grad):
            grad = grad.clone()
            dist.all_reduce(grad)
            return grad

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        x = torch.ones(3, 2, requires_grad=True)
        with CommSpy() as spy:
            y = Copy.apply(x) * 2
            spy.phase = "backward"
            y.sum().backward()
    finally:
        dist.destroy_process_group()
    assert [(c["kind"], c["phase"], c["shape"]) for c in spy.calls] == [("all_reduce", "backward", [3, 2])]
    assert torch.equal(spy.calls[0]["input"], torch.full((3, 2), 2.0))  # what went in, before the in-place sum


@pytest.mark.parametrize("opname, name", [("allreduce_", "all_reduce"), ("all_reduce", "all_reduce"),
                                          ("_allgather_base_", "all_gather"), ("all_gather_into_tensor", "all_gather"),
                                          ("reduce_scatter_tensor", "reduce_scatter"), ("broadcast_", "broadcast"),
                                          ("recv_any_source_", "recv"), ("send", "send"),
                                          ("all_to_all_single", "all_to_all")])
def test_collectives_are_named_as_the_dist_calls(opname, name):
    """The feedback's op names: the one recorder's vocabulary, which the spy records with."""
    from distlab.measure.comm import collective_kind

    assert collective_kind(opname) == name


@pytest.mark.slow
def test_solution_full_marks_at_w4(w4):
    r, other = w4["solution"], w4["independent"]
    assert r.score == r.max_score, r.feedback
    assert other.score == other.max_score, other.feedback  # the independent one, at 4 ranks too
    assert r.measurements["W4_output_rank_spread"] == 0 and r.measurements["W4_bytes_per_rank"] == 3232


W4_SAYS = {
    "f and g swapped": "computed with 4·x",
    "no backward all-reduce": "the 4 ranks' parts add up to the unsplit block's gradient",
    "f on the column output": "all-reduced a 4x3x24 tensor, the shape of ColumnParallelLinear's output on a rank",
    "no forward all-reduce": "the 4 ranks' partial sums add up to the unsplit block's output",
    "bias on every rank": "summed it 4 times: the output is the unsplit block's plus 3x the bias",
    "column cut by input features": "96x4: columns 0:4 of the unsplit 96x16 weight",
    "row cut by output features": "4x96: rows 0:4 of the unsplit 16x96 weight",
    "batch split": "ColumnParallelLinear returned 1x3x24 for the 4x3x16 input on rank 0: 3 of",
    "features split": "got a 12x4 input on rank",
    "every rank keeps shard 0": "holds rows 0:24 of the unsplit 96x16 weight, rank 0's shard",
    "views, not copies": "its storage is 6,144 B for its own 1,536 B",
    "unsplit layer kept": "also keeps linear.weight (16x96, 6,144 B)",
    "averaged": "0.25x the unsplit block's with 4 ranks",
    "input broadcast first": "2 collectives: broadcast in ColumnParallelLinear (4x3x16)",
    "g's backward returns nothing": "the gradient stopped at ReduceFromParallelRegion.backward",
    "f's backward returns nothing": "CopyToParallelRegion.backward returned None (its all-reduce of 4x3x16 ran)",
    "column forward returns nothing": "ColumnParallelLinear.forward returned None, not a tensor",
    "f reduces in the forward": "the column layer computed with 4·x), besides g's in RowParallelLinear",
    "g by torch.distributed.nn": "was the same on every rank (the block output's), so everything below it is 4x",
    "bias split over the ranks": "(rank 0's 0.25x, rank 1's 0.25x, rank 2's 0.25x, rank 3's 0.25x)",
    "bias on rank 0 only": "(rank 0's 1.00x, rank 1's 0.00x, rank 2's 0.00x, rank 3's 0.00x)",
    "row forward without the transpose": "mat1 and mat2 shapes cannot be multiplied (12x24 and 16x24)",
    "strided shards": "ColumnParallelLinear.weight (24x16) is not rows 0:24 of the unsplit 96x16 weight",
    "f divides after its all-reduce": "x.grad is 0.25x what the backward's all-reduce produced, its sum divided by",
    "column cut by the process's rank": "holds as its weight rows 0:24 of the unsplit 96x16 weight, rank 0's, where",
    "column weight in the default dtype": "ColumnParallelLinear.weight is float32, torch's default dtype",
    "column forward on 2-D x only": "mat1 must be a matrix, got 3-D tensor at ex08_tensor_parallel.py line ",
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MISTAKES))
def test_every_mistake_is_named_with_its_numbers_at_w4(w4, name):
    r = w4[name]
    assert r.score < r.max_score
    assert any(W4_SAYS[name] in said for said in failed(r).values()), r.feedback


def test_strided_shards_lose_the_shards_not_the_bias(w2):
    fails = failed(w2["strided shards"])
    assert HOLDS in fails and BIAS not in fails, fails  # the bias is added once, after the all-reduce: its own shards


def test_a_division_after_fs_all_reduce_is_said_as_such(w2):
    fails = failed(w2["f divides after its all-reduce"])
    assert fails[BWD_COMM] == ("rank 0's x.grad is 0.50x what the backward's all-reduce produced, its sum divided by "
                               "the world size (2): each rank's part is one share of the input's gradient, so their "
                               "sum is it; return the all-reduced gradient as it is"), fails[BWD_COMM]
