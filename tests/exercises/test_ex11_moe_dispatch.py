"""Exercise 11 (expert parallelism's uneven dispatch and combine): the solution and the independent one
score full marks, the stub 0, and each known mistake fails with its own feedback, naming the cause with
numbers; all of them graded in one 2-rank launch."""
from __future__ import annotations

import re

import pytest

from autograder.checks import ex11_moe_dispatch as check
from tests.exercises import independent
from tests.helpers import ABORTED, EXERCISES, SOLUTIONS, failed, mutant

FILE = check.EXERCISE.filename
A2A = "all_to_all_single_autograd(x_slots[perm], output_split_sizes, input_split_sizes, dist.group.WORLD)"
MISTAKES = {
    "splits not exchanged": {"    dist.all_to_all_single(recv, send)  # rank j's element `rank` lands at recv[j]\n"
                             "    return recv.tolist()": "    return list(input_split_sizes)"},
    "not inverted": {"return back.new_zeros(n_slots, back.shape[1]).index_copy(0, perm, back)":
                     "return torch.cat([back, back.new_zeros(n_slots - len(back), back.shape[1])])"},
    "wrong key": {"torch.argsort(expert[kept], stable=True)": "torch.argsort(-expert[kept], stable=True)"},
    "not autograd": {"    return " + A2A: "    out = x_slots.new_empty(sum(output_split_sizes), x_slots.shape[1])\n"
                     "    dist.all_to_all_single(out, x_slots[perm], output_split_sizes, input_split_sizes)\n"
                     "    return out"},
    # a blind audit's (its feedback said dropped slots were sent, and to count only those): keep on the sorted order
    "keep on the sorted order": {"    perm = kept[torch.argsort(expert[kept], stable=True)]\n":
                                 "    perm = torch.argsort(expert, stable=True)[keep]\n"},
    "capacity not applied": {"kept = keep.nonzero().squeeze(1)": "kept = torch.arange(len(expert))"},
    "sort returns nothing": {"    return perm, torch.bincount(": "    result = perm, torch.bincount("},
    # the realistic family's (benchmarks/realistic/ex11.py): an expert with no kept slot drops out of the counts
    "bincount without minlength": {"minlength=world_size": "minlength=0"},
    # notebook 11's count exchange called instead of writing one (issue 38: the runtime's copy is named)
    "the runtime's copy": {"    send = torch.tensor(input_split_sizes, dtype=torch.int64)\n"
                           "    recv = torch.empty_like(send)\n"
                           "    dist.all_to_all_single(recv, send)  # rank j's element `rank` lands at recv[j]\n"
                           "    return recv.tolist()":
                           "    from distlab.lab.expert_parallel import exchange_counts\n\n"
                           "    return exchange_counts(torch.tensor(input_split_sizes)).tolist()"},
    "counts never sent": {"    recv = torch.empty_like(send)\n": "    recv = torch.zeros_like(send)\n",
                          "    dist.all_to_all_single(recv, send)  # rank j's element `rank` lands at recv[j]\n": ""},
    # a blind audit's: positions in the kept list, not slots; dispatch's splits swapped; combine's inverse wrong
    "perm in kept": {"perm = kept[torch.argsort(expert[kept], stable=True)]":
                     "perm = torch.argsort(expert[kept], stable=True)"},
    "dispatch splits swapped": {A2A: A2A.replace("output_split_sizes, input_split_sizes",
                                                 "input_split_sizes, output_split_sizes")},
    "counts dropped too": {"torch.bincount(expert[kept], minlength=world_size)":
                           "torch.bincount(expert, minlength=world_size)"},
    "combine inverse wrong": {"index_copy(0, perm, back)": "index_copy(0, torch.argsort(perm), back)"},
    # a blind audit's: the dropped slots' rows left as new_empty made them (tiny values: within the tolerance)
    "combine rows not zeroed": {"back.new_zeros(n_slots, back.shape[1])": "back.new_empty(n_slots, back.shape[1])"},
    # blind audits': per-expert nonzero().squeeze() (a 0-d tensor where an expert has one slot); combine's buffer
    # made in torch's default dtype; the counts exchanged in place (one tensor as the all-to-all's output and input)
    "sort by squeezed blocks": {
        "    kept = keep.nonzero().squeeze(1)\n    # stable":
        "    blocks = [((expert == j) & keep).nonzero().squeeze() for j in range(world_size)]\n"
        "    return torch.cat(blocks), [len(b) for b in blocks]\n"
        "    kept = keep.nonzero().squeeze(1)\n    # stable"},
    "combine buffer in the default dtype": {"return back.new_zeros(n_slots, back.shape[1]).index_copy(0, perm, back)":
                                            "return torch.zeros(n_slots, back.shape[1]).index_copy(0, perm, back)"},
    "counts exchanged in place": {"    recv = torch.empty_like(send)\n    dist.all_to_all_single(recv, send)":
                                  "    recv = send\n    dist.all_to_all_single(send, send)"},
    "combine splits not swapped": {
        "back = all_to_all_single_autograd(y_recv, input_split_sizes, output_split_sizes, dist.group.WORLD)":
        "back = all_to_all_single_autograd(y_recv, output_split_sizes, input_split_sizes, dist.group.WORLD)"},
}
SPLITS, EXCHANGED = ("[W=2] the kept slots sorted by expert, and the split sizes exact",
                     "[W=2] the split sizes exchanged, by one all-to-all of counts")
