"""Exercise 1 (DDP): the solution scores full marks, the stub zero, and each classic mistake
is named in the learner's words with its numbers."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import torch

from autograder.grader import divergence
from autograder.checks import ex01_ddp
from distlab.runtime.launch import time_scale
from tests.exercises import independent
from tests.helpers import ABORTED, REPO, SOLUTIONS, failed, mutant, solution_and_mutants


@pytest.mark.slow
def test_cli_gives_the_solution_full_marks_at_world_sizes_2_and_4(tmp_path):
    out = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "autograder", "grade", str(SOLUTIONS), "--exercise", "1",
                           "--json", str(out)], cwd=REPO, capture_output=True, text=True,
                          timeout=200 * time_scale())  # a hang guard, scaled like the grader's own limit
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    ex = doc["exercises"][0]
    assert (ex["exercise"], ex["score"], ex["max_score"], ex["passed"]) == (1, 10, 10, True)
    assert ex["measurements"]["W2_max_abs_diff_vs_reference"] < 1e-5
    assert ex["measurements"]["W4_max_abs_diff_vs_reference"] < 1e-5
    assert "[W=4] matches single-process training" in proc.stdout


MUTANTS = {
    # Without DDP and without a sampler every rank trains alone on all the data.
    "no_ddp_no_sampler": {
        "loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)":
            "loader = DataLoader(dataset, batch_size=batch_size, shuffle=True)",
        "sampler=shard)": "sampler=None)",  # and the evaluation reads the whole set on every rank
        "ddp_model = DDP(model, device_ids=[device.index] if device.type == \"cuda\" else None)":
            "ddp_model = model",
        "torch.save(ddp_model.module.state_dict(), checkpoint_path)":
            "torch.save(ddp_model.state_dict(), checkpoint_path)",
    },
    "epoch_logging_saving": {
        "        sampler.set_epoch(epoch)": "        pass",
        "        if rank == 0:\n            # Rank 0": "        if True:\n            # Rank 0",
        "    if rank == 0:\n        torch.save(": "    if True:\n        torch.save(",
        "    dist.destroy_process_group()": "    pass",
        "DistributedSampler(dataset, shuffle=False)": "DistributedSampler(dataset, shuffle=False, drop_last=True)",
    },
    # The linear scaling rule applied by hand: DDP already averages, so the step is simply 2x too big.
    "lr_scaled": {
        "torch.optim.SGD(ddp_model.parameters(), lr=lr)":
            "torch.optim.SGD(ddp_model.parameters(), lr=lr * dist.get_world_size())",
        # Saving through `from torch import save` is still seen (and is correct).
        "import torch\n": "import torch\nfrom torch import save\n",
        "        torch.save(ddp_model.module": "        save(ddp_model.module",
    },
    "inner_forward": {"cross_entropy(ddp_model(x), y)": "cross_entropy(ddp_model.module(x), y)"},
    "shuffle_false": {"DistributedSampler(dataset, shuffle=True, seed=seed)":
                      "DistributedSampler(dataset, shuffle=False, seed=seed)"},
    "sampler_seed_per_rank": {"DistributedSampler(dataset, shuffle=True, seed=seed)":
                              "DistributedSampler(dataset, shuffle=True, seed=seed + rank)"},
    "half_batch": {"DataLoader(dataset, batch_size=batch_size, sampler=sampler)":
                   "DataLoader(dataset, batch_size=batch_size // dist.get_world_size(), sampler=sampler)"},
    "loss_times_world": {"cross_entropy(ddp_model(x), y)": "cross_entropy(ddp_model(x), y) * dist.get_world_size()"},
    "loss_over_world": {"cross_entropy(ddp_model(x), y)": "cross_entropy(ddp_model(x), y) / dist.get_world_size()"},
    # Sums the gradients DDP has just averaged.
    "manual_all_reduce": {"            loss.backward()\n": "            loss.backward()\n"
                          "            for p in ddp_model.parameters():\n                dist.all_reduce(p.grad)\n"},
    # Averages the gradients by hand instead of DDP, but nothing broadcast rank 0's initial weights.
    "manual_average_no_broadcast": {
        "ddp_model = DDP(model, device_ids=[device.index] if device.type == \"cuda\" else None)": "ddp_model = model",
        "            loss.backward()\n": "            loss.backward()\n            for p in ddp_model.parameters():\n"
                                        "                dist.all_reduce(p.grad)\n"
                                        "                p.grad /= dist.get_world_size()\n",
        "torch.save(ddp_model.module.state_dict(), checkpoint_path)":
            "torch.save(ddp_model.state_dict(), checkpoint_path)",
    },
    # evaluate_ddp's mistakes (the training in these files is the solution's).
    "eval_padding_counted": {"real = position < len(dataset)": "real = position >= 0"},
    "eval_not_reduced": {"    dist.all_reduce(totals)": "    pass"},
    # a blind audit's (full marks before): evaluation without no_grad, each batch's loss detached
    "eval_with_autograd": {"    with torch.no_grad():\n        for x, y in DataLoader(":
                           "    if True:\n        for x, y in DataLoader(",
                           'reduction="sum")\n': 'reduction="sum").detach()\n'},
    # a blind audit's (0 of 10 before: setup raised on every rank, and nothing else was graded): NCCL named
    "setup_nccl": {"backend=distlab.backend()": 'backend="nccl"'},
    # a blind audit's (its feedback said to combine the results "with a collective": it did, with dist.reduce)
    "eval_reduced_to_rank_0": {"    dist.all_reduce(totals)": "    dist.reduce(totals, dst=0)"},
    "eval_mean_of_means": {"    dist.all_reduce(totals)": "    totals = totals / totals[2]\n"
                                                          "    dist.all_reduce(totals)",
                           # and a blind audit's (10 of 10 before): the sampler left at its default seed
                           "DistributedSampler(dataset, shuffle=True, seed=seed)":
                               "DistributedSampler(dataset, shuffle=True)"},
    # Mistakes in no table, as bench_feedback generates them (a line dropped, a literal changed): the first
    # divergence from the reference's trace, or the error at the learner's line, names them.
    "unlisted_zero_grad_and_eval_error": {
        "            optimizer.zero_grad()\n            loss.backward()\n            optimizer.step()\n"
        "            total +=": "            pass\n            loss.backward()\n            optimizer.step()\n"
                               "            total +=",
        "            real = position < len(dataset)\n": "            pass\n"},
    "unlisted_eval_count_no_print": {
        "    seen = 0\n": "    seen = 1\n",
        "            print(f\"epoch {epoch}: mean loss {total.item() / len(loader):.4f} (rank 0 shard)\")":
            "            pass"},
    # A blind audit's (full marks before: the training set divides by both world sizes): drop_last=True
    "train_drop_last": {"    sampler = DistributedSampler(dataset, shuffle=True, seed=seed)\n":
                        "    sampler = DistributedSampler(dataset, shuffle=True, seed=seed, drop_last=True)\n"},
    # A blind audit's (full marks before: the evaluation set divided by neither world size): a count that drops each
    # rank's last sample past n % W, as if the sampler had padded every shard
    "eval_assumes_padding": {"            real = position < len(dataset)\n":
                             "            last = position // world == (len(dataset) - 1) // world\n"
                             "            real = ~(last & (rank >= len(dataset) % world))\n"},
    # A blind audit's (full marks before: batch_size divided each rank's shard): the DataLoader drops the last batch
    "loader_drop_last": {"DataLoader(dataset, batch_size=batch_size, sampler=sampler)":
                         "DataLoader(dataset, batch_size=batch_size, sampler=sampler, drop_last=True)"},
    # Part 2, BucketedDDP: three orthogonal mistakes a file, one for each of three of its criteria.
    "bucketed_broadcast_decimal_sync": {
        "            dist.broadcast(p.data, src=0)": "            pass",
        "bucket_cap_mb * 2**20": "bucket_cap_mb * 10**6",
        "            self.launched[i] = (dist.all_reduce(flat, async_op=True), flat)":
            "            dist.all_reduce(flat)\n            self.launched[i] = (None, flat)",
        "            work.wait()": "            work is None or work.wait()",
    },
    "bucketed_summed_forward_after": {
        "(flat / world).split(": "flat.split(",
        "if p.requires_grad][::-1]": "if p.requires_grad]",
        "                launch(i)\n": "                pass\n",
    },
    "bucketed_kept_per_parameter_end": {
        "                    p.grad.copy_(mean.view_as(p))": "                    pass",
        "            if size >= cap:": "            if True:",
        "            if self.pending[i] == 0:  # the bucket's last gradient: communicate now, while the backward "
        "goes on\n                launch(i)":
            "            if sum(self.pending) == 0:\n                for j in range(len(self.buckets)):\n"
            "                    launch(j)",
    },
    "bucketed_unwaited_past_cap_unused": {
        "            work.wait()": "            pass",
        "            if size >= cap:": "            if size > cap:",
        "                self.launch(i)": "                pass",
    },
    # Found by a tester blind to the checks: the mean divided again, and each Work waited on in the hook.
    "bucketed_twice_waited_in_hook": {
        "(flat / world).split(": "(flat / world / world).split(",
        "            self.launched[i] = (dist.all_reduce(flat, async_op=True), flat)":
            "            self.launched[i] = (dist.all_reduce(flat, async_op=True), flat)\n"
            "            self.launched[i][0].wait()"},
    # A tensor hook (register_hook) runs before .grad is accumulated: the buckets go out with last step's zeros.
    "bucketed_tensor_hook": {"p.register_post_accumulate_grad_hook(ready)": "p.register_hook(lambda g, p=p: ready(p))"},
    # A blind audit's (full marks before): only the parameters that need a gradient broadcast; the model's frozen
    # scale stays each rank's own
    "bucketed_trainable_broadcast": {
        "        for p in module.parameters():  # every rank starts from rank 0's weights\n":
        "        for p in (p for p in module.parameters() if p.requires_grad):\n",
        # and another's: the cap counted in elements, not bytes (one bucket took every gradient, launched from its
        # hook as soon as it was complete: its overlap is not judged, where it was failed with advice it followed)
        "            size += p.numel() * p.element_size()": "            size += p.numel()"},
    # The buckets a hook never completed are skipped, not launched: their used parameters keep their own gradient.
    "bucketed_unused_skipped": {
        "                self.launch(i)": "                pass",
        "zip(self.buckets, self.launched):": "((b, l) for b, l in zip(self.buckets, self.launched) if l):",
    },
}


BUCKET_ORDER_PER_RANK = {"        params = [p for p in module.parameters() if p.requires_grad][::-1]\n":
                         "        params = [p for p in module.parameters() if p.requires_grad][::-1 if dist.get_rank() "
                         "== 0 else 1]\n"}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """The mutants and the independent solution, graded at W=2 in one launch (one report each) with the
    reference solution (whose trace the failures that name no cause are compared with: ``divergence``)."""
    paths = solution_and_mutants(tmp_path_factory.mktemp("ex01"), "ex01_ddp.py", MUTANTS)
    del paths["solution"]  # the CLI test grades it at both world sizes
    paths["independent"] = independent.path(1)
    reports = divergence.grade(ex01_ddp, list(paths.values()), with_reference=True, world_sizes=(2,))
    graded = dict(zip(paths, reports))
    return graded


def test_the_independent_solution_scores_full_marks(graded):
    r = graded["independent"]
    assert r.score == r.max_score, r.feedback


EVAL = "[W=2] evaluate_ddp counts each of 21 samples once despite the sampler's padding"


@pytest.mark.slow
def test_no_sampler_and_no_ddp_are_named(graded):
    fails = failed(graded["no_ddp_no_sampler"])
    assert fails[EVAL].startswith("rank 0 read 21 samples of the 21-sample evaluation set, the whole of it")
    shard = fails["[W=2] each rank reads its own shard"]
    assert shard.startswith("every rank read all 1792 samples in each epoch (rank 0 read 1792 per epoch, not its 896)")
    # the mutant still builds its DistributedSampler and hands the DataLoader shuffle=True instead: "pass a
    # DistributedSampler" would advise a step the learner took; the message says which one was not taken
    assert "although train_ddp built 1 DistributedSampler(s)" in shard
    assert "give it to the DataLoader as sampler=" in shard and "pass a DistributedSampler" not in shard
    same = fails["[W=2] same parameters on every rank"]
    assert same.startswith("the model was never wrapped in DistributedDataParallel: each rank trained alone")
    # One mistake, one message: what needs the shards is not judged a second time.
    assert fails["[W=2] shuffled by the given seed, anew every epoch"] == \
        "not checked: needs '[W=2] each rank reads its own shard' first"


@pytest.mark.slow
def test_set_epoch_logging_and_saving_mistakes_are_named(graded):
    report = graded["epoch_logging_saving"]
    fails = failed(report)
    assert set(fails) == {"[W=2] shuffled by the given seed, anew every epoch", "[W=2] only rank 0 logs",
                          "[W=2] rank 0 saves the model once",
                          "[W=2] setup() makes the process group, teardown() destroys it", EVAL}
    assert fails["[W=2] shuffled by the given seed, anew every epoch"].startswith(
        "epoch 0 and epoch 1 read the samples in the same shuffled order: call sampler.set_epoch(epoch)")
    assert fails["[W=2] only rank 0 logs"].startswith("rank 1 printed 2 lines (first: 'epoch 0: mean loss")
    assert re.search(r"\(rank 0 shard\)', printed at ex01_ddp\.py:\d+\): print only", fails["[W=2] only rank 0 logs"])
    assert fails["[W=2] rank 0 saves the model once"] == "torch.save was called on ranks [0, 1]: save on rank 0 only"
    assert "still initialised on ranks [0, 1]" in fails["[W=2] setup() makes the process group, teardown() destroys it"]
    assert fails[EVAL].startswith("rank 0 returned loss") and "the metric of only 20 of the 21 samples" in fails[EVAL]
    # The parts that are right still earn their marks.
    assert report.score == 6.84 and report.max_score == 10   # 13 of 19 points: part 2 (BucketedDDP) is right


def _only(report, criterion: str) -> str:
    """The feedback of ``criterion``, asserting that it is the one criterion that failed (those that need it
    are "not checked")."""
    fails = {name: msg for name, msg in failed(report).items() if not msg.startswith("not checked: needs")}
    assert list(fails) == [f"[W=2] {criterion}"], fails
    return fails[f"[W=2] {criterion}"]


def test_scaled_learning_rate_is_named_with_its_factor(graded):
    msg = _only(graded["lr_scaled"], "matches single-process training")
    assert msg.startswith("the optimizer's learning rate was 0.4, 2x the lr=0.2 given")


def test_forward_on_the_inner_module_is_named_not_a_missing_wrap(graded):
    msg = _only(graded["inner_forward"], "same parameters on every rank")
    assert msg.startswith("all 46 forward passes called model.module(x), bypassing DDP's gradient all-reduce")
    assert "wrap the model" not in msg


def test_shuffle_false_is_named_not_set_epoch(graded):
    msg = _only(graded["shuffle_false"], "shuffled by the given seed, anew every epoch")
    assert msg.startswith("rank 0 read its shard in index order (0, 2, 4, ...) in both epochs")
    assert "shuffle=False" in msg
    assert "set_epoch" not in msg  # it was called (nothing in the run says otherwise): no advice to call it


def test_unlisted_mistakes_are_named_at_the_learners_line(graded):
    fails = failed(graded["unlisted_zero_grad_and_eval_error"])
    step = fails["[W=2] matches single-process training"]
    assert "\n  first difference from the reference (before any optimizer.step() call, event " in step, step
    assert "your code called backward() on a [] tensor (ex01_ddp.py:125: `loss.backward()`) where the reference " \
           "called zero_grad(); your code never does" in step
    assert fails[EVAL].startswith("evaluate_ddp raised on rank 0: NameError: name 'real' is not defined")
    assert re.search(r", at ex01_ddp.py line \d+ in evaluate_ddp: logits = model\(x\)\[real\]$", fails[EVAL]), \
        fails[EVAL]
    fails = failed(graded["unlisted_eval_count_no_print"])
    assert fails["[W=2] only rank 0 logs"] == "rank 0 printed nothing: print the loss of each epoch on rank 0"
    msg = fails[EVAL]
    assert "\n  first difference from the reference (" in msg, msg
    assert "after 46 optimizer.step() call(s), event " in msg, msg
    assert "your code called all_reduce on a [3] tensor holding (" in msg and re.search(r"\(ex01_ddp.py:\d+: ", msg)
    assert "what it held [" in msg and "] vs the reference's [" in msg


def test_samplers_seeded_per_rank_are_named(graded):
    fails = failed(graded["sampler_seed_per_rank"])
    msg = fails["[W=2] each rank reads its own shard"]
    assert "although each read its 896 once: their DistributedSamplers shuffled with different seeds" in msg
    assert not any(name in fails for name in ("[W=2] same parameters on every rank", "[W=2] only rank 0 logs"))


def test_half_batch_per_rank_is_named_with_numbers(graded):
    msg = _only(graded["half_batch"], "matches single-process training")
    assert msg.startswith("each rank read 20 samples per step, not batch_size=40: batch_size is per rank")


def test_loss_times_world_size_is_named_with_the_gradient_ratio(graded):
    msg = _only(graded["loss_times_world"], "matches single-process training")
    assert msg.startswith("the first step's gradient is 2x the reference's on the same global batch: the loss "
                          "was multiplied by the world size (2)")


def test_loss_over_world_size_is_named_with_the_gradient_ratio(graded):
    msg = _only(graded["loss_over_world"], "matches single-process training")
    assert msg.startswith("the first step's gradient is 0.5x the reference's on the same global batch: the loss "
                          "was divided by the world size (2)")


def test_all_reduce_on_top_of_ddp_is_named(graded):
    msg = _only(graded["manual_all_reduce"], "matches single-process training")
    assert msg.startswith("the first step's gradient is 2x the reference's: the gradients were also summed by "
                          "hand (6 dist.all_reduce calls on .grad before the first step) on top of DDP")


def test_hand_averaging_without_a_broadcast_is_named(graded):
    msg = _only(graded["manual_average_no_broadcast"], "same parameters on every rank")
    assert msg.startswith("the ranks made the same updates but started from different weights (rank 1 and rank 0 "
                          "differed by")
    assert "nothing broadcast rank 0's weights" in msg


def test_known_errors_are_translated():
    from autograder.grader.diagnosis import translate
    known = ex01_ddp.KNOWN_ERRORS
    assert translate("ValueError: sampler option is mutually exclusive with shuffle", known) \
        .startswith("DataLoader given a sampler and shuffle=True: ")
    assert translate("ValueError: DistributedDataParallel device_ids and output_device arguments only work with "
                     "single-device/multiple-device GPU modules or CPU modules, but got device_ids [0]", known) \
        .startswith("device_ids given for a CPU model: ")
    assert translate("ValueError: trying to initialize the default process group twice!", known) \
        .startswith("init_process_group called twice: ")


STYLES = ("by_attribute", "by_alias", "by_name")  # torch.save(...), T.save(...), save(...) (`from torch import save`)
STYLES_MODULE = (
    "import torch\nimport torch as T\nimport torch.distributed as D\nfrom torch import save\n"
    "from torch.distributed import all_reduce\n\n\n"
    "def by_attribute(t, f):\n    torch.save(t, f)\n    torch.distributed.all_reduce(t)\n\n\n"
    "def by_alias(t, f):\n    T.save(t, f)\n    D.all_reduce(t)\n\n\n"
    "def by_name(t, f):\n    save(t, f)\n    all_reduce(t)\n")


@pytest.mark.parametrize("imported", ["before the spies", "under the spies"])
def test_the_save_and_all_reduce_spies_see_every_import_style(tmp_path, imported):
    """No launch (one gloo rank in this process): each way of naming torch.save and dist.all_reduce is
    counted, whether the file was imported before the spies were entered or while they were."""
    import torch
    import torch.distributed as dist

    from autograder.checks.ex01_ddp.probes import AllReduceSpy
    from autograder.rank import SaveSpy, watched
    from distlab.runtime.importing import import_path

    (tmp_path / "styles.py").write_text(STYLES_MODULE)
    load = lambda: watched(import_path(tmp_path / "styles.py", name=f"learner_styles_{imported[0]}"))  # noqa: E731
    param = torch.nn.Parameter(torch.ones(3))
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        learner = load() if imported == "before the spies" else None
        with SaveSpy() as saves, AllReduceSpy() as reduces:
            learner = learner or load()
            reduces.grads = [param]
            for i, style in enumerate(STYLES):
                param.grad = torch.ones(3)
                getattr(learner, style)(param.grad, tmp_path / f"{i}.pt")
        assert saves.paths == [str(tmp_path / f"{i}.pt") for i in range(3)] and reduces.calls == 3
        if imported == "before the spies":  # the names it bound are put back (bound under them, they stay spies)
            assert learner.save is torch.save and learner.all_reduce is dist.all_reduce
    finally:
        dist.destroy_process_group()



@pytest.mark.skipif(torch.cuda.is_available(), reason="NCCL is there: the setup does not raise")
def test_a_setup_that_raises_on_every_rank_costs_its_own_criterion_only(graded):
    fails = failed(graded["setup_nccl"])
    said = fails.pop("[W=2] setup() makes the process group, teardown() destroys it")
    assert not fails, fails  # training, evaluation and BucketedDDP graded on the grader's group
    assert said.startswith("setup() raised on every rank, on rank ") and "NCCL" in said, said
    assert said.endswith("(distlab.backend() names gloo where there is no GPU); the grader made the process group "
                         "in its place, so that your other functions were graded"), said


def test_counting_the_samplers_padding_is_named(graded):
    msg = _only(graded["eval_padding_counted"], EVAL[6:])
    assert "the mean over the 22 samples the samplers dealt out, not over the data set's 21" in msg
    assert "repeating samples (here [0])" in msg


def test_an_evaluation_autograd_records_is_named(graded):
    msg = _only(graded["eval_with_autograd"], "evaluate_ddp runs the model without autograd")
    assert re.match(r"rank 0 ran (\d+) of its \1 forwards of the model with autograd recording \(torch.is_grad_enabled"
                    r"\(\) was True\): evaluation trains nothing, so run it under torch.no_grad\(\)", msg), msg


def test_a_metric_not_reduced_is_named(graded):
    msg = _only(graded["eval_not_reduced"], EVAL[6:])
    assert msg.startswith("the ranks returned different metrics (each its own shard's): rank 0 returned loss")
    assert "your evaluate_ddp made no collective, so each rank saw only its shard" in msg, msg
    msg = _only(graded["eval_reduced_to_rank_0"], EVAL[6:])
    assert re.search(r"your evaluate_ddp called dist\.reduce at line \d+ \(`dist\.reduce\(totals, dst=0\)`\), which "
                     "leaves the result on its dst rank only", msg), msg


def test_averaging_the_ranks_means_and_a_sampler_without_the_seed_are_named(graded):
    fails = failed(graded["eval_mean_of_means"])
    assert set(fails) == {EVAL, "[W=2] shuffled by the given seed, anew every epoch"}, fails
    assert "the average of the ranks' means; without the repeats the shards hold [11, 10] samples" in fails[EVAL]
    assert fails["[W=2] shuffled by the given seed, anew every epoch"] == (
        "rank 0 read epoch 0's samples in the order DistributedSampler(dataset, shuffle=True) gives with seed=0, its "
        "default, not with seed=7, the seed train_ddp was given: pass seed=seed, so that a run is shuffled the way "
        "its caller asked")


@pytest.mark.slow
def test_a_rank_stuck_while_the_other_waits_in_ddps_all_reduce_is_a_hang_named_at_each_ranks_line(tmp_path):
    """Issue 37's measured case: the reference with rank 1 stuck at the start of its second epoch. Rank 0 waits
    in the all-reduce DDP's reducer issues from C++ during loss.backward(): a hang, named at both ranks'
    lines, in the learner's terms: no store, no keys, no change of MASTER_PORT (that move is the grader's); and it
    costs train_ddp's marks only."""
    from autograder.grader.supervise import grade_one
    from tests.helpers import mutant

    mutant(tmp_path, "ex01_ddp.py", {
        "        sampler.set_epoch(epoch)  # without it every epoch repeats epoch 0's shuffle\n":
        "        sampler.set_epoch(epoch)  # without it every epoch repeats epoch 0's shuffle\n"
        "        if epoch == 1 and rank == 1:\n            import time\n            time.sleep(600)\n"})
    report = grade_one(ex01_ddp.EXERCISE, tmp_path)
    # train_ddp's marks only: the file is launched again without it, for evaluate_ddp, BucketedDDP and teardown
    train = {c.name for c in report.criteria if c.key in {fn.__name__ for fn in ex01_ddp.CRITERIA[:6]}}
    assert set(failed(report)) == train and not report.not_graded, report.feedback
    assert "train_ddp did not finish: the job hung" in report.feedback
    assert "rank 0 waits in DDP's all-reduce of the gradients at ex01_ddp.py:" in report.feedback
    assert "(loss.backward())" in report.feedback and "(time.sleep(600))" in report.feedback
    for internal in ("distlab/grader", "DistStoreError", "MASTER_PORT", "keys:"):
        assert internal not in report.feedback, report.feedback


