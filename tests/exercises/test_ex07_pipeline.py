"""Exercise 7 (GPipe by hand): the solution scores full marks, each known mistake fails with its
own feedback, naming the cause. The solution and the mutants are graded in one launch (the stub:
test_selftest.py); each file runs in its own process group, so the mutants whose sends and recvs do
not match (one of them a deadlock, stopped by a short p2p timeout) cost only their own marks."""
from __future__ import annotations

import re

import pytest

from autograder.checks import ex07_pipeline as check
from autograder.grader.diagnosis import translate
from tests.exercises import independent
from tests.helpers import ABORTED, SOLUTIONS, failed, mutant

FILE = check.EXERCISE.filename
SEND_NOW = """            out = stage(x_i)
            dist.send(out.detach().contiguous(), dst=1)  # stage 1 can start on it now
            outputs.append(out)
"""
SEND_LATER = """            out = stage(x_i)
            outputs.append(out)
        for out in outputs:
            dist.send(out.detach().contiguous(), dst=1)
"""
BACKWARD_LATER = """        losses.append(loss)
    for act, loss in zip(inputs, losses):
        loss.backward()
"""
BACKWARD_AT_ONCE = """        losses.append(loss)
        loss.backward()
"""
MISTAKES = {
    "one micro-batch": {"m = n_microbatches": "m = 1"},
    "sends after the forward loop": {SEND_NOW: SEND_LATER},
    "loss not scaled": {"cross_entropy(stage(act), y_i) / m": "cross_entropy(stage(act), y_i)"},
    "stage 0 ignores the received gradient": {"out.backward(grad)": "out.sum().backward()"},
    "split instead of chunk": {"x.chunk(m)": "x.split(m)", "y.chunk(m)": "y.split(m)"},
    "last micro-batch's loss returned": {"return torch.stack(losses).sum().detach()": "return loss.detach()"},
    # two independent mistakes: the backward in reverse on stage 1 only, and the mean of the divided losses
    "reversed backward, mean loss": {
        "for act, loss in zip(inputs, losses):": "for act, loss in reversed(list(zip(inputs, losses))):",
        "torch.stack(losses).sum()": "torch.stack(losses).mean()"},
    "no requires_grad_": {"        act.requires_grad_()\n": ""},
    "gradients never sent back": {"        dist.send(act.grad.contiguous(), dst=0)\n": ""},
    "stage 1 backward per micro-batch (deadlock)": {BACKWARD_LATER: BACKWARD_AT_ONCE},
    "whole batch's labels on stage 1": {"cross_entropy(stage(act), y_i) / m": "cross_entropy(stage(act), y) / m"},
    "rank never looked up": {"    rank = dist.get_rank()\n": ""},
    # Part 2, 1F1B: every forward first (GPipe's order, GPipe's memory), sent with isend so nothing deadlocks.
    # and a blind audit's GPipe step returning its loss as a Python float (10 of 10 before)
    "1F1B in GPipe's order": {"    warm = min(p - 1 - rank, m)": "    warm = m",
                              "return torch.stack(losses).sum().detach()": "return torch.stack(losses).sum().item()"},
    # no warm-up forward: every stage runs as the last one does (F0 B0 F1 B1 ...); and a blind audit's GPipe step
    # returning its loss undetached (10 of 10 before)
    "1F1B without its warm-up": {"    warm = min(p - 1 - rank, m)": "    warm = 0",
                                 "return torch.stack(losses).sum().detach()": "return torch.stack(losses).sum()"},
    # blocking sends: stage 0 sends micro-batch 1's activations while stage 1 sends micro-batch 0's gradient; and
    # a blind audit's GPipe stage 1 receiving every micro-batch into one buffer (Megatron-style reuse)
    "1F1B with blocking sends": {
        "    inputs, losses = [], []\n    for y_i in y.chunk(m):\n"
        "        act = torch.empty(y_i.shape[0], hidden, dtype=x.dtype, device=x.device)\n":
            "    inputs, losses = [], []\n"
            "    act = torch.empty(y.shape[0] // m, hidden, dtype=x.dtype, device=x.device)\n"
            "    for y_i in y.chunk(m):\n",
        "sends.append(dist.isend(out.detach().contiguous(), dst=rank + 1))":
            "dist.send(out.detach().contiguous(), dst=rank + 1)",
        "sends.append(dist.isend(inp.grad.contiguous(), dst=rank - 1))":
            "dist.send(inp.grad.contiguous(), dst=rank - 1)"},
    # found by a tester blind to the checks: a loss returned on stage 0 too, and the isends never waited on
    # a blind audit's (told to receive every activation before the first gradient, which it did): a receive more
    "one receive too many": {"    for act, loss in zip(inputs, losses):\n":
                             "    dist.recv(torch.empty_like(inputs[0]), src=0)\n"
                             "    for act, loss in zip(inputs, losses):\n"},
    # a blind audit's (its order feedback was "stage 0 ran F0"): the steady state's backward before its forward
    "1F1B backward first": {"        if warm + i < m:\n            forward(warm + i)\n        backward(i)\n":
                            "        backward(i)\n        if warm + i < m:\n            forward(warm + i)\n"},
    "1F1B loss everywhere, sends not waited": {
        "    return sum(losses) if last else None": "    return sum(losses)",  # 0, an int, where no loss
        "    for work in sends:\n        work.wait()\n": ""},
    # stage 0 holds each activation back and sends it after its next forward (two at a time)
    "1F1B sends held back": {
        "    inputs, outputs, losses, sends = {}, {}, [], []":
            "    inputs, outputs, losses, sends, held = {}, {}, [], [], []",
        "            sends.append(dist.isend(out.detach().contiguous(), dst=rank + 1))  # the next stage can start now":
            "            held.append(out.detach().contiguous())\n"
            "            while len(held) > 1 or (held and i == m - 1):\n"
            "                sends.append(dist.isend(held.pop(0), dst=rank + 1))"},
}
# A legal style, not a mistake: every send and receive posted through dist.batch_isend_irecv (one op a
# batch, each waited on). It must get full marks: the spy records the batch's ops as sends and receives.
BATCHED = {
    "dist.send(out.detach().contiguous(), dst=1)":
        "dist.batch_isend_irecv([dist.P2POp(dist.isend, out.detach().contiguous(), 1)])[0].wait()",
    "dist.recv(grad, src=1)": "dist.batch_isend_irecv([dist.P2POp(dist.irecv, grad, 1)])[0].wait()",
    "dist.recv(act, src=0)": "dist.batch_isend_irecv([dist.P2POp(dist.irecv, act, 0)])[0].wait()",
    "dist.send(act.grad.contiguous(), dst=0)":
        "dist.batch_isend_irecv([dist.P2POp(dist.isend, act.grad.contiguous(), 0)])[0].wait()",
}
ABORTS = {  # the whole batch sent where a micro-batch's buffer waits: gloo aborts the receiving rank (SIGABRT)
    "gpipe whole batch": {"            out = stage(x_i)\n            dist.send(": "            out = stage(x)\n"
                                                                                 "            dist.send("},
    "1f1b whole batch": {"            inp = xs[i]\n": "            inp = x\n"},
}
GRADS = "stage {} gradients match the unsplit model"
OFOB = ("[1F1B] loss and gradients match the unsplit model",
        "[1F1B] each stage runs 1F1B's order and sends each result at once",
        "[1F1B] stage s keeps at most min(p - s, m) micro-batches' activations")