DISPATCH, COMBINE = ("[W=2] dispatch: each expert's rank receives the rows sent to it, in rank order",
                     "[W=2] combine: every slot gets its expert's output back, zeros for the dropped")
C_GRADS, D_GRADS = ("[W=2] backward: the expert's and the router's gradients match, back through combine",
                    "[W=2] backward: the input's gradient matches, back through dispatch")
DTYPE = "[W=2] dispatch and combine return rows in their input's dtype"
D_COMM, C_COMM = ("[W=2] dispatch: one all-to-all in the forward, one in the backward, nothing else",
                  "[W=2] combine: one all-to-all in the forward, one in the backward, nothing else")


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    paths = [SOLUTIONS / FILE, independent.path(11), EXERCISES / FILE]
    paths += [mutant(tmp_path_factory.mktemp(f"m{i}"), FILE, c) for i, c in enumerate(MISTAKES.values())]
    # then rank 1 leaves (os._exit) in exchange_split_sizes, in dispatch, in combine: each file is launched again
    # after it
    paths.append(mutant(tmp_path_factory.mktemp("exits"), FILE, EXCHANGE_EXITS))
    paths.append(mutant(tmp_path_factory.mktemp("dispatch_exits"), FILE, exits_in("dispatch")))
    paths.append(mutant(tmp_path_factory.mktemp("combine_exits"), FILE, exits_in("combine")))
    # last: its backward's all-to-all gets splits that do not match the peer's, and gloo aborts; the file is
    # launched again without the backward
    paths.append(mutant(tmp_path_factory.mktemp("own"), FILE, OWN_ALL_TO_ALL_BACKWARD_SPLITS))
    out = dict(zip(["solution", "independent", "stub", *MISTAKES, "exchange exits", "dispatch exits", "combine exits",
                    "own all-to-all"], check.grade(paths)))
    return out


# a blind audit's crash: rank 1 leaves with exit code 3 and no exception in exchange_split_sizes (the grading process
# crashed on it, or blamed the correct sort_by_expert with it, whichever rank's error came first)
EXCHANGE_EXITS = {"    send = torch.tensor(input_split_sizes, dtype=torch.int64)\n":
                  "    if dist.get_rank() == 1:\n        import os\n        os._exit(3)\n"
                  "    send = torch.tensor(input_split_sizes, dtype=torch.int64)\n"}


def exits_in(fn: str) -> dict[str, str]:
    """Rank 1 leaves with exit code 3 on entering ``fn`` (audit N's: a combine that aborts cost dispatch's marks, a
    dispatch that hung cost combine's)."""
    first = {"dispatch": "    return all_to_all_single_autograd(x_slots[perm]",
             "combine": "    back = all_to_all_single_autograd(y_recv"}[fn]
    return {first: f"    if dist.get_rank() == 1:\n        import os\n        os._exit(3)\n{first}"}