@pytest.mark.slow  # a launch of its own: one that ends early keeps no trace of the files it graded before
def test_a_bucketed_ddp_that_aborts_gloo_costs_its_own_marks_only(tmp_path):
    """Its buckets differ between the ranks, and gloo aborts on the first all-reduce of unequal sizes (the
    audit's mistake: the parameters ordered by a set); the file is launched again without BucketedDDP."""
    (report,) = ex01_ddp.grade([mutant(tmp_path, "ex01_ddp.py", BUCKET_ORDER_PER_RANK)], world_sizes=(2,))
    fails = failed(report)
    assert list(fails) == list(BUCKETED), report.feedback  # train_ddp, evaluate_ddp and teardown at full marks
    assert re.fullmatch(rf"BucketedDDP did not finish: {ABORTED}.*",
                        fails[BUCKETED[0]], re.S), fails[BUCKETED[0]]
    assert all(fails[c] == f"not checked: BucketedDDP did not finish (see '{BUCKETED[0]}')" for c in BUCKETED[1:])


# -- part 2, BucketedDDP ---------------------------------------------------------------------------------------
BUCKETED = ("[W=2] BucketedDDP trains as one process on the whole batch",
            "[W=2] one all-reduce per bucket, the buckets the cap implies",
            "[W=2] each bucket's all-reduce starts in the backward, asynchronously",
            "[W=2] a parameter unused in the forward is handled or named")