COUNT, LOSS, OVERLAP = ("each stage processes every micro-batch once", "loss matches the unsplit model",
                        "stages overlap in time")


# 1F1B with its neighbours written as numbers, as in a 2-stage GPipe step: right at 2 stages, wrong at 4
FOR_2_STAGES = {"dist.recv(inp, src=rank - 1)": "dist.recv(inp, src=0)", "dst=rank + 1)": "dst=1)",
                "dist.recv(grad, src=rank + 1)": "dist.recv(grad, src=1)", "dst=rank - 1)": "dst=0)"}
# a blind audit's: 1F1B's receives without src (right at 2 stages, where a stage has one neighbour; at 4 the
# middle stages' activations and gradients race for them, and the audit's run matched twice)
ANY_SOURCE = {"dist.recv(inp, src=rank - 1)": "dist.recv(inp)", "dist.recv(grad, src=rank + 1)": "dist.recv(grad)"}


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    # the correct styles, and a step right at 2 stages only, graded as a learner's file is: 1F1B at 2 stages and 4
    whole = [SOLUTIONS / FILE, independent.path(7), mutant(tmp_path_factory.mktemp("batched"), FILE, BATCHED),
             mutant(tmp_path_factory.mktemp("two"), FILE, FOR_2_STAGES),
             mutant(tmp_path_factory.mktemp("any"), FILE, ANY_SOURCE)]
    paths = [mutant(tmp_path_factory.mktemp(f"m{i}"), FILE, repl) for i, repl in enumerate(MISTAKES.values())]
    # last: each sends a message larger than its peer's buffer, which aborts gloo and ends the launch; each is
    # launched again for its other part (then the other one, for its own)
    for name, repl in ABORTS.items():
        paths.append(mutant(tmp_path_factory.mktemp(name), FILE, repl))
    # the mistakes at 2 stages only (what they show, they show there): one launch of 2 ranks for them all
    graded = check.grade(whole, p2p_timeout_s=1.5) + check.grade(paths, p2p_timeout_s=1.5, deeper=None)
    return {"solution": graded[0], "independent": graded[1], "batched": graded[2], "for 2 stages": graded[3],
            "any source": graded[4], **dict(zip([*MISTAKES, *ABORTS], graded[5:]))}


