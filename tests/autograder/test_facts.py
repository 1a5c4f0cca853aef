"""Facts only (autograder.grader.facts): a statement of the feedback that the trace or the learner's file
contradicts is listed; a true one is not. Made-up traces and files: no launch."""
from __future__ import annotations

from autograder.grader.facts import contradictions
from autograder.grader.report import ExerciseReport


def _at(event: str, line: int, **details) -> dict:
    return {"event": event, "step": 0, "file": "ex03_amp.py", "line": line, "code": "...", **details}


TRACE = [_at("zero_grad", 40), _at("backward", 41, shape=[]), _at("optimizer.step", 43),
         _at("destroy_process_group", 60, args={})]
SOURCE = "\n".join(f"line {n}" for n in range(1, 41)) + "\n    loss.backward()\n"  # line 41 is the backward


def _report(*feedback: str) -> ExerciseReport:
    report = ExerciseReport(3, "amp", len(feedback))
    for i, text in enumerate(feedback):
        report.check(f"criterion {i}", 1, False, text)
    return report


def test_a_call_said_not_to_have_happened_that_the_trace_shows_is_a_contradiction():
    report = _report("optimizer.step() was never called: the weights did not change",
                     "teardown did not call dist.destroy_process_group()",
                     "the loss was backpropagated without zero_grad()")
    assert contradictions(report, [[TRACE]]) == [
        "criterion 0: says optimizer.step() was not called, but your code called it (ex03_amp.py:43)",
        "criterion 1: says dist.destroy_process_group() was not called, but your code called it (ex03_amp.py:60)",
        "criterion 2: says zero_grad() was not called, but your code called it (ex03_amp.py:40)"]
    assert contradictions(report, [[[e for e in TRACE if e["event"] == "backward"]]]) == []  # then they are true


def test_a_call_the_trace_does_not_record_is_not_judged():
    # scaler.update() and a scheduler's step are not events of the trace: nothing says whether they happened,
    # and a "step" is not optimizer.step
    report = _report("scaler.update() was never called", "without calling scheduler.step()")
    assert contradictions(report, [[TRACE]]) == []


def test_a_quoted_line_must_hold_the_code_quoted():
    true = _report("rank 0 waits in DDP's all-reduce of the gradients at ex03_amp.py:41 (loss.backward())",
                   "your code raised on rank 0: ValueError\n  at ex03_amp.py line 41 in train: loss.backward()",
                   "rank 0 is at ex03_amp.py:41 in train (loss.backward())")
    assert contradictions(true, [[TRACE]], SOURCE, "ex03_amp.py") == []
    false = _report("(ex03_amp.py:40: `loss.backward()`)", "at ex03_amp.py:99 (scaler.step(optimizer))",
                    "rank 0 is at ex03_amp.py:40 in train (loss.backward())")
    assert contradictions(false, [[TRACE]], SOURCE, "ex03_amp.py") == [
        "criterion 0: quotes ex03_amp.py:40 as `loss.backward()`, but that line is `line 40`",
        "criterion 1: quotes ex03_amp.py:99 as `scaler.step(optimizer)`, but that line is `None`",
        "criterion 2: quotes ex03_amp.py:40 as `loss.backward()`, but that line is `line 40`"]



def test_a_timeout_report_names_the_unfinished_ranks_and_one_waiting_for_the_others(tmp_path):
    """No launch: a blind audit's ring backward, rank 1 asleep, was told "rank 0 is outside your code; ... rank 2 is
    outside your code ... No rank was waiting in a collective": rank 0 waited in the runtime for the others (a
    wait in C++, no frame of its own), and ranks 2 and 3 had finished."""
    from autograder.grader.main import explain
    from distlab.runtime.failures import LaunchTimeout
    from distlab.runtime.heartbeat import Watch

    beats = {0: {"waits_for_peers": True}, 1: {"at": "ex10_ring_attention.py:122", "function": "backward",
                                               "code": "time.sleep(10**6)"}, 2: {}, 3: {}}
    said = Watch(tmp_path, 4, beats=beats).report(unfinished=[0, 1])
    assert said == ("rank 0 had left your code and waited for the other ranks to finish; rank 1 is at "
                    "ex10_ring_attention.py:122 in backward (time.sleep(10**6))"), said
    # a rank in a collective with no frame of the learner's on its stack (the grader's own, after its code returned;
    # a blind audit's exercise 11 was told "rank 0 waits in wait"): it waits for the others, outside their code
    assert Watch(tmp_path, 2, beats={0: {"waits_in": "wait"}}).report() == \
        "rank 0 had left your code and waited for the other ranks to finish"
    # several such ranks are said once, where the first stands (exercise 4's export hung on rank 0 alone)
    stuck = {"at": "ex04_fsdp.py:216", "code": "state = {...}", "waits_in": "DTensor's all-gather of full_tensor()"}
    assert Watch(tmp_path, 4, beats={0: stuck, 1: {"waits_for_peers": True}, 2: {"waits_for_peers": True},
                                     3: {"waits_in": "wait"}}).report() == (
        "rank 0 waits in DTensor's all-gather of full_tensor() at ex04_fsdp.py:216 (state = {...}); ranks 1, 2 and 3 "
        "had left your code and waited for the other ranks to finish")
    feedback = explain(LaunchTimeout(35, [0, 1], "", said), tmp_path / "ex10_ring_attention.py")
    assert feedback.endswith("No rank was waiting in a collective: the code where each rank still in your code was "
                             "did not return in time."), feedback


