"""The trace recorder (autograder.rank.trace), in this process: each event at the learner's line."""
from __future__ import annotations

import textwrap

import pytest
import torch

from autograder.rank.errors import describe_value, raised, values_at
from autograder.rank.trace import Tracer, held, return_line
from distlab.runtime.importing import import_path

LEARNER = textwrap.dedent("""
    import torch
    from torch import nn


    def train(out, steps=3):
        model = nn.Linear(4, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        for _ in range(steps):
            optimizer.zero_grad()
            model(torch.ones(3, 4)).sum().backward()
            scheduler.step()
            optimizer.step()
        torch.save({"model": model.state_dict(), "step": steps}, out)


    def broken(x):
        y = torch.ones(5, 3)
        return x @ y
""")
# The learner above steps the scheduler first on purpose (the trace must show it): PyTorch warns of it.
pytestmark = pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before")


def _learner(tmp_path):
    path = tmp_path / "ex99_trace.py"
    path.write_text(LEARNER)
    return path, import_path(path, name="learner_ex99_trace")


def test_events_in_order_at_the_learners_lines(tmp_path):
    path, learner = _learner(tmp_path)
    with Tracer() as tracer:
        tracer.begin(str(path))
        learner.train(tmp_path / "ck.pt")
    events = tracer.traces[str(path)]
    kinds = [e["event"] for e in events]
    assert kinds[:6] == ["scheduler.step", "zero_grad", "forward", "backward", "scheduler.step",
                         "optimizer.step"]  # the scheduler's init, then the loop
    assert kinds.count("optimizer.step") == 3 and kinds[-1] == "save"
    assert events[3]["shape"] == [] and events[3]["line"] == 12 and events[1]["line"] == 11
    sched = events[4]
    assert (sched["file"], sched["line"], sched["code"]) == ("ex99_trace.py", 13, "scheduler.step()")
    assert sched["lr"] == [0.05] and sched["step"] == 0  # stepped before the optimizer: lr halved already
    step = events[5]
    assert step["line"] == 14 and step["step"] == 1 and step["lr"] == [0.05]
    assert isinstance(step["params"], float) and len(step["rng"]) == 12
    assert events[2]["module"] == "Linear" and events[2]["line"] == 12  # the learner's call, not a child
    assert events[-1]["held"] == ["model.weight", "model.bias", "step"] and events[-1]["line"] == 15


def test_bounded_and_plain_data(tmp_path):
    path, learner = _learner(tmp_path)
    with Tracer(max_events=5) as tracer:
        tracer.begin(str(path))
        learner.train(tmp_path / "ck.pt", steps=10)
    events = tracer.traces[str(path)]
    assert len(events) == 6 and events[-1]["event"] == "truncated"
    torch.save(tracer.traces, tmp_path / "t.pt")  # plain data: loads with weights_only
    assert torch.load(tmp_path / "t.pt", weights_only=True) == tracer.traces


def test_events_outside_a_learners_file_are_not_recorded(tmp_path):
    path, _ = _learner(tmp_path)
    with Tracer() as tracer:
        tracer.begin(str(path))
        torch.save({"x": 1}, tmp_path / "grader.pt")  # the grader's own save
    assert tracer.traces[str(path)] == []
    assert held([1, 2]) == "list"


def test_values_at_the_learners_line(tmp_path):
    path, learner = _learner(tmp_path)
    try:
        learner.broken(torch.ones(2, 4, requires_grad=True))
    except RuntimeError as exc:
        values = values_at(exc, path)
    assert values == ("x: float32[2, 4], requires_grad=True, grad None; "
                      "y: float32[5, 3], requires_grad=False, grad None")
    assert describe_value(3) is None


GROUP = textwrap.dedent("""
    import torch
    import torch.distributed as dist


    def setup():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))


    def metric(x):
        totals = torch.tensor([x, 2.0])
        dist.all_reduce(totals)
        return (totals[0] / totals[1]).item(), 1


    def teardown():
        dist.destroy_process_group()
""")


