"""Exercise 9 (a hang diagnosed and fixed): the solution and the independent one score full marks, the
stub 0, and each known mistake (the unfixed job among them: its would-be hang is stopped by the
grader's ledger of collectives, on every rank at once, naming each rank's line) fails with its own
feedback. Part 2 (``train_uneven``, ranks with uneven numbers of batches: the solution by hand, the independent
one by DDP's join) rides in the same files: part 1's mutants keep part 2's marks and part 2's keep part 1's.
One launch on 2 ranks grades every file, and one on 4 (beside it) every file's ``train_uneven``."""
from __future__ import annotations

import re

import pytest

from autograder.checks import ex09_hang as check
from tests.exercises import independent
from tests.helpers import EXERCISES, SOLUTIONS, failed, mutant

FILE = check.EXERCISE.filename
FIX = ("        # No branch on this rank's data before a collective: an empty selection gives a loss of 0\n"
       "        # and zero gradients, which is exactly this rank's share of the global sum.\n")
SKIP = "        if not keep.any():\n            continue\n"
MISTAKES = {
    "the unfixed job": {FIX: SKIP},
    # the blind audit's: the update guarded by this rank's own data, so the rank that kept nothing skips it
    "the update guarded by the rank's own data": {"                if count > 0:  # the same on every rank":
                                                  "                if keep.any():  # this rank's own data"},
    # a blind audit's: no backward on an empty selection, and each parameter whose .grad is None skipped
    "None gradients skipped": {
        "        loss = nn.functional.cross_entropy(model(x[keep]), y[keep], reduction=\"sum\")\n"
        "        model.zero_grad()\n        loss.backward()\n":
        "        model.zero_grad(set_to_none=True)\n        if keep.any():\n"
        "            nn.functional.cross_entropy(model(x[keep]), y[keep], reduction=\"sum\").backward()\n",
        "                grad = p.grad if p.grad is not None else torch.zeros_like(p)\n":
        "                if p.grad is None:\n                    continue\n                grad = p.grad\n"},
    "a barrier in its place": {FIX: "        if not keep.any():\n            dist.barrier()\n            continue\n"},
    "the collectives removed": {FIX: SKIP, "        dist.all_reduce(count)\n": "",
                                "                dist.all_reduce(grad)\n": ""},
    "the step skipped everywhere": {FIX: "        empty = torch.tensor(float(not keep.any()))\n"
                                         "        dist.all_reduce(empty)\n"
                                         "        if empty > 0:\n            continue\n"},
    "a stale gradient sent": {FIX: "        if not keep.any():  # take part, with what is left in .grad\n"
                                   "            dist.all_reduce(torch.zeros(()))\n"
                                   "            for p in model.parameters():\n"
                                   "                dist.all_reduce(p.grad.clone())\n"
                                   "            continue\n"},
    "zero_grad after backward": {"        model.zero_grad()\n        loss.backward()\n":
                                 "        loss.backward()\n        model.zero_grad()\n"},
    "no backward": {"        loss.backward()\n": ""},
    "the count kept local": {"        dist.all_reduce(count)\n": ""},
    # the realistic family's (benchmarks/realistic/ex09.py): no guard for a step no rank kept anything at
    "a global count of 0 divided by": {"                if count > 0:  # the same on every rank: count is the "
                                       "all-reduced, global one\n                    p -= lr * grad / count":
                                       "                p -= lr * grad / count"},
    "the gradients kept local": {"                dist.all_reduce(grad)\n": ""},
    "the update rebinds the name": {"p -= lr * grad / count": "p = p - lr * grad / count"},
    "the count reduced before it is set": {
        "        count = keep.sum().to(torch.float32)\n        dist.all_reduce(count)\n":
        "        dist.all_reduce(count)\n        count = keep.sum().to(torch.float32)\n"},
}
# Part 2 (train_uneven): the reference's loop by hand, and DDP's join() in its place
BODY = (SOLUTIONS / FILE).read_text().split("### BEGIN SOLUTION\n")[-1].split("    ### END SOLUTION")[0]
JOINED = """    from torch.nn.parallel import DistributedDataParallel
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=lr)
    with {joined}.join({kwargs}):
        for x, y in batches:
            opt.zero_grad()
            nn.functional.cross_entropy({forward}(x), y).backward()
            opt.step()
    return model
"""
NEXT = "        batch = next(stream, None)  # None once this rank has run out\n"
EXIT = "        if total == 0:\n            return model\n"
UPDATE = "                p -= lr * flat[offset:offset + p.numel()].view_as(p) / total\n"
UNEVEN_MISTAKES = {
    "uneven: the rank out of data leaves": {NEXT: NEXT + "        if batch is None:\n            return model\n"},
    "uneven: join's default division": {BODY: JOINED.format(joined="ddp", kwargs="", forward="ddp")},
    "uneven: the forwards bypass DDP": {
        BODY: JOINED.format(joined="ddp", kwargs="divide_by_initial_world_size=False", forward="model")},
    "uneven: join on the model": {BODY: JOINED.format(joined="model", kwargs="", forward="ddp")},
    "uneven: stops at the shortest": {
        EXIT: "        have = torch.tensor(float(batch is not None))\n"
              "        dist.all_reduce(have, op=dist.ReduceOp.MIN)  # does every rank still have a batch?\n"
              "        if have == 0:\n            return model\n"},
    "uneven: a stale gradient sent": {
        "        model.zero_grad()  # .grad None: a rank out of data sends zeros below\n":
        "        if batch is not None:\n            model.zero_grad()\n"},
    "uneven: the rank out of data stops updating": {UPDATE: "                if batch is not None:\n    " + UPDATE},
    "uneven: the exit checked after the update": {EXIT: "", "                offset += p.numel()\n":
                                                   "                offset += p.numel()\n" + EXIT},
    # the mean loss (not the sum) divided by the count again: every update 1/batch of one process's
    "uneven: a mean divided again": {
        '            nn.functional.cross_entropy(model(x), y, reduction="sum").backward()\n':
        "            nn.functional.cross_entropy(model(x), y).backward()\n"},
    # a blind audit's (full marks before): the whole stream read up front
    "uneven: the stream read up front": {
        "    stream = iter(batches)\n": "    stream = iter(list(batches))\n"},
    # another's (full marks before, the stream a generator): iter() of the stream at every step, which restarts a
    # data loader at its first batch
    "uneven: iter() each step": {"    stream = iter(batches)\n": "",
                                 "        batch = next(stream, None)": "        batch = next(iter(batches), None)"},
    # a count all-reduced as an int64 where the rank has a batch, float32 where it has none (gloo aborts on it)
    "uneven: the count's dtype differs": {
        NEXT: NEXT + "        count = torch.tensor(len(batch[1])) if batch is not None else torch.tensor(0.0)\n"
                     "        dist.all_reduce(count)\n"},
    # a blind audit's (full marks at W=2 only): the sum taken with one partner rank, rank ^ 1, by send/recv
    "uneven: a partner's sum": {"        dist.all_reduce(flat)\n": "        other = torch.empty_like(flat)\n"
                                "        peer = dist.get_rank() ^ 1  # my partner\n"
                                "        reqs = [dist.isend(flat.clone(), peer), dist.irecv(other, peer)]\n"
                                "        for r in reqs:\n            r.wait()\n        flat = flat + other\n"},
}
MISTAKES.update(UNEVEN_MISTAKES)
FINISHES = "[W=2] the job finishes: every rank makes the same collectives, in order"
SAME = "[W=2] the same all-reduces on every rank, each step"
MATCHES = "[W=2] matches one process on the global batches"
EMPTY = "[W=2] a rank with nothing to keep takes part with a zero gradient"
PART1 = {FINISHES, SAME, MATCHES, EMPTY}
U_FINISHES = "[W=2] uneven batches: no rank leaves the others waiting, whichever runs out first"
U_MATCHES = ("[W=2] uneven batches (ranks with 2 and 4 batches, the longest not rank 0): one process's SGD on the "
             "global stream, at every step")