def test_solution_full_marks(reports):
    r = reports["solution"]
    assert r.score == r.max_score, r.feedback
    assert "[1F1B] loss and gradients match the unsplit model: loss 2.3082, at 2 and 4 stages" in r.feedback
    # The only timing verdict of this file. It compares timestamps, but the check fixes the timeline
    # with sleeps (Delay: 30 ms per stage-0 forward), so stage 1 starts about three of stage 0's four
    # forwards before stage 0 is done: -92 to -103 ms measured on 2 cores at load 6.5, while a
    # missed overlap needs stage 1 to wake >90 ms late. The mistake (sends after the loop) fails
    # by causality, whatever the load.
    assert r.measurements["stage1_start_minus_stage0_forwards_end_ms"] < 0


def test_the_independent_solution_scores_full_marks(reports):
    r = reports["independent"]
    assert r.score == r.max_score, r.feedback


def test_sends_and_receives_posted_through_batch_isend_irecv_get_full_marks(reports):
    r = reports["batched"]
    assert r.score == r.max_score, r.feedback


def test_no_microbatches_fails_count_and_overlap(reports):
    f = failed(reports["one micro-batch"])
    assert "stage 0 ran one forward of all 64 rows" in f[COUNT] and "x.chunk(4)" in f[COUNT]
    assert "not checked" in f[OVERLAP]
    # Without micro-batches the maths is still right: only the schedule is wrong.
    assert set(f) == {COUNT, OVERLAP}


def test_split_instead_of_chunk_is_named_and_explains_the_factor(reports):
    f = failed(reports["split instead of chunk"])
    assert "stage 0 ran 16 forwards of 4 rows: x.split(4) cuts pieces of 4 rows" in f[COUNT]
    for name in (LOSS, GRADS.format(0), GRADS.format(1)):
        assert "4.00x the unsplit model's because the batch went through in 16 micro-batches" in f[name], f[name]
        assert "divide each micro-batch's loss" not in f[name]  # it was divided: the split is the mistake


def test_sending_after_the_loop_fails_overlap_only(reports):
    f = failed(reports["sends after the forward loop"])
    assert list(f) == [OVERLAP]
    assert "sent its first activations only after all 4 of its forwards" in f[OVERLAP]
    assert "inside the forward loop" in f[OVERLAP]


def test_unscaled_loss_fails_parity_with_the_factor(reports):
    f = failed(reports["loss not scaled"])
    assert "divide each micro-batch's loss by n_microbatches" in f[LOSS] and "4.00x" in f[LOSS]
    for s in (0, 1):
        assert "gradients are 4.00x the unsplit model's with 4 micro-batches" in f[GRADS.format(s)]
    assert COUNT not in f and OVERLAP not in f


def test_ignoring_the_received_gradient_fails_stage0_only(reports):
    f = failed(reports["stage 0 ignores the received gradient"])
    assert list(f) == [GRADS.format(0)]
    assert "for micro-batch 0 is all ones (what out.sum().backward() gives)" in f[GRADS.format(0)]


def test_returning_the_last_loss_is_named(reports):
    f = failed(reports["last micro-batch's loss returned"])
    assert list(f) == [LOSS]
    assert "micro-batch 3's loss divided by 4" in f[LOSS] and "not the last one" in f[LOSS]


