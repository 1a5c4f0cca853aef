"""Advice only about what was observed (autograder.grader.advice), on made-up traces: no launch."""
from __future__ import annotations

from autograder.grader.advice import advised, violations
from autograder.grader.report import ExerciseReport


def _at(event: str, line: int, **details) -> dict:
    return {"event": event, "step": 0, "file": "ex01_ddp.py", "line": line, "code": "...", **details}


SAMPLER = _at("DistributedSampler", 111, args={"shuffle": False, "seed": 7, "drop_last": False})
TRACE = [_at("init_process_group", 77, args={"backend": "gloo"}), SAMPLER,
         _at("set_epoch", 117, args={"epoch": 0}), _at("scheduler.step", 70), _at("optimizer.step", 71),
         _at("scheduler.step", 72), _at("destroy_process_group", 85, args={})]


def _report(*feedback: str) -> ExerciseReport:
    report = ExerciseReport(1, "ddp", len(feedback))
    for i, text in enumerate(feedback):
        report.check(f"criterion {i}", 1, False, text)
    return report


def test_advice_about_a_step_the_trace_shows_taken_is_a_violation():
    report = _report("epoch 0 and epoch 1 read the samples in the same order: call sampler.set_epoch(epoch) at "
                     "the start of every epoch",
                     "after teardown() the process group was still initialised: call dist.destroy_process_group()")
    found = violations(report, [[TRACE, TRACE]])  # one launch, two ranks
    assert found == ["criterion 0: advises sampler.set_epoch(epoch), but your code did it (ex01_ddp.py:117)",
                     "criterion 1: advises dist.destroy_process_group(), but your code did it (ex01_ddp.py:85)"]
    assert violations(report, [[[e for e in TRACE if e["event"] not in ("set_epoch", "destroy_process_group")]]]) \
        == []


def test_literal_arguments_and_order_decide_whether_the_step_was_taken():
    build = "the DistributedSampler was built with shuffle=False; build it with shuffle=True, seed=seed"
    (step, literals), = advised(build)
    assert step.name == "a DistributedSampler" and literals == {"shuffle": True}  # seed=seed: a name, not checked
    assert violations(_report(build), [[TRACE]]) == []  # the trace's sampler has shuffle=False: not taken
    shuffled = dict(SAMPLER, args={"shuffle": True, "seed": 7, "drop_last": False})
    assert len(violations(_report(build), [[[shuffled]]])) == 1
    order = "scheduler.step() ran before optimizer.step(): Call optimizer.step(), then scheduler.step()"
    assert violations(_report(order), [[TRACE]]) == ["criterion 0: advises optimizer.step() then "
                                                     "scheduler.step(), the order your code already has"]
    swapped = [_at("scheduler.step", 70), _at("optimizer.step", 71), _at("scheduler.step", 72),
               _at("optimizer.step", 71)]
    assert violations(_report(order), [[swapped]]) == []


def test_passing_criteria_and_saves_by_what_they_held():
    report = _report("the learning rate differs: save scheduler.state_dict() and load it on resume")
    saved = _at("dcp.save", 90, held=["model", "optim", "scheduler.last_epoch", "step"])
    assert violations(report, [[[saved]]]) == [
        "criterion 0: advises a saved scheduler state, but your code did it (ex01_ddp.py:90)"]
    assert violations(report, [[[dict(saved, held=["model", "optim"])]]]) == []
    report.criteria[0].earned = report.criteria[0].points
    assert violations(report, [[[saved]]]) == []
    stage = _report("stage 0's parameters have no gradient: call output.backward(grad) with the gradient received")
    loss = _at("backward", 86, shape=[])  # the last stage's loss: not the step advised
    assert violations(stage, [[[loss]]]) == [] and len(violations(stage, [[[dict(loss, shape=[16, 64])]]])) == 1