U_NO_BATCH = "[W=2] a rank with no batch at all (ranks with 0 and 2 batches): every rank ends as one process"
U_EQUAL = "[W=2] equal lengths (ranks with 2 and 2 batches): one process's SGD, one step per batch"
U_WIDE = ("[W=4] ranks with 3, 1, 0 and 3 batches: no rank leaves the others waiting, and every rank ends as one "
          "process's SGD on the global stream")
PART2 = {U_FINISHES, U_MATCHES, U_NO_BATCH, U_EQUAL, U_WIDE}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    paths = [SOLUTIONS / FILE, independent.path(9), EXERCISES / FILE]
    paths += [mutant(tmp_path_factory.mktemp(f"m{i}"), FILE, change) for i, change in enumerate(MISTAKES.values())]
    reports = dict(zip(["solution", "independent", "stub", *MISTAKES], check.grade(paths)))
    return reports


@pytest.mark.parametrize("name", ["solution", "independent"])
def test_a_fixed_job_scores_full_marks(graded, name):
    r = graded[name]
    assert r.score == r.max_score, r.feedback
    assert r.measurements["max_abs_diff_vs_reference"] < 1e-5


def test_the_solution_counts_one_all_reduce_of_the_count_and_one_per_parameter_each_step(graded):
    # 6 steps x (1 count + 4 parameters: two Linear layers' weight and bias)
    assert graded["solution"].measurements["all_reduces_per_rank"] == 30