OWN_ALL_TO_ALL_BACKWARD_SPLITS = {  # the audit's: a hand-written all-to-all Function, its backward's splits wrong
    "def dispatch(x_slots": (
        "class _AllToAll(torch.autograd.Function):\n"
        "    @staticmethod\n"
        "    def forward(ctx, x, output_split_sizes, input_split_sizes):\n"
        "        ctx.splits = (output_split_sizes, input_split_sizes)\n"
        "        out = x.new_empty(sum(output_split_sizes), *x.shape[1:])\n"
        "        dist.all_to_all_single(out, x.contiguous(), output_split_sizes, input_split_sizes)\n"
        "        return out\n\n"
        "    @staticmethod\n"
        "    def backward(ctx, grad):\n"
        "        output_split_sizes, input_split_sizes = ctx.splits\n"
        "        grad_x = grad.new_empty(sum(output_split_sizes), *grad.shape[1:])\n"
        "        dist.all_to_all_single(grad_x, grad.contiguous(), output_split_sizes, output_split_sizes)\n"
        "        return grad_x, None, None\n\n\n"
        "def dispatch(x_slots"),
    "    return all_to_all_single_autograd(x_slots[perm], output_split_sizes, input_split_sizes, dist.group.WORLD)":
        "    return _AllToAll.apply(x_slots[perm], output_split_sizes, input_split_sizes)",
}


def test_a_backward_that_aborts_gloo_costs_the_backward_only(graded):
    r = graded["own all-to-all"]
    fails = failed(r)
    backward = [c.name for c in r.criteria][4:8]
    # the split and the forward, kept before the backward, at full marks; and the float64 calls, made in the launch
    # after it on their own
    assert list(fails) == backward, r.feedback
    assert f"ok  {DTYPE}: float64 rows in, float64 rows out, in dispatch and combine" in r.feedback
    assert re.fullmatch(rf"the backward through dispatch and combine did not finish: {ABORTED}.*", fails[backward[0]],
                        re.S), fails[backward[0]]
    assert fails[backward[1]] == ("not checked: the backward through dispatch and combine did not finish "
                                  f"(see '{backward[0]}')")


def test_a_rank_that_exits_in_dispatch_or_combine_costs_that_functions_criteria_and_the_backwards(graded):
    dispatch_rows, combine_rows, *backward = [c.name for c in graded["solution"].criteria][2:8]
    for fn, gone, other in (("dispatch", dispatch_rows, combine_rows), ("combine", combine_rows, dispatch_rows)):
        r = graded[f"{fn} exits"]
        fails = failed(r)
        assert list(fails) == [gone, *backward, DTYPE], r.feedback  # the other function's forward graded, and passed
        assert fails[gone].startswith(f"{fn} did not finish: rank 1 exited with code 3 without raising"), fails[gone]
        assert fails[backward[0]] == f"not checked: {fn} did not finish (see '{gone}')", fails[backward[0]]
    # combine, run after dispatch ended, was given the grader's rows and says so
    assert "(given the grader's dispatched rows: yours did not finish, see above)" in \
        graded["dispatch exits"].feedback, graded["dispatch exits"].feedback


def test_a_rank_that_exits_in_the_exchange_costs_the_exchange_only(graded):
    r = graded["exchange exits"]
    fails = failed(r)
    assert list(fails) == [EXCHANGED], r.feedback  # sort_by_expert, kept before it; the rest, in the next launch
    assert fails[EXCHANGED].startswith("exchange_split_sizes did not finish: rank 1 exited with code 3 without "
                                       "raising a Python exception"), fails[EXCHANGED]
    # what went on from the grader's counts says so only where the learner's were wrong: these were not
    assert "yours" not in r.feedback.split(EXCHANGED, 1)[1].split("\n", 1)[1], r.feedback


def test_solution_and_independent_full_marks(graded):
    for name in ("solution", "independent"):
        r = graded[name]
        assert r.score == r.max_score, (name, r.feedback)
    # The same adds in the same order as the single-process MoE: one expert output per token (top-1).
    assert graded["solution"].measurements["W2_y_max_abs_diff"] == 0
    assert graded["solution"].measurements["dropped_slots"] == 2   # capacity bites: rank 0 routes 17 to expert 1


def test_the_stub_scores_zero_not_implemented(graded):
    r = graded["stub"]
    assert (r.ran, r.score) == (False, 0) and "not implemented yet (ex11_moe_dispatch.py line " in r.feedback


def test_splits_not_exchanged_names_what_the_other_rank_sends(graded):
    f = failed(graded["splits not exchanged"])
    assert set(f) == {EXCHANGED}
    assert "exchange_split_sizes returned [7, 15], its own input_split_sizes" in f[EXCHANGED]
    assert "[7, 13] rows" in f[EXCHANGED]


