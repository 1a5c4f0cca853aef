"""Exercise 2: the reference solution scores full marks, the stub 0, and each usual mistake fails
with its own feedback. The solution and the mutants are graded in one launch (``grade``)."""
from __future__ import annotations

import re

import pytest
import torch

from autograder.checks import ex02_accumulation as check
from tests.exercises import independent
from tests.helpers import failed, feedback_of, mutant, solution_and_mutants

FILE = check.EXERCISE.filename
# The solution's loss line, and a micro-batch's mean loss (what most mistakes start from).
LOSS, MEAN = "loss = summed * (world / count.item())", "loss = summed / y.ne(IGNORE_INDEX).sum()"
WORLD = "world = dist.get_world_size() if dist.is_initialized() else 1"  # the solution's world size
MUTANTS = {
    "not_divided_no_sync": {
        LOSS: MEAN,
        "contextlib.nullcontext() if boundary else model.no_sync()": "contextlib.nullcontext()",
    },
    "zero_grad_every_micro_step": {
        "                loss.backward()\n": "                optimizer.zero_grad()\n                loss.backward()\n",
    },
    "divided_by_k": {LOSS: MEAN + " / accumulation_steps"},
    "step_every_micro_step": {
        "        optimizer.step()\n        optimizer.zero_grad()\n": "",
        "            window_loss += summed.item() / count.item()\n":
            "            window_loss += summed.item() / count.item()\n"
            "            optimizer.step()\n            optimizer.zero_grad()\n",
    },
    "never_zero_grad": {"        optimizer.step()\n        optimizer.zero_grad()\n": "        optimizer.step()\n"},
    "zero_grad_before_step": {
        "        optimizer.step()\n        optimizer.zero_grad()\n":
            "        optimizer.zero_grad()\n        optimizer.step()\n",
    },
    # A blind audit's (full marks before): zero_grad at each window's start, so the last window's gradients are
    # still in .grad when it returns
    "zero_grad_at_window_start": {
        "        optimizer.step()\n        optimizer.zero_grad()\n": "        optimizer.step()\n",
        "        window_loss = 0.0\n": "        window_loss = 0.0\n        optimizer.zero_grad()\n"},
    # A blind audit's GPU habit: the world size from the GPUs (1 on a machine without them)
    "world_from_gpus": {WORLD: "world = max(torch.cuda.device_count(), 1)"},
    # Every micro-batch weighs the same, whatever its size: right for equal sizes only.
    # and, over padded sequences, the mean of the micro-batches' token means (the 2024 accumulation bug).
    "equal_weights": {LOSS: MEAN + " / len(window)"},
    # Each rank divides by its own token count: right while every rank has as many labels.
    "local_count": {"        dist.all_reduce(count)\n": "", LOSS: "loss = summed / count.item()"},
    # The count not all-reduced, DDP's average undone all the same: the ranks' own means summed, in every scenario.
    "local_count_times_world": {"        dist.all_reduce(count)\n": ""},
    # The global count, but DDP's average over the ranks not undone.
    "over_world": {LOSS: "loss = summed / count.item()"},
    "padding_counted": {"(micro_batches[i][1] != IGNORE_INDEX).sum()": "micro_batches[i][1].numel()"},
    # Skips the step of a window shorter than accumulation_steps (and so its samples).
    "no_step_on_short_window": {
        "        optimizer.step()\n        optimizer.zero_grad()\n":
            "        if len(window) == accumulation_steps:\n"
            "            optimizer.step()\n        optimizer.zero_grad()\n",
    },
    # no_sync() on the window's last micro-step too: DDP never averages.
    "never_synced": {"contextlib.nullcontext() if boundary else model.no_sync()": "model.no_sync()"},
    # off by one: the first micro-step of each window synced, not the last (one all-reduce per window all the same)
    "synced_first_micro_step": {"boundary = i == window[-1]": "boundary = i == window[0]"},
    # every micro-step synced: the sum of averages is the average of the sum, so only the communication is wrong
    "synced_every_micro_step": {"contextlib.nullcontext() if boundary else model.no_sync()":
                                "contextlib.nullcontext()"},
    "no_backward": {"                loss.backward()\n": ""},
    # Blind audits' (full marks at world size 2 alone): DDP's average undone with a world size that is 2 at 2 ranks
    # on one node, and not at 4 ranks on 2 nodes: a constant, and the processes of one node.
    "world_hard_coded_2": {WORLD: "world = 2"},
    "world_from_local_world_size": {"import contextlib\n": "import contextlib\nimport os\n",
                                    WORLD: 'world = int(os.environ["LOCAL_WORLD_SIZE"])'},
}


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict:
    paths = solution_and_mutants(tmp_path_factory.mktemp("ex02"), FILE, MUTANTS)
    paths["independent"] = independent.path(2)
    # last: it raises in the padded sequences' scenario alone, which ends the launch; launched again without it
    paths["tokens not flattened"] = mutant(tmp_path_factory.mktemp("flat"), FILE, TOKENS_NOT_FLATTENED)
    graded = dict(zip(paths, check.grade(list(paths.values()))))
    return graded