def test_the_stub_scores_zero(graded):
    assert graded["stub"].score == 0


def test_the_unfixed_job_is_stopped_as_a_hang_naming_both_ranks_lines(graded):
    f = failed(graded["the unfixed job"])
    assert set(f) == {FINISHES, SAME, MATCHES, EMPTY}
    said = f[FINISHES]
    assert said.startswith("the job hangs: ") and "Rank 1 kept no sample at step 1" in said
    assert "(step 1) at ex09_hang.py:" in said and "(step 2) at ex09_hang.py:" in said
    assert "dist.all_reduce(count)" in said
    assert f[SAME].startswith("not checked")


def test_gradient_all_reduces_skipped_where_grad_is_none_are_named(graded):
    said = failed(graded["None gradients skipped"])[FINISHES]
    assert "Rank 1 kept no sample at step 1, made 1 all-reduce(s) at that step (ex09_hang.py:" in said, said
    assert "rank 0 made 1 at that step and waits in one more" in said and "it ran no backward at that step" in said
    assert "first difference" not in said  # a named cause: no divergence of a harmless order appended


def test_a_barrier_in_place_of_the_all_reduces_is_named(graded):
    said = failed(graded["a barrier in its place"])[FINISHES]
    assert "is barrier (step 1) at ex09_hang.py:" in said and "(dist.barrier())" in said
    assert "A barrier does not match an all-reduce" in said


def test_removing_the_collectives_is_named(graded):
    f = failed(graded["the collectives removed"])
    assert set(f) == {SAME, MATCHES, EMPTY}
    for name in (SAME, MATCHES, EMPTY):
        assert "no rank made an all-reduce in 6 steps" in f[name], name


def test_skipping_the_step_everywhere_drops_the_other_ranks_samples(graded):
    f = failed(graded["the step skipped everywhere"])
    assert set(f) == {MATCHES, EMPTY}
    for said in f.values():
        assert "at step 1 no rank all-reduced its gradients (4 all-reduces of gradients at other steps)" in said
        assert "although rank 0 kept" in said


def test_a_stale_gradient_from_the_empty_rank_is_named(graded):
    f = failed(graded["a stale gradient sent"])
    assert set(f) == {MATCHES, EMPTY}
    for said in f.values():
        assert "rank 1 kept no sample at step 1 but all-reduced tensors whose |values| sum to" in said


def test_gradients_cleared_after_backward_or_never_filled_are_named_with_what_ran(graded):
    cleared = failed(graded["zero_grad after backward"])
    assert set(cleared) == {MATCHES}
    said = cleared[MATCHES]
    assert "rank 0 kept 4 samples at step 0, yet every gradient it all-reduced there" in said
    assert "(dist.all_reduce(grad))" in said and "its backward() had given gradients whose |values| sum to" in said
    assert "cleared before the all-reduce" in said and "call loss.backward()" not in said  # it was called
    said = failed(graded["no backward"])[MATCHES]
    assert "no backward() reached the parameters at that step" in said and "cleared" not in said


def test_a_count_or_gradients_left_local_are_named(graded):
    said = failed(graded["the count kept local"])[MATCHES]
    # named at a step where the ranks' counts differ (at step 0 they are equal: a local count is right there)
    assert "at step 1 every all-reduce was of a gradient (4 on rank 0" in said, said
    assert "by all 5 of them (rank 0 kept 5, rank 1 kept 0), a number only an all-reduce of the counts gives" in said
    said = failed(graded["the gradients kept local"])[MATCHES]
    assert "no rank all-reduced a gradient in 6 steps: rank 0's 6 all-reduces were all of [] tensors" in said
    assert "(dist.all_reduce(count))" in said and "all-reduce the count" not in said  # it was


def test_an_update_guarded_by_the_ranks_own_data_is_named(graded):
    said = failed(graded["the update guarded by the rank's own data"])[MATCHES]
    assert said.startswith("the ranks ended with different weights (rank 0's and rank 1's differ by up to "), said
    assert "rank 1 kept no sample at step(s) [1]" in said and "guard the update with the global count" in said