def test_permutation_not_inverted_is_named(graded):
    f = failed(graded["not inverted"])
    assert set(f) == {COMBINE, C_GRADS, C_COMM}  # dispatch is graded alone, its backward too: right
    assert "in the order they were sent (by expert): row k belongs to slot perm[k]" in f[COMBINE]
    assert f[C_GRADS] == f[C_COMM] == f"not checked: the grader's combine ran in place of yours (see '{COMBINE}')"
    said = next(c.feedback for c in graded["not inverted"].criteria if c.name == D_GRADS)
    assert said.endswith("(through the grader's combine: yours is wrong, see above)"), said


def test_wrong_sort_key_is_located(graded):
    f = failed(graded["wrong key"])
    assert set(f) == {SPLITS}   # the rest is graded with the right order: one mistake, one criterion
    assert "perm is not in expert order: its slot" in f[SPLITS]
    assert "goes to expert 0 after one for expert 1" in f[SPLITS]


def test_all_to_all_without_autograd_is_named(graded):
    f = failed(graded["not autograd"])
    assert set(f) == {D_GRADS, D_COMM}  # combine's backward carries the expert's gradients, and its all-to-all
    for said in f.values():
        assert "dispatch returned a tensor with no grad_fn" in said and "all_to_all_single_autograd" in said


def test_keep_applied_to_the_sorted_order_is_named(graded):
    f = failed(graded["keep on the sorted order"])
    assert set(f) == {SPLITS}, f
    assert re.match(r"rank [01]'s perm is argsort\(expert\) masked with keep: .* so perm sends dropped slots \[\d+.*"
                    r"\] and leaves out kept slots \[\d+", f[SPLITS]), f[SPLITS]


def test_capacity_not_applied_counts_the_dropped_slots(graded):
    f = failed(graded["capacity not applied"])
    assert set(f) == {SPLITS}
    assert "rank 0's perm holds 24 slots, 2 of them dropped at capacity" in f[SPLITS]


def test_a_function_that_returns_nothing_is_named(graded):
    f = failed(graded["sort returns nothing"])
    assert set(f) == {SPLITS}
    assert f[SPLITS].startswith("rank 0's sort_by_expert returned None, where its contract returns (perm, ")


def test_counts_exchanged_by_no_collective_are_named(graded):
    f = failed(graded["counts never sent"])
    assert set(f) == {EXCHANGED}
    said = f[EXCHANGED]
    assert "rank 0's exchange_split_sizes made no collective and returned [0, 0], where the ranks send it [7, 13]" \
        in said and "read before anything was written" not in said


def test_counts_that_leave_out_an_expert_with_none_are_named_on_the_contracts_edge_case(graded):
    f = failed(graded["bincount without minlength"])
    assert set(f) == {SPLITS}  # the routed step itself gives every expert a slot: only the edge case shows it
    assert ("where the last expert gets no slot (expert=[0, 0, 0, 0, 0, 0], keep=[True, True, True, True, True, "
            "True], W=2), sort_by_expert returned input_split_sizes [6], where the kept slots per expert are [6, 0]"
            ) in f[SPLITS]


def test_the_runtimes_copy_of_the_count_exchange_is_named(graded):
    f = failed(graded["the runtime's copy"])
    assert list(f) == [EXCHANGED], f   # everything else is the solution's, and the copy's result is right
    assert f[EXCHANGED] == ("exchange_split_sizes is distlab's copy (it calls "
                            "distlab.lab.expert_parallel.dispatch.exchange_counts): write your own"), f[EXCHANGED]


def test_a_perm_of_positions_in_the_kept_list_is_named_not_taken_for_dropped_slots(graded):
    f = failed(graded["perm in kept"])
    assert set(f) == {SPLITS}, f  # the layer runs on the grader's perm: dispatch and combine are graded alone
    assert f[SPLITS].startswith("rank 0's perm holds positions 0..21 in the list of its 22 kept slots, not the "
                                "slots' own indices"), f[SPLITS]
    assert "dropped at capacity" not in f[SPLITS]
    f = failed(graded["counts dropped too"])
    assert set(f) == {SPLITS}, f
    assert f[SPLITS].startswith("rank 0's input_split_sizes is [7, 17], the slots per expert dropped ones included; "
                                "it sends only the kept ones, [7, 15] per expert"), f[SPLITS]