def test_reversed_backward_and_averaged_loss_are_each_named(reports):
    f = failed(reports["reversed backward, mean loss"])
    assert set(f) == {LOSS, GRADS.format(0)}
    assert "in the order [3, 2, 1, 0]" in f[GRADS.format(0)] and "in the order [0, 1, 2, 3]" in f[GRADS.format(0)]
    assert "1/4 of the batch mean" in f[LOSS] and "sum them instead of averaging" in f[LOSS]


def test_missing_requires_grad_is_named_not_a_hang(reports):
    f = failed(reports["no requires_grad_"])
    assert {COUNT, GRADS.format(0), GRADS.format(1)} <= set(f)
    for name in (COUNT, GRADS.format(0), GRADS.format(1)):
        assert "stage 1's 4 received activations did not require grad" in f[name], f[name]
        assert "act.requires_grad_()" in f[name]
    assert "AttributeError" in f[COUNT]  # what rank 1 raised, quoted after the cause


def test_gradients_never_sent_back_are_counted(reports):
    f = failed(reports["gradients never sent back"])
    assert set(f) == {COUNT, GRADS.format(0)}  # the loss and stage 1's gradients are right, and the overlap
    assert "stage 1 sent 0 of 4 gradients back to rank 0" in f[GRADS.format(0)]
    assert "waited in dist.recv for the first one" in f[GRADS.format(0)]


def test_both_stages_sending_at_once_is_a_named_deadlock(reports):
    f = failed(reports["stage 1 backward per micro-batch (deadlock)"])
    for name in (COUNT, LOSS, GRADS.format(0), GRADS.format(1)):
        assert "both stages were waiting in dist.send at once" in f[name], f[name]
    assert "stage 0 sending micro-batch 1's activations, stage 1 sending micro-batch 0's gradient" in f[COUNT]
    assert "all forwards, then all backwards" in f[COUNT] and "s timeout" in f[COUNT]


def test_a_rank_that_raises_leaves_its_peer_waiting_and_both_are_named(reports):
    f = failed(reports["whole batch's labels on stage 1"])
    assert f[COUNT].startswith("rank 1 raised ValueError") and "ex07_pipeline.py line" in f[COUNT]
    assert "so rank 0 waited in dist.send (stage 0 sending micro-batch 1's activations)" in f[COUNT]



def test_a_run_cut_short_by_an_error_gets_the_error_not_advice(reports):
    f = failed(reports["rank never looked up"])
    assert {COUNT, LOSS} <= set(f), f
    for said in (f[COUNT], f[LOSS]):  # the error stopped the steps: no advice to take them ("split the batch"...)
        assert "NameError: name 'rank' is not defined at ex07_pipeline.py line" in said, said
        assert not any(w in said for w in ("split the batch", "return the batch's", "call loss", "call output"))


def test_a_deadlock_that_escapes_the_rank_is_translated():
    gloo = "RuntimeError: [unbound_buffer.cc:129] Timed out waiting 3000ms for send operation to complete"
    assert translate(gloo, check.KNOWN_ERRORS).startswith("a send/recv deadlock between the stages")

# The stub's grading (0, "not implemented yet", through the CLI's subprocess) is in
# tests/autograder/test_selftest.py, which grades exercise 7's solution and stub as an instructor does.


@pytest.mark.parametrize("imported", ["before the spy", "under the spy"])
def test_the_p2p_spy_sees_every_import_style(tmp_path, monkeypatch, imported):
    """No launch, no peer: the spy wraps stand-ins for send/recv/isend/irecv, and the calls of a file that
    names them by attribute, through an alias or by name are each recorded."""
    import torch
    import torch.distributed as dist

    from autograder.rank import P2PSpy
    from autograder.rank import watched
    from distlab.runtime.importing import import_path

    for name in P2PSpy.NAMES:  # what the spy wraps: no process group needed
        monkeypatch.setattr(dist, name, lambda tensor, *args, **kwargs: None)
    (tmp_path / "styles.py").write_text(
        "import torch.distributed\nimport torch.distributed as D\nfrom torch.distributed import irecv, isend\n\n\n"
        "def every_style(t):\n    torch.distributed.send(t, dst=1)\n    D.recv(t, src=1)\n"
        "    isend(t, dst=1)\n    irecv(t, src=1)\n")
    load = lambda: watched(import_path(tmp_path / "styles.py", name=f"learner_p2p_{imported[0]}"))  # noqa: E731
    learner = load() if imported == "before the spy" else None
    with P2PSpy() as spy:
        learner = learner or load()
        learner.every_style(torch.zeros(2))
    assert [(c["op"], c["async"], c["peer"]) for c in spy.calls] == [
        ("send", False, 1), ("recv", False, 1), ("send", True, 1), ("recv", True, 1)]