def test_an_update_that_only_rebinds_the_name_is_named(graded):
    said = failed(graded["the update rebinds the name"])[MATCHES]
    assert "after 6 steps every rank's weights are still the initial ones" in said
    assert "(48 all-reduces of gradients)" in said


def test_an_error_in_train_names_the_learners_line(graded):
    said = failed(graded["the count reduced before it is set"])[FINISHES]
    lines = (SOLUTIONS / FILE).read_text().splitlines()
    line = [i for i, code in enumerate(lines, 1) if code == "        count = keep.sum().to(torch.float32)"][-1]
    assert said.startswith(f"train raised on rank 0 at ex09_hang.py line {line} in train: dist.all_reduce(count): ")
    assert "UnboundLocalError" in said


def test_a_division_by_a_global_count_of_0_is_named_not_read_as_a_missing_backward(graded):
    f = failed(graded["a global count of 0 divided by"])
    said = f[MATCHES]
    assert "no rank kept a sample (the all-reduced count was 0)" in said and "NaN gradients" in said
    assert "backward" not in said  # the gradients were NaN, not zero: backward() ran


# -- part 2: train_uneven -------------------------------------------------------------------------------------------
def test_each_part_costs_only_its_own_marks(graded):
    for name in MISTAKES:
        f = failed(graded[name])
        other = PART1 if name in UNEVEN_MISTAKES else PART2
        assert f and other.isdisjoint(f), (name, sorted(f))


def test_the_fixed_jobs_match_one_process_at_every_step_of_every_case(graded):
    for name in ("solution", "independent"):  # by hand, and DDP under Join
        m = graded[name].measurements
        assert max(m[f"uneven_{case}_max_abs_diff"] for case in ("uneven", "no_batch", "equal", "wide")) < 1e-5, \
            (name, m)


def test_a_mean_divided_again_is_named_by_its_scale(graded):
    f = failed(graded["uneven: a mean divided again"])
    assert re.search(r"rank 1's update was 0\.25x \(1/4\) one process's SGD step on the step's samples at every "
                     r"step it shows", f[U_MATCHES]), f[U_MATCHES]


def test_a_stream_read_up_front_is_named(graded):
    f = failed(graded["uneven: the stream read up front"])
    assert list(f) == [U_EQUAL], f
    assert f[U_EQUAL].startswith("with ranks with 2 and 4 batches, rank 1 had taken 3 batches past the one going "
                                 "through the model (of its 4)"), f[U_EQUAL]


def test_iter_of_the_stream_at_every_step_is_refused_at_the_learners_line(graded):
    f = failed(graded["uneven: iter() each step"])
    assert f[U_FINISHES].startswith("train_uneven raised on rank "), f[U_FINISHES]
    assert "batch = next(iter(batches), None)" in f[U_FINISHES] and "RuntimeError: iter() was called on this " \
        "rank's stream of batches a second time: a data loader's stream starts over" in f[U_FINISHES], f[U_FINISHES]


def test_the_stub_says_train_uneven_is_not_implemented(graded):
    said = failed(graded["stub"])
    for name in PART2:
        assert said[name].startswith("not implemented yet: train_uneven raised NotImplementedError at ex09_hang.py")


def test_a_rank_that_leaves_when_its_data_ends_is_stopped_as_a_hang_at_the_waiting_ranks_line(graded):
    f = failed(graded["uneven: the rank out of data leaves"])
    assert set(f) == {U_FINISHES, U_MATCHES, U_NO_BATCH, U_WIDE}  # with equal lengths nobody waits
    said = f[U_FINISHES]
    assert said.startswith("the job hangs with ranks with 2 and 4 batches: rank 1 waits in all_reduce of [213] at "
                           "ex09_hang.py:")
    assert "(dist.all_reduce(flat)) (its collective 3, at its batch 2 of 4)" in said
    assert "rank 0 had returned from train_uneven after 2 collectives, out of data after its 2 batches" in said
    assert f[U_MATCHES].startswith("not checked") and f[U_NO_BATCH].startswith("not checked")
    assert f[U_WIDE].startswith("the job hangs with ranks with 3, 1, 0 and 3 batches: rank 0 waits in all_reduce of "
                                "[213] at ex09_hang.py:"), f[U_WIDE]
    assert "rank 2 had returned from train_uneven after 0 collectives, out of data, with no batch at all" in f[U_WIDE]