TOKENS_NOT_FLATTENED = {  # the audit's: (batch, seq, classes) logits into cross_entropy as they are
    "cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),": "cross_entropy(logits, y,"}


def test_a_scenario_that_raises_costs_its_own_marks_only(reports):
    r = reports["tokens not flattened"]
    fails = failed(r)
    (tokens,) = [c.name for c in r.criteria if c.name.startswith("[padded sequences")]
    assert list(fails) == [tokens, FOUR_RANKS], r.feedback  # the three other scenarios, run again without it: right
    assert re.match(r"train_accumulated on padded sequences did not finish: your code raised on rank \d: "
                    r"RuntimeError: .*\n  at ex02_accumulation\.py line \d+ in train_accumulated: ", fails[tokens]), \
        fails[tokens]
    assert fails[FOUR_RANKS].startswith("train_accumulated on padded sequences at 4 ranks did not finish: your code "
                                        "raised on rank"), fails[FOUR_RANKS]


def test_solution_full_marks(reports):
    report = reports["solution"]
    assert report.score == report.max_score, report.feedback
    assert report.measurements["equal_max_abs_diff_vs_reference"] < 1e-5
    assert report.measurements["W4_tokens_max_abs_diff_vs_reference"] < 1e-5


def test_the_independent_solution_scores_full_marks(reports):
    r = reports["independent"]
    assert r.score == r.max_score, r.feedback


def test_loss_not_divided(reports):
    report = reports["not_divided_no_sync"]
    msg = "is the micro-batch gradients not divided, not the mean over its N={} samples on all ranks"
    assert msg.format(64) in feedback_of(report, "after 4 micro-batches")  # the contract's N: every rank's
    assert msg.format(48) in feedback_of(report, "unequal sizes")


def test_short_window_divided_by_k(reports):
    report = reports["divided_by_k"]
    short = feedback_of(report, "final short window")
    assert "micro-batch gradients divided by accumulation_steps=4" in short
    assert "normalise the final, shorter window over its own samples" in short
    unequal = feedback_of(report, "unequal sizes")
    assert "equal weights" not in unequal  # k=3 windows: 1/k is 1/3 there
    assert "divided by accumulation_steps=3" in unequal
    # The first wrong window of the unequal scenario has k micro-batches: no "shorter window" advice there.
    assert "scale each micro-batch's mean loss by n_i / N" in unequal and "shorter" not in unequal
    assert not any("[equal sizes" in name for name in failed(report))


def test_allreduce_every_micro_step(reports):
    report = reports["not_divided_no_sync"]
    allreduce = feedback_of(report, "all-reduced once")
    assert "[4, 4, 4] times per window of 4 micro-steps" in allreduce and "model.no_sync()" in allreduce
    assert "during micro-step(s) [1, 2, 3, 4] of its 4 (counted with a comm hook" in feedback_of(
        report, "still differ inside a window")
    assert "which costs an all-reduce per micro-step" in feedback_of(report, "still differ inside a window")


def test_a_sync_at_every_micro_step_costs_the_communication_criteria_only(reports):
    fails = failed(reports["synced_every_micro_step"])
    assert len(fails) == 2 and all("[equal sizes" in name for name in fails), fails  # once per window; inside it
    assert all("during micro-step(s) [1, 2, 3, 4] of its 4" in why or "[4, 4, 4] times per window" in why
               for why in fails.values()), fails