def test_dispatch_and_combine_are_graded_apart_each_named(graded):
    # dispatch's splits swapped: combine, given the right rows, is right
    f = failed(graded["dispatch splits swapped"])
    assert DISPATCH in f and COMBINE not in f, f
    assert "dispatch returned 22 rows, the number it sends (the sum of input_split_sizes), not the 20 it receives" \
        in f[DISPATCH], f[DISPATCH]
    assert f[D_GRADS] == f"not checked: the grader's dispatch ran in place of yours (see '{DISPATCH}')"
    assert C_GRADS not in f and C_COMM not in f, f  # combine's backward, through the grader's dispatch: right
    # combine's inverse permutation wrong: dispatch is right
    f = failed(graded["combine inverse wrong"])
    assert set(f) == {COMBINE, C_GRADS, C_COMM}, f
    assert re.match(r"rank [01]'s combine put the expert's outputs in the wrong slots: slot \d+ holds slot \d+'s",
                    f[COMBINE]), f[COMBINE]
    # combine's dropped rows left unwritten: fresh memory holds NaN in the grader's runs, whatever it held before
    f = failed(graded["combine rows not zeroed"])
    assert DISPATCH not in f and COMBINE in f, f
    assert re.match(r"rank [01]'s combine returned NaN in the rows of the \d+ dropped slots \[", f[COMBINE]), f[COMBINE]
    # combine's all-to-all with dispatch's splits: it raises, and dispatch keeps its marks, its backward's too
    f = failed(graded["combine splits not swapped"])
    assert set(f) == {COMBINE, C_GRADS, C_COMM}, f
    assert "combine sends those back, so its two lists swap places" in f[COMBINE], f[COMBINE]


def test_an_expert_with_one_slot_a_default_dtype_buffer_and_an_in_place_exchange_are_named(graded):
    f = failed(graded["sort by squeezed blocks"])
    assert list(f) == [SPLITS], f  # the routed step has no expert with one slot: the edge case shows it
    assert f[SPLITS].startswith("sort_by_expert raised RuntimeError: zero-dimensional tensor (at position 0) cannot "
                                "be concatenated where an expert gets a single kept slot (expert=[0, 1, 1, 1]"), f
    f = failed(graded["combine buffer in the default dtype"])
    assert list(f) == [DTYPE], f  # float32 rows: right
    assert f[DTYPE].startswith("given float64 y_recv, rank 0's combine raised RuntimeError: index_copy_(): self and "
                               "source expected to have the same dtype"), f[DTYPE]
    f = failed(graded["counts exchanged in place"])
    assert EXCHANGED in f, f
    # gloo's all-to-all on one buffer: whether a rank's counts survive it is a race (a CI run had them all right),
    # so it is named from the call, whatever the run returned
    assert f[EXCHANGED].startswith("rank 0's exchange_split_sizes made its all_to_all_single with one tensor as both "
                                   "its output and its input: the counts it receives land in the buffer it is still "
                                   "sending from"), f[EXCHANGED]
    for name in ("combine inverse wrong", "dispatch splits swapped"):  # a wrong function: its own criterion only
        assert DTYPE not in failed(graded[name]), name


def test_the_causes_explain_nothing_they_cannot_see_on_crafted_runs():
    """No launch: a perm of positions where they are the slots themselves (rank 1 drops none), and a combine whose
    kept slots are all right, explain nothing, and raise nothing."""
    import torch

    from autograder.checks.ex11_moe_dispatch.causes import perm_in_kept, wrong_slots
    from autograder.checks.ex11_moe_dispatch.observations import MoEStep, Run

    ranks = [MoEStep(rank=r, world=2) for r in range(2)]
    run = Run(ranks)
    assert run.slots(1).keep.all()  # rank 1 keeps every slot: its positions in the kept list are its slots
    ranks[1].returned.perm = torch.arange(len(run.slots(1).keep)).flip(0)
    assert perm_in_kept(run) is None
    want = torch.randn(len(run.slots(0).keep), 8)
    dropped = int((~run.slots(0).keep).nonzero()[0])
    got = want.clone()
    got[dropped] += 1.0  # a dropped slot not zero: no kept slot holds another's row
    ranks[0].y_slots, ranks[0].y_slots_want = got, want
    assert wrong_slots(run) is None