def test_a_rank_that_never_comes_while_the_others_wait_for_it_is_a_hang_after_twice_the_wait(tmp_path):
    """No launch: a blind audit's ring backward, rank 1 asleep and rank 0 waiting for it in the runtime (no
    collective), ran the launch's whole limit twice (75 s). It is a hang once no rank advanced for twice the
    collective's wait; with a rank in a collective, after the wait itself; with no rank waiting, never."""
    from autograder.grader.main import explain
    from distlab.runtime.failures import LaunchHang
    from distlab.runtime.heartbeat import Watch

    asleep = {"at": "ex10_ring_attention.py:123", "function": "ring_attention_backward", "code": "time.sleep(10**6)"}
    watch = Watch(tmp_path, 2, beats={0: {"waits_for_peers": True}, 1: asleep}, advanced={0: 0.0, 1: 0.0})
    assert not watch.hung(15.0, 10.0) and watch.hung(20.0, 10.0)
    watch.beats[0] = {"waits_in": "all_reduce", "at": "ex10_ring_attention.py:80"}
    assert watch.hung(10.0, 10.0)
    watch.beats[0] = {"at": "ex10_ring_attention.py:80"}  # both in their code: slow, or a loop; the limit says
    assert not watch.hung(100.0, 10.0)
    asleep_watch = Watch(tmp_path, 2, beats={0: {"waits_for_peers": True}, 1: asleep})
    said = explain(LaunchHang(20, asleep_watch.report(), collective=asleep_watch.in_collective()),
                   tmp_path / "ex10_ring_attention.py")
    assert said == ("the job hung: no rank advanced for 20 s, and it was ended: rank 0 had left your code and waited "
                    "for the other ranks to finish; rank 1 is at ex10_ring_attention.py:123 in ring_attention_backward "
                    "(time.sleep(10**6)). No rank was waiting in a collective: the ranks still in your code did not "
                    "move from the lines above while the others waited for them to finish"), said


def test_a_hang_after_a_rank_raised_and_went_on_says_what_it_raised(tmp_path):
    """No launch: a blind audit's combine raised on rank 1 only; the grader caught it and went on, and the job hung
    with no word of the error ("ranks 0 and 1 had left your code ..."). The rank's beat carries what its code
    raised, where, and the report says it after that rank's place (and never for a rank that raised nothing)."""
    from autograder.grader.main import explain
    from autograder.rank.errors import attempt
    from distlab.runtime import heartbeat
    from distlab.runtime.failures import LaunchHang
    from distlab.runtime.heartbeat import Watch

    learner = tmp_path / "ex11_moe_dispatch.py"
    learner.write_text("def combine():\n    raise RuntimeError('boom')\n")
    namespace: dict = {}
    exec(compile(learner.read_text(), str(learner), "exec"), namespace)
    try:
        _, exc = attempt(namespace["combine"])
        said_raised = heartbeat._RAISED[0]
    finally:
        heartbeat.clear_raised()
    assert isinstance(exc, RuntimeError) and said_raised == "combine raised RuntimeError: boom (ex11_moe_dispatch.py:2)"
    beats = {0: {"waits_in": "all_to_all_single", "at": "ex11_moe_dispatch.py:9", "code": "out = a2a(x)"},
             1: {"waits_in": "all_reduce", "raised": said_raised}}
    watch = Watch(tmp_path, 2, beats=beats)
    said = explain(LaunchHang(10, watch.report(), collective=watch.in_collective()), learner)
    assert said.startswith("the job hung: no rank advanced for 10 s, and it was ended: rank 0 waits in "
                           "all_to_all_single at ex11_moe_dispatch.py:9 (out = a2a(x)); rank 1 had left your code, "
                           "after its combine raised RuntimeError: boom (ex11_moe_dispatch.py:2), and waited for the "
                           "other ranks to finish. A collective that only some ranks reach"), said