def test_a_window_synced_on_its_first_micro_step_is_named_not_as_one_per_micro_step(reports):
    report = reports["synced_first_micro_step"]
    inside = feedback_of(report, "still differ inside a window")
    assert inside.startswith("in window 0 DDP all-reduced the gradients during micro-step(s) [1] of its 4"), inside
    assert "per micro-step" not in inside  # one all-reduce per window: only not on the window's last micro-step
    assert "all-reduced once" not in " ".join(failed(report))


def test_zero_grad_every_micro_step(reports):
    report = reports["zero_grad_every_micro_step"]
    msg = "zero_grad() ran in the middle of a window (after micro-step 1 of 4)"
    assert msg in feedback_of(report, "one optimizer step and zero_grad per window")
    assert msg in feedback_of(report, "after 4 micro-batches")


def test_step_every_micro_step(reports):
    report = reports["step_every_micro_step"]
    msg = "optimizer.step() ran 12 times for 12 micro-batches with accumulation_steps=4"
    assert msg in feedback_of(report, "one optimizer step and zero_grad per window")
    assert "final short window" in " ".join(failed(report))
    # Its no_sync() was right: one all-reduce per window; the mid-window check names the schedule.
    assert not any("all-reduced once" in name for name in failed(report))
    assert msg in feedback_of(report, "still differ inside a window")


def test_never_zeroed_is_named_and_the_first_window_still_passes(reports):
    report = reports["never_zero_grad"]
    msg = ("at the start of window 1 the gradients still held the previous window's (zero_grad() ran 0 times in "
           "3 windows)")
    assert msg in feedback_of(report, "one optimizer step and zero_grad per window")
    assert msg in feedback_of(report, "parameters after 3 optimizer steps")
    # The first window's gradient, its all-reduce and the ranks' difference mid-window were right.
    assert not any(k in name for name in failed(report) for k in ("gradient after", "all-reduced", "still differ"))


def test_zero_grad_at_each_windows_start_is_named_from_the_gradients_left(reports):
    report = reports["zero_grad_at_window_start"]
    assert list(failed(report)) == ["[equal sizes, k=4] one optimizer step and zero_grad per window"], report.feedback
    assert feedback_of(report, "one optimizer step and zero_grad per window").startswith(
        "optimizer.zero_grad() ran at the start of each window, before its first forward, not after its step: "
        "train_accumulated returned with the last window's gradients still in .grad")


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="with a GPU a rank, the GPUs are the ranks")
def test_a_world_size_from_the_gpus_is_named_at_its_line(reports):
    said = feedback_of(reports["world_from_gpus"], "gradient after 4 micro-batches")
    assert re.search(r"your code called torch\.cuda\.device_count\(\) \(ex02_accumulation\.py:\d+\), which counts "
                     r"this machine's GPUs \(\d+ here\), not the ranks \(2\)", said), said


def test_zero_grad_before_step_is_named(reports):
    report = reports["zero_grad_before_step"]
    msg = "zero_grad() ran after the window's last backward but before optimizer.step(), so 3 of 3 steps saw all-zero"
    assert msg in feedback_of(report, "one optimizer step and zero_grad per window")
    assert msg in feedback_of(report, "after 4 micro-batches")
    assert "in the middle of a window" not in report.feedback


def test_equal_weights_for_unequal_micro_batches(reports):
    report = reports["equal_weights"]
    unequal = feedback_of(report, "unequal sizes")
    assert "is the micro-batch gradients divided by the 3 micro-batches (equal weights), not the mean over its N=48" \
        in unequal and "its share of the window's samples n_i / N" in unequal
    # With equal sizes dividing by the number of micro-batches is right, and so is the short window (2 of 8 each).
    assert list(failed(report)) == [name for name in failed(report) if "unequal sizes" in name or "padded" in name]


def test_never_synced_is_named(reports):
    report = reports["never_synced"]
    msg = "DDP never all-reduced the gradients of window 0 (0 all-reduce rounds in its 4 micro-steps, 3 of 3 windows"
    assert msg in feedback_of(report, "all-reduced once")
    assert msg in feedback_of(report, "after 4 micro-batches")
    assert "model.no_sync()" in feedback_of(report, "all-reduced once")
    # The ranks did keep their own gradients inside the windows, and the schedule was right.
    assert not any(k in name for name in failed(report) for k in ("still differ", "zero_grad per window"))