@pytest.mark.slow  # a launch beyond the one per exercise that make test-fast keeps
def test_a_receive_buffer_of_another_shape_or_dtype_is_named_at_the_learners_line(tmp_path):
    """The realistic family's (benchmarks/realistic/ex07.py): the activation is B/m x hidden, and the check's hidden
    (48) is not the input's 64 features, so a buffer shaped like the input micro-batch shows; x is float64, not
    torch's default, so a buffer made without dtype= shows too (named before gloo would abort on it)."""
    from benchmarks.realistic import family

    names = ("recv_buffer_shaped_like_input", "recv_buffer_default_dtype")
    paths = []
    for name in names:
        (mistake,) = [m for m in family()[7][0] if m.name == name]
        (tmp_path / name).mkdir()
        paths.append(tmp_path / name / check.EXERCISE.filename)
        paths[-1].write_text(mistake.apply((SOLUTIONS / check.EXERCISE.filename).read_text()))
    shape, dtype = check.grade(paths, deeper=None)  # the GPipe part's mistakes: 2 stages say it
    assert shape.score < shape.max_score
    assert "mat1 and mat2 shapes cannot be multiplied (16x64 and 48x48)" in shape.feedback
    assert "float64[16, 64]" in shape.feedback  # the received activation, at the learner's line
    assert dtype.score < dtype.max_score
    assert "TypeError: dist.recv: a receive into a float32 tensor, where every tensor of this pipeline is float64 " \
           "(the dtype of x)" in dtype.feedback and "dist.recv(act, src=0)" in dtype.feedback


# -- part 2, 1F1B ---------------------------------------------------------------------------------------------
def test_a_1f1b_step_written_for_2_stages_fails_at_4_at_the_learners_line(reports):
    f = failed(reports["for 2 stages"])
    assert set(f) == set(OFOB), f   # GPipe's part, and 1F1B at 2 stages, are right
    assert f[OFOB[0]].startswith("at 4 stages, where stages 1 and 2 each receive and send both ways: stage 1 of 4 "
                                 "sent to rank 1 (ex07_pipeline.py line ")
    assert "dist.isend(out.detach().contiguous(), dst=1)" in f[OFOB[0]] and "rank 0 and rank 2" in f[OFOB[0]]
def test_a_1f1b_receive_without_src_is_named_at_4_stages(reports):
    f = failed(reports["any source"])
    assert list(f) == [OFOB[0]], f  # the order and the memory hold, whatever messages the race gave
    assert f[OFOB[0]].startswith("at 4 stages, where stages 1 and 2 each receive and send both ways: stage 1 of 4 "
                                 "received with no src (ex07_pipeline.py line "), f[OFOB[0]]
    assert "and took messages from ranks 0 and 2 there: a receive without src takes the next message of any rank" \
        in f[OFOB[0]], f[OFOB[0]]


def test_gpipe_mistakes_leave_the_1f1b_part_its_marks(reports):
    for name in MISTAKES:
        if not name.startswith("1F1B"):
            assert not set(OFOB) & set(failed(reports[name])), (name, failed(reports[name]))


def test_1f1b_in_gpipes_order_is_named_with_its_memory(reports):
    f = failed(reports["1F1B in GPipe's order"])
    assert set(f) == {LOSS, *OFOB[1:]}, f   # the maths is right: only the schedule and its memory are not
    assert f[LOSS].startswith("rank 1 returned the right loss, but as a Python float: the contract returns a "
                              "detached scalar tensor"), f[LOSS]
    assert f[OFOB[1]].startswith("stage 0 ran all 4 forwards before its first backward (F0 F1 F2 F3 B0 B1 B2 B3), "
                                 "GPipe's order")
    assert "F0 F1 B0 F2 B1 F3 B2 B3" in f[OFOB[1]]
    assert f[OFOB[2]].startswith("stage 0 held ") and "4 micro-batches'" in f[OFOB[2]]
    assert "1F1B keeps at most min(p - s, m) = 2 there" in f[OFOB[2]]


