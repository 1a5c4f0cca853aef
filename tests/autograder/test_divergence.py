"""The first divergence from the reference (autograder.grader.divergence), on made-up traces; and substitution's
parts."""
from __future__ import annotations

import textwrap

from autograder.grader import diagnosis
from autograder.grader.divergence import annotate, first_divergence, first_of_ranks
from autograder.grader.report import ExerciseReport
from autograder.grader.substitute import graded_functions, swapped, verdict


def _step(n, lr, params=1.0, line=20):
    return {"event": "optimizer.step", "step": n, "lr": [lr], "params": params, "rng": "ab",
            "file": "ex05_checkpoint.py", "line": line, "code": "optimizer.step()"}


def _sched(n, lr, line=21):
    return {"event": "scheduler.step", "step": n, "lr": [lr], "epoch": n,
            "file": "ex05_checkpoint.py", "line": line, "code": "scheduler.step()"}


REF = [_step(1, 0.1), _sched(1, 0.05), _step(2, 0.05), _sched(2, 0.025)]


def test_same_traces_do_not_diverge():
    assert first_divergence(REF, [dict(e) for e in REF]) is None
    assert first_divergence(REF, [dict(REF[0], params=1.0 + 1e-9)] + REF[1:]) is None  # within rtol
    # a blind audit's exercise 3: a step that overflows in float16 returns NaN in both runs ("[nan] vs [nan]")
    nan = [dict(REF[0], params=float("nan"))] + REF[1:]
    assert first_divergence(nan, [dict(e) for e in nan]) is None
    assert first_divergence(REF, nan).fields == ("params",)


def test_an_event_out_of_order_names_the_line_and_where_it_happens_later():
    got = [_sched(0, 0.05, line=19), _step(1, 0.05), _sched(1, 0.025, line=19)]
    d = first_divergence(REF, got)
    assert d.index == 0 and d.fields == ("event",)
    msg = d.message()
    assert "your code stepped the LR scheduler (to lr 0.05) (ex05_checkpoint.py:19: `scheduler.step()`)" in msg
    assert "where the reference stepped the optimizer (lr 0.1)" in msg
    assert "yours does that 1 event(s) later (ex05_checkpoint.py:20" in msg


def test_a_collective_of_another_tensor_is_not_the_one_the_reference_made():
    # the audit's exercise 2: the count's all-reduce (one number) left out; DDP's all-reduce of the gradients comes
    # next in the learner's run, but it is not the count's: "your code never does", not "8 event(s) later"
    def reduce(shape, line):
        return {"event": "collective", "kind": "all_reduce", "shape": shape, "group": 2, "step": 0,
                "file": "ex02_accumulation.py", "line": line, "code": "..."}

    step = _step(1, 0.1)
    ref = [reduce([], 90), step, reduce([3466], 105)]
    msg = first_divergence(ref, [step, reduce([3466], 105)]).message()
    assert msg.endswith("; your code never does"), msg
    assert "yours does that 1 event(s) later (ex02_accumulation.py:90" in first_divergence(
        ref, [step, reduce([], 90), reduce([3466], 105)]).message()


def test_a_return_from_another_function_is_another_act_not_another_value():
    # a blind audit's exercise 4: the optimizer built before sharding; "what it returned Adam vs the reference's
    # FSDPResidualMLP" compared make_optimizer's return with shard's
    def ret(function, returned, line):
        return {"event": "return", "step": 0, "function": function, "returned": returned, "file": "ex04_fsdp.py",
                "line": line, "code": "return ..."}

    ref = [ret("shard", "FSDPResidualMLP", 170), ret("make_optimizer", "Adam", 178)]
    d = first_divergence(ref, [ret("make_optimizer", "Adam", 178), ret("shard", "FSDPResidualMLP", 170)])
    assert d.fields == ("event",), d
    msg = d.message()
    assert "your code returned Adam from make_optimizer() (ex04_fsdp.py:178" in msg, msg
    assert "where the reference returned FSDPResidualMLP from shard(); yours does that 1 event(s) later " \
        "(ex04_fsdp.py:170" in msg, msg