def test_the_process_group_a_small_collectives_values_and_what_functions_return(tmp_path):
    """No launch (one gloo rank here): the group's init and destroy, a metric's all-reduce with what this
    rank contributed, and what each of the learner's functions returned, at its return line."""
    from autograder.rank import watched

    path = tmp_path / "ex98_group.py"
    path.write_text(GROUP)
    with Tracer() as tracer:
        tracer.begin(str(path))
        learner = watched(import_path(path, name="learner_ex98_group"))
        learner.setup()
        try:
            assert learner.metric(3.0) == (1.5, 1)
        finally:
            learner.teardown()
    events = tracer.traces[str(path)]
    kinds = [e["event"] for e in events]
    assert kinds[:2] == ["init_process_group", "DistributedDataParallel"] and kinds.count("return") == 3
    assert kinds[-5:] == ["return", "collective", "return", "destroy_process_group", "return"]
    assert events[0]["line"] == 7 and events[0]["args"]["backend"] == "gloo"
    ddp = [e for e in events[:-5] if e["event"] == "collective"]
    assert ddp and all("held" not in e for e in ddp)  # DDP's own checks: no values (only the learner's calls)
    assert events[-5]["returned"] is None and events[-5]["function"] == "setup"
    metric = events[-4]
    assert metric["held"] == [3.0, 2.0] and metric["line"] == 13 and metric["kind"] == "all_reduce"
    assert events[-3]["returned"] == [1.5, 1] and (events[-3]["line"], events[-3]["code"]) == (
        14, "return (totals[0] / totals[1]).item(), 1")
    assert not hasattr(learner.metric, "__wrapped__")  # wrapped while traced, put back on exit
    assert return_line(learner.setup) == (8, "torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))")


FUNCTIONAL = textwrap.dedent("""
    import torch
    import torch.distributed as dist
    from torch.distributed._functional_collectives import all_to_all_single_autograd


    def dispatch(x):
        return all_to_all_single_autograd(x, None, None, dist.group.WORLD).wait()
""")


def test_a_functional_collectives_group_is_its_size(tmp_path):
    """``_c10d_functional`` ops name their group by a string (not a boxed ProcessGroup): the event still has
    its size, so a divergence reads "group of 1", not "group of None" (exercise 11's autograd all-to-all)."""
    import torch.distributed as dist

    path = tmp_path / "ex97_functional.py"
    path.write_text(FUNCTIONAL)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with Tracer() as tracer:
            tracer.begin(str(path))
            learner = import_path(path, name="learner_ex97_functional")
            assert torch.equal(learner.dispatch(torch.arange(4.0)), torch.arange(4.0))
    finally:
        dist.destroy_process_group()
    (event,) = [e for e in tracer.traces[str(path)] if e["event"] == "collective"]
    assert (event["kind"], event["shape"], event["group"], event["line"]) == ("all_to_all", [4], 1, 8)


OUTPUT_FIRST = textwrap.dedent("""
    import torch
    import torch.distributed as dist


    def exchange(counts):
        recv = torch.full_like(counts, 7e13)  # what torch.empty_like may leave: not this rank's
        dist.all_to_all_single(recv, counts)
        gathered = torch.full((2 * counts.numel(),), -1.0)
        dist.all_gather_into_tensor(gathered[:counts.numel()], counts)
        return recv
""")


@pytest.mark.filterwarnings("ignore:`torch.distributed.all_gather_into_tensor` is deprecated:FutureWarning")
def test_a_collective_holds_what_the_rank_sends_not_its_output_buffer(tmp_path):
    """c10d's all_to_all_single and all_gather_into_tensor take the output buffer first: the event's values are
    the input's (what this rank contributed), never the buffer's, whose values torch.empty leaves undefined
    (exercise 11's audit: a divergence quoted 9.4e+13 from a correct exchange_split_sizes)."""
    import torch.distributed as dist

    path = tmp_path / "ex96_output_first.py"
    path.write_text(OUTPUT_FIRST)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with Tracer() as tracer:
            tracer.begin(str(path))
            learner = import_path(path, name="learner_ex96_output_first")
            assert learner.exchange(torch.tensor([3.0, 5.0])).tolist() == [3.0, 5.0]
    finally:
        dist.destroy_process_group()
    events = [e for e in tracer.traces[str(path)] if e["event"] == "collective"]
    assert [(e["kind"], e["held"]) for e in events] == [("all_to_all", [3.0, 5.0]), ("all_gather", [3.0, 5.0])]


def test_a_c10_check_is_said_without_its_log_prefix():
    # a time stamp and PyTorch's source line are no fact of the learner's run (exercise 4's bf16 reduce-scatter)
    exc = RuntimeError("[rank0]:[F1207 19:49:03.501851262 ProcessGroupGloo.cpp:1536] Check failed: "
                       "outputTensors[i].dtype() == inputTensors[i].dtype() (float vs. c10::BFloat16). ")
    assert raised(exc) == ("RuntimeError: Check failed: outputTensors[i].dtype() == inputTensors[i].dtype() "
                           "(float vs. c10::BFloat16).")
    assert raised(RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Timed out")) == \
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Timed out"  # not c10's prefix: kept