def _bucketed(report) -> list[str]:
    """Part 2's four messages ("" for a pass), asserting that part 1 lost nothing."""
    fails = failed(report)
    assert not [name for name in fails if name not in BUCKETED], fails
    return [fails.get(name, "") for name in BUCKETED]


def test_bucketed_broadcast_megabytes_and_a_synchronous_all_reduce_are_named(graded):
    matches, buckets, overlap, unused = _bucketed(graded["bucketed_broadcast_decimal_sync"])
    assert matches.startswith("after BucketedDDP(...) rank 1's weights differed from rank 0's (by ")
    assert "nothing broadcast rank 0's; dist.broadcast every parameter from rank 0 in __init__" in matches
    assert buckets == ("the all-reduces moved [362, 1024, 2080] elements, the buckets of a 1431-byte cap: "
                       "bucket_cap_mb=0.00143051 is in MiB, 1500 bytes (bucket_cap_mb * 2**20), as DDP's")
    assert overlap.startswith("the all-reduce at line ") and "(`dist.all_reduce(flat)`) was synchronous" in overlap
    assert unused == ""   # the unused parameter's bucket is launched: handled, whatever else is wrong


def test_bucketed_sum_registration_order_and_a_launch_after_the_backward_are_named(graded):
    matches, buckets, overlap, unused = _bucketed(graded["bucketed_summed_forward_after"])
    assert matches.startswith("every .grad held 2x the mean gradient when the optimizer stepped: the all-reduce sums "
                              "over the 2 ranks; divide by the world size")
    assert buckets.startswith("the all-reduces moved [2048, 1056, 362] elements: buckets filled in the order of "
                              "module.parameters(); DDP fills them in reverse")
    assert overlap.startswith("all 3 all-reduces started after the backward, in finish_gradient_synchronization (the "
                              "first at line ")
    assert unused == ""