def test_join_dividing_by_the_initial_world_size_is_named_from_the_updates(graded):
    f = failed(graded["uneven: join's default division"])
    assert set(f) == {U_MATCHES, U_NO_BATCH, U_WIDE}  # equal lengths: every rank has data at every step
    assert ("at steps 2 and 3 only 1 of the 2 ranks had a batch, and rank 1's update there was 0.5x one process's on "
            "those samples (1x at the steps where every rank had one)") in f[U_MATCHES]
    assert "at steps 0 and 1 only 1 of the 2 ranks had a batch" in f[U_NO_BATCH]
    assert "at steps 0, 1 and 2 only 3 of the 4 ranks had a batch, and rank 3's update there was 0.75x" in f[U_WIDE]
    for said in f.values():
        assert "divide_by_initial_world_size=False" in said


def test_forwards_that_bypass_the_ddp_wrapper_are_named(graded):
    f = failed(graded["uneven: the forwards bypass DDP"])
    assert set(f) == {U_MATCHES, U_EQUAL, U_WIDE}  # (0, 2): the rank with batches alone is the global stream
    for said in f.values():
        assert said.startswith("no rank all-reduced a gradient with ranks with ")
        assert "forwards of a batch called the model itself, not the wrapper" in said


def test_join_called_on_the_model_is_named_with_its_error_and_line(graded):
    f = failed(graded["uneven: join on the model"])
    assert set(f) == PART2
    said = f[U_FINISHES]
    assert said.startswith("train_uneven raised on rank 0 with ranks with 2 and 4 batches at ex09_hang.py line ")
    assert "uneven: join() called on a model that is not wrapped in DDP: join() is a method of " in said
    assert "(AttributeError: 'Sequential' object has no attribute 'join')" in said


def test_a_loop_that_stops_with_the_shortest_rank_is_named(graded):
    f = failed(graded["uneven: stops at the shortest"])
    assert set(f) == {U_MATCHES, U_NO_BATCH, U_WIDE}
    assert f[U_MATCHES].startswith("rank 1 ran 3 of its 4 batches through the model, and its weights after "
                                   "train_uneven are one process's after 2 steps: the job stopped as rank 0 ran out")
    assert "one process's after 0 steps: the job stopped as rank 0 had no batch at all" in f[U_NO_BATCH]


def test_a_stale_gradient_from_a_rank_out_of_data_is_named_at_its_line(graded):
    f = failed(graded["uneven: a stale gradient sent"])
    assert set(f) == {U_MATCHES, U_WIDE}  # the rank without any batch has no gradient to leave behind
    assert f[U_MATCHES].startswith("rank 0 had run out of data (after its 2 batches), yet all-reduced tensors whose "
                                   "|values| sum to ")
    assert "at ex09_hang.py:" in f[U_MATCHES] and "(dist.all_reduce(flat))" in f[U_MATCHES]


def test_a_rank_out_of_data_that_stops_updating_is_named(graded):
    f = failed(graded["uneven: the rank out of data stops updating"])
    assert set(f) == {U_MATCHES, U_NO_BATCH, U_WIDE}
    assert f[U_MATCHES].startswith("rank 0's weights after train_uneven are one process's after 2 steps, the batches "
                                   "it had, while rank 1's match one process's after all 4 steps")
    assert f[U_NO_BATCH].startswith("rank 0's weights after train_uneven are still the initial ones: it had no batch")


def test_an_update_after_the_last_batch_that_divides_by_0_is_named(graded):
    f = failed(graded["uneven: the exit checked after the update"])
    assert set(f) == {U_MATCHES, U_NO_BATCH, U_EQUAL, U_WIDE}
    for said in f.values():
        assert "and NaN when train_uneven returned" in said and "divided by a count of 0" in said


def test_a_collective_whose_dtype_differs_between_ranks_is_named_before_it_runs(graded):
    f = failed(graded["uneven: the count's dtype differs"])
    said = f[U_FINISHES]
    assert "is all_reduce of " in said and "the same all_reduce of " in said, said
    assert "int64[]" in said and "float32[]" in said and "a collective combines one dtype on every rank" in said


def test_a_sum_with_one_partner_rank_passes_at_2_ranks_and_is_named_at_4_by_the_groups_the_ranks_ended_in(graded):
    f = failed(graded["uneven: a partner's sum"])
    assert list(f) == [U_WIDE], f  # at 2 ranks the partner is every other rank
    said = f[U_WIDE]
    assert said.startswith("with ranks with 3, 1, 0 and 3 batches the ranks ended with 2 different models: ranks 0 "
                           "and 1 with the same weights, ranks 2 and 3 with the same weights, the models up to "), said
    assert "(rank 0's collectives: send of [213], recv of [213]); each group's weights are one process's that learnt " \
        "from its own ranks' batches only" in said, said