def test_a_measurement_of_time_is_not_compared_and_a_launch_explains_its_own_world_size():
    # a blind audit's exercise 6: a hang at 2 workers was annotated with "your code returned 1062.09 from
    # measure_throughput() ... vs the reference's 1059.6022", timing noise of the launch at 1 worker
    def ret(value):
        return {"event": "return", "step": 0, "function": "measure_throughput", "returned": value,
                "file": "ex06_scaling.py", "line": 79, "code": "return ..."}

    assert first_divergence([ret(1059.6)], [ret(1062.09)]).fields == ("returned",)
    assert first_divergence([ret(1059.6)], [ret(1062.09)], measured=frozenset({"measure_throughput"})) is None
    report = ExerciseReport(99, "made-up", 2)
    report.check("[W=2] throughput", 1, False, "the job hung")
    report.check("passes", 1, True)
    assert not annotate(report, [[[ret(1062.09)]]], [[[ret(1059.6)]]])  # a launch at 1 worker, a criterion at 2
    assert "first difference" not in report.criteria[0].feedback
    assert annotate(report, [[[ret(1062.09)], [ret(1.0)]]], [[[ret(1059.6)], [ret(1.0)]]])  # at 2: it explains it


def test_the_function_it_happened_in_is_said():
    # a blind audit's exercise 4: "after 4 optimizer.step() call(s)" counted the FSDP part's steps, where the
    # difference was in ZeRO-1's first step
    ref = [dict(_step(5, 0.1), function="zero1_step")]
    msg = first_divergence(ref, [dict(ref[0], lr=[0.2])]).message()
    assert msg.startswith("first difference from the reference (after 5 optimizer.step() call(s), event 1, in "
                          "zero1_step()): "), msg


def test_no_step_count_where_nothing_steps_an_optimizer():
    # a blind audit's exercise 8 (tensor parallelism, no optimizer): "before any optimizer.step() call" was said
    ref = [{"event": "collective", "kind": "all_reduce", "shape": [4], "group": 2, "held": [1.0], "step": 0,
            "function": "forward", "file": "ex08_tensor_parallel.py", "line": 55, "code": "dist.all_reduce(x)"}]
    msg = first_divergence(ref, [dict(ref[0], held=[2.0])]).message()
    assert msg.startswith("first difference from the reference (event 1, in forward()): "), msg


def test_a_value_that_differs_is_shown_both_sides():
    got = [REF[0], _sched(1, 0.05), _step(2, 0.05, params=2.5), REF[3]]
    msg = first_divergence(REF, got).message()
    assert "after 2 optimizer.step() call(s), event 3" in msg
    assert "the parameters' sum after the step 2.5 vs the reference's 1" in msg


def test_a_run_that_ends_early_and_the_earliest_rank():
    d = first_divergence(REF, REF[:2])
    assert d.index == 2 and "your run ended where the reference stepped the optimizer" in d.message()
    d = first_of_ranks([REF, REF], [REF[:3], [REF[0], _sched(1, 0.5)] + REF[2:]])
    assert (d.rank, d.index) == (1, 1) and d.message().startswith("first difference from the reference (rank 1,")


def test_annotate_only_failures_that_name_no_cause():
    @diagnosis.mistake("a made-up mistake")
    def cause(x):
        return "the made-up cause, with numbers" if x else None

    report = ExerciseReport(99, "made-up", 3)
    report.check("named", 1, False, f"weights differ: {cause(True)}")
    report.check("symptom", 1, False, "weights differ (max abs difference 0.1)")
    report.check("passes", 1, True)
    assert cause.mistake == "a made-up mistake"
    assert annotate(report, [[REF[:3] + [_sched(2, 0.5)]]], [[REF]])
    named, symptom, _ = report.criteria
    assert "first difference" not in named.feedback
    assert "first difference from the reference (after 2 optimizer.step() call(s), event 4)" in symptom.feedback


SOLUTION = textwrap.dedent('''
    def helper():
        return 1


    def save(x):
        """Graded."""
        ### BEGIN SOLUTION
        return x + 1
        ### END SOLUTION


    def train(x):
        ### BEGIN SOLUTION
        return save(x) * 2
        ### END SOLUTION
''')