def test_bucketed_gradients_not_written_back_per_parameter_and_late_buckets_are_named(graded):
    matches, buckets, overlap, _ = _bucketed(graded["bucketed_kept_per_parameter_end"])
    assert matches.startswith("6 all-reduce(s) ran, but the .grad of '0.weight', '0.bias', '2.weight', '2.bias', "
                              "'4.weight', '4.bias' still held this rank's own gradient when the optimizer stepped")
    assert buckets == ("6 all-reduces per step, one per parameter; a cap of 1448 bytes makes 3 buckets: group the "
                       "gradients into buckets and all-reduce each bucket once")
    assert overlap.startswith("the first all-reduce started only after the first layer's gradients ('0.weight', "
                              "'0.bias') were accumulated, at the end of the backward")


def test_a_training_sampler_that_drops_the_tail_is_named(graded):
    f = failed(graded["train_drop_last"])
    assert list(f) == ["[W=2] shuffled by the given seed, anew every epoch"], f  # the shards and training: right
    assert f["[W=2] shuffled by the given seed, anew every epoch"].startswith(
        "train_ddp built its DistributedSampler with drop_last=True: on this data set, which 2 ranks divide, the "
        "shards are the same"), f


def test_an_evaluation_that_assumes_padding_fails_on_a_set_the_ranks_divide(graded):
    msg = _only(graded["eval_assumes_padding"], EVAL[6:])
    assert re.match(r"on the first 20 samples, which 2 ranks divide \(10 each\), rank [01]'s evaluate_ddp returned "
                    r"loss [\d.]+, accuracy [\d.]+; one process has [\d.]+, [\d.]+ \(on the 21-sample set it was "
                    r"right\)", msg), msg