def test_1f1b_without_its_warm_up_is_named(reports):
    f = failed(reports["1F1B without its warm-up"])
    assert f["loss matches the unsplit model"] == (
        "rank 1 returned the right loss, but still requiring grad (its grad_fn is SumBackward0): the contract "
        "returns a detached scalar, so that a caller that keeps it (a running total, a log) keeps no autograd graph "
        "with it; return it .detach()ed"), f
    assert f[OFOB[1]].startswith("stage 0 ran 1 forward(s) before its first backward (F0 B0 F1 B1 F2 B2 F3 B3); "
                                 "1F1B runs min(p - 1 - s, m) = 1 warm-up forward(s) on stage 0 of 2"), f[OFOB[1]]


def test_1f1b_with_blocking_sends_is_a_named_deadlock(reports):
    f = failed(reports["1F1B with blocking sends"])
    for stage in (0, 1):
        said = f[f"stage {stage} gradients match the unsplit model"]
        assert "stage 1 received all 4 micro-batches' activations into one tensor (ex07_pipeline.py line" in said
        assert "Stage 0 received, for micro-batch 1, the sum of micro-batches 0 and 1's gradients" in said, said
    assert f[OFOB[0]].startswith("both stages were waiting in a blocking dist.send at once"), f[OFOB[0]]
    assert "Post sends with dist.isend" in f[OFOB[0]]


def test_one_receive_too_many_is_named_at_its_line(reports):
    f = failed(reports["one receive too many"])
    assert f[COUNT].startswith("stage 1 waiting for micro-batch 4's activations (ex07_pipeline.py line "), f[COUNT]
    assert "dist.recv(torch.empty_like(inputs[0]), src=0)`)) is one dist.recv too many: the batch has 4 " \
        "micro-batches (0 to 3)" in f[COUNT], f[COUNT]
    assert not set(OFOB) & set(f), f  # 1F1B's part is right


def test_1f1b_backward_before_its_forward_is_named(reports):
    f = failed(reports["1F1B backward first"])
    assert f[OFOB[1]].startswith("stage 1's backward raised KeyError: 0 at ex07_pipeline.py line "), f[OFOB[1]]
    assert "when the stage had run 0 forward(s) and 0 backward(s): no forward was waiting for that backward" in \
        f[OFOB[1]] and f[OFOB[0]].startswith("stage 1's backward raised KeyError: 0"), f


def test_1f1b_sends_held_back_are_named(reports):
    f = failed(reports["1F1B sends held back"])
    assert list(f) == [OFOB[1]], f
    assert f[OFOB[1]].startswith("stage 0 sent micro-batch 0's activations (") and \
        "only after its next forward (F1) had started" in f[OFOB[1]]


def test_1f1b_loss_on_every_stage_and_unwaited_sends_are_named(reports):
    f = failed(reports["1F1B loss everywhere, sends not waited"])
    assert set(f) == set(OFOB[:2]), f
    assert f[OFOB[0]] == "rank 0 returned an int; only the last stage computes the loss, and the others return None"
    assert f[OFOB[1]].startswith("stage 0's 4 isend(s) (the first at ex07_pipeline.py line ") and \
        "were never waited on before one_f_one_b_step returned" in f[OFOB[1]]


@pytest.mark.parametrize("name, crashed, fn", [("gpipe whole batch", "gpipe", "gpipe_step"),
                                               ("1f1b whole batch", "one_f_one_b", "one_f_one_b_step")])
def test_a_part_that_aborts_gloo_costs_that_part_only(reports, name, crashed, fn):
    r = reports[name]
    f = failed(r)
    gpipe = [c.name for c in r.criteria if not c.name.startswith("[1F1B]")]
    mine = gpipe if crashed == "gpipe" else list(OFOB)
    assert list(f) == mine, r.feedback  # the other part, run again alone, at full marks
    assert re.fullmatch(rf"{fn} did not finish: {ABORTED}.*", f[mine[0]], re.S), f[mine[0]]
    assert all(f[c] == f"not checked: {fn} did not finish (see '{mine[0]}')" for c in mine[1:])
    # what gloo said of the message, read from the rank's output (only the receiving rank aborts here)
    assert "\n  gloo received a message of 24,576 bytes into a buffer of 6,144 bytes and aborted the process" \
        in f[mine[0]], f[mine[0]]