def test_substitution_swaps_one_graded_function():
    assert graded_functions(SOLUTION) == ["save", "train"]
    learner = "import os\n\n\ndef save(x):\n    return x - 1\n\n\ndef train(x):\n    return save(x) * 2\n"
    variant = swapped(learner, SOLUTION, "save")
    assert "return x + 1" in variant and "return x - 1" not in variant and variant.startswith("import os")
    assert swapped("def other(): pass\n", SOLUTION, "save") is None
    assert verdict([("save", 10, True), ("train", 4, False)], 4, 10).startswith("the difference is in save:")
    assert "mostly in train" in verdict([("save", 4, False), ("train", 6, False)], 4, 10)
    assert verdict([("save", 4, False)], 4, 10) is None


def test_launches_pair_by_world_size_and_calls_show_their_arguments():
    from autograder.grader.divergence import paired

    two, four = [REF, REF], [REF] * 4
    assert paired([two, four], [four, two]) == [(four, four), (two, two)]  # finished in another order
    sampler = {"event": "DistributedSampler", "step": 0, "args": {"shuffle": True, "seed": 7, "drop_last": False},
               "file": "ex01_ddp.py", "line": 111, "code": "sampler = DistributedSampler(...)"}
    d = first_divergence([sampler], [dict(sampler, args=dict(sampler["args"], seed=8))])
    assert d.fields == ("args",) and "your code called DistributedSampler(shuffle=True, seed=8, drop_last=False) " \
        "(ex01_ddp.py:111" in d.message()
    ret = {"event": "return", "step": 56, "function": "evaluate_ddp", "returned": [2.31337, 0.190476],
           "file": "ex01_ddp.py", "line": 171, "code": "return ..."}
    msg = first_divergence([ret], [dict(ret, returned=[0.190476, 0.190476])]).message()
    assert "your code returned (0.190476, 0.190476) from evaluate_ddp() (ex01_ddp.py:171: `return ...`): what " \
        "it returned [0.190476, 0.190476] vs the reference's [2.31337, 0.190476]" in msg


def test_rng_states_are_compared_only_from_the_same_start():
    later = [REF[0], REF[1], dict(REF[2], rng="cd"), REF[3]]  # a draw more after the first step: shown
    assert first_divergence(REF, later).fields == ("rng",)
    shifted = [dict(e, rng="ef") if e["event"] == "optimizer.step" else e for e in REF]  # another history
    assert first_divergence(REF, shifted) is None


def test_the_reference_traces_are_graded_once_and_kept_for_later_processes_until_the_code_changes(tmp_path,
                                                                                                      monkeypatch):
    from types import SimpleNamespace

    from autograder.grader import divergence
    from autograder.grader.launches import TRACES

    graded = []

    def grade(paths, **kwargs):
        graded.append(kwargs)
        TRACES[str(paths[0])] = [[[{"event": "optimizer.step", "lr": [0.1]}], [{"event": "backward"}]]]

    check = SimpleNamespace(__name__="autograder.checks.ex99_fake", grade=grade,
                            EXERCISE=SimpleNamespace(filename="ex99_fake.py"))
    monkeypatch.setenv(divergence.STORE_VAR, str(tmp_path))
    monkeypatch.setattr(divergence, "_REFERENCE", {})
    first = divergence.reference_traces(check, world_sizes=(2,))
    assert len(graded) == 1 and list(tmp_path.glob("ex99_fake-*.pt"))
    divergence._REFERENCE.clear()  # a later process: graded by none, read from the store
    assert divergence.reference_traces(check, world_sizes=(2,)) == first and len(graded) == 1
    divergence.reference_traces(check, world_sizes=(4,))  # other arguments: graded
    monkeypatch.setattr(divergence, "_code_digest", lambda: "another checkout")
    divergence._REFERENCE.clear()
    divergence.reference_traces(check, world_sizes=(2,))  # changed code: graded again
    assert graded == [{"world_sizes": (2,)}, {"world_sizes": (4,)}, {"world_sizes": (2,)}]
    monkeypatch.setenv(divergence.STORE_VAR, "0")
    divergence._REFERENCE.clear()
    divergence.reference_traces(check, world_sizes=(2,))  # none kept
    assert len(graded) == 4