def test_a_loader_that_drops_the_last_batch_is_named(graded):
    msg = _only(graded["loader_drop_last"], "each rank reads its own shard")
    assert msg.startswith("rank 0 read 880 of its 896 samples in each epoch (22 batches of 40): train_ddp's DataLoader "
                          "was built with drop_last=True, which leaves out each epoch's last 16 samples"), msg


def test_a_frozen_parameter_left_out_of_the_broadcast_is_named(graded):
    matches, buckets, overlap, _ = _bucketed(graded["bucketed_trainable_broadcast"])
    assert matches.startswith("after BucketedDDP(...) rank 1's '5.scale' differed from rank 0's (by "), matches
    assert "a parameter that needs no gradient, and the others were rank 0's: only the trainable parameters were " \
        "broadcast" in matches
    assert buckets.startswith("with bucket_cap_mb=") and "step 0's all-reduces moved [3466] elements" in buckets
    assert overlap == ""  # one bucket, launched from its hook: nothing to overlap


def test_bucketed_unwaited_work_a_cap_passed_and_an_unnamed_error_are_named(graded):
    matches, buckets, overlap, unused = _bucketed(graded["bucketed_unwaited_past_cap_unused"])
    assert matches.startswith("finish_gradient_synchronization returned while 2 asynchronous all-reduce(s) had never "
                              "been waited on (the first started at line ")
    assert buckets.startswith("the all-reduces moved [1386, 2080] elements: a bucket was closed only once its bytes "
                              "exceeded the cap of 1448")
    assert overlap == ""   # launched from the hooks, asynchronously: the overlap is right
    assert unused.startswith("with a parameter the forward does not use ('unused.weight', 'unused.bias': no gradient, "
                             "and its hook never runs), BucketedDDP raised on rank 0: TypeError: cannot unpack")
    assert "ex01_ddp.py line " in unused and "in finish_gradient_synchronization" in unused