def test_no_backward_is_named_not_no_sync(reports):
    report = reports["no_backward"]
    said = feedback_of(report, "all-reduced once")
    assert "at all 3 optimizer steps the gradients were zero on rank 0 (every .grad None or 0, after 12 forwards)" \
        in said and "no_sync" not in said  # it ran the last micro-step outside no_sync: no advice about that
    assert "no backward() reached the parameters" in feedback_of(report, "after 4 micro-batches")


def test_skipped_short_window_step_is_named(reports):
    report = reports["no_step_on_short_window"]
    msg = ("optimizer.step() ran after [4, 4] micro-batches; the windows have [4, 4, 2] (the final, shorter window "
           "must still end with a step)")
    assert msg in feedback_of(report, "final short window")
    assert "the windows have [3, 3, 2]" in feedback_of(report, "unequal sizes")
    assert not any("[equal sizes" in name for name in failed(report))


def test_known_errors_are_translated():
    from autograder.grader.diagnosis import translate
    assert translate("AttributeError: 'Sequential' object has no attribute 'no_sync'", check.KNOWN_ERRORS) \
        .startswith("no_sync called on model.module: ")
    assert "backward() ran twice" in translate("RuntimeError: Trying to backward through the graph a second time "
                                               "(or directly access saved tensors...", check.KNOWN_ERRORS)


TOKENS = "padded sequences"
FOUR_RANKS = check.four_rank_token_parameters.rule.name


def test_mean_of_token_means_is_named(reports):
    tokens = feedback_of(reports["equal_weights"], TOKENS)
    assert "non-padding tokens per micro-batch [9, 4] on rank 0 and [2, 14] on rank 1" in tokens
    assert "divided by the 2 micro-batches (equal weights), not the mean over its N=29 tokens on all ranks" in tokens
    assert "weighs a token of a short micro-batch more" in tokens and "reduction='sum'" in tokens


def test_local_token_count_is_named(reports):
    report = reports["local_count"]
    assert "normalised by each rank's own token count" in feedback_of(report, TOKENS)
    assert "all_reduce the window's token count" in feedback_of(report, TOKENS)
    assert list(failed(report)) == [name for name in failed(report) if TOKENS in name]  # equal counts: right


def test_a_local_count_times_the_world_size_is_named_in_every_scenario(reports):
    report = reports["local_count_times_world"]
    assert len(failed(report)) >= 4, failed(report)
    for name, why in failed(report).items():
        world = 4 if name == FOUR_RANKS else 2
        assert f"normalised by each rank's own count and multiplied by the world size ({world})" in why, (name, why)


def test_padding_counted_is_named(reports):
    report = reports["padding_counted"]
    assert "normalised with padding included (64 labels), not the mean over its N=29" in feedback_of(report, TOKENS)
    assert list(failed(report)) == [name for name in failed(report) if TOKENS in name]  # no padding: right


def test_ddp_average_not_undone_is_named(reports):
    report = reports["over_world"]
    msg = "averaged by DDP over 2 ranks (1/2 of the mean), not the mean over its N={}"
    assert msg.format(64) in feedback_of(report, "after 4 micro-batches")
    assert msg.format("29 tokens") in feedback_of(report, TOKENS)
    assert "multiplied by the world size" in feedback_of(report, TOKENS)


def test_a_world_size_right_at_two_ranks_alone_is_named_at_four_on_two_nodes(reports):
    said = {name: failed(reports[name]) for name in ("world_hard_coded_2", "world_from_local_world_size")}
    assert all(list(fails) == [FOUR_RANKS] for fails in said.values()), said  # right at 2 ranks: all passes there
    assert said["world_hard_coded_2"][FOUR_RANKS] == (
        "at 4 ranks on 2 nodes of 2, rank 0's gradient at each of its 2 optimizer steps was 2/4 of the window's mean "
        "over every non-padding token on all ranks (x0.5): the loss was multiplied by 2 where DDP divides the ranks' "
        "summed gradients by the world size, 4; take the world size from dist.get_world_size()")
    assert re.search(r"was 2/4 of .*: the loss was multiplied by 2 where .* the world size, 4; your code read "
                     r"LOCAL_WORLD_SIZE \(ex02_accumulation\.py:\d+\), which counts the processes of one node \(2 "
                     r"here\), not the ranks of the job", said["world_from_local_world_size"][FOUR_RANKS]), said