def test_a_skipped_bucket_of_an_unused_parameter_is_named(graded):
    *_, unused = _bucketed(graded["bucketed_unused_skipped"])
    assert unused.startswith("with a parameter the forward does not use ('unused.weight', 'unused.bias': no gradient, "
                             "and its hook never runs), '4.weight', '4.bias' kept this rank's own gradient when the "
                             "optimizer stepped (2 all-reduce(s) ran) (their bucket, (unused.bias, unused.weight, "
                             "4.bias, 4.weight), was never all-reduced)"), unused


def test_a_mean_divided_twice_and_a_wait_inside_the_backward_are_named(graded):
    matches, buckets, overlap, unused = _bucketed(graded["bucketed_twice_waited_in_hook"])
    assert matches.startswith("every .grad held 1/2 of the mean gradient when the optimizer stepped, the mean "
                              "divided by the world size (2) once more")
    assert buckets == "" and unused == ""
    assert overlap.startswith("the all-reduce started at line ") and \
        "was waited on before loss.backward() returned: the backward stopped until it finished" in overlap


def test_buckets_launched_from_tensor_hooks_before_accumulation_are_named(graded):
    matches, *_ = _bucketed(graded["bucketed_tensor_hook"])
    assert matches.startswith("the all-reduce at line ") and "started when the gradients accumulated in this " \
        "backward held " in matches and "a Tensor.register_hook hook runs before .grad is accumulated" in matches


def test_an_error_in_a_hook_autograd_called_is_placed_at_the_hooks_definition(tmp_path):
    """No launch: a hook whose signature is not hook(param) raises inside autograd, with no frame of the learner's
    (a blind audit's lambda: ready(p)); where it is defined is said instead."""
    import runpy

    from autograder.checks.ex01_ddp.bucketed.observations import make_model
    from autograder.checks.ex01_ddp.bucketed.probes import _hook_defined

    path = tmp_path / "ex01_ddp.py"
    path.write_text("def hook_all(model):\n    for p in model.parameters():\n        if p.requires_grad:\n"
                    "            p.register_post_accumulate_grad_hook(lambda: None)\n")
    model = make_model(0)
    assert _hook_defined(model, str(path)) is None  # no hook of the file's yet
    runpy.run_path(str(path))["hook_all"](model)
    assert _hook_defined(model, str(path)) == ("ex01_ddp.py line 4, where the hook hook_all.<locals>.<lambda> on "
                                               "'0.weight' is defined (autograd calls it as hook(param))")
