"""Exercise 6 (DDP scaling benchmark): the solution and an independent one (tests/exercises/independent) score
full marks, the stub 0, and each classic measuring mistake fails with its own diagnosis, whatever the
file's import style; what the real run does (wrappers built, all-reduces and collectives per step) is
counted; each mutant also carries one mistake of the α-β fit and one of the prediction, each named with
its numbers. The solution, the independent one and the mutants are graded together: one launch per world
size (1 and 2; the CLI also grades 4)."""
from __future__ import annotations

import re

import pytest

from autograder.checks import ex06_scaling as check
from autograder.grader.diagnosis import translate
from tests.exercises import independent
from tests.helpers import REAL_FEW_STEPS, SOLUTIONS, failed, mutant

FILE = check.EXERCISE.filename
# Each mutant also carries one mistake in the α-β fit and one in the prediction (graded apart from the rest).
FIT = {
    "elements": {'dtype=torch.float64) * 4  # float32': 'dtype=torch.float64)  # float32'},
    "latency once": {"torch.stack([2 * (w - 1), 2 * (w - 1) / w * nbytes]":
                     "torch.stack([torch.ones_like(w), 2 * (w - 1) / w * nbytes]"},
    "algorithm bandwidth": {"torch.stack([2 * (w - 1), 2 * (w - 1) / w * nbytes]": "torch.stack([2 * (w - 1), nbytes]"},
    "no (W-1)/W": {"torch.stack([2 * (w - 1), 2 * (w - 1) / w * nbytes]": "torch.stack([2 * (w - 1), 2 * nbytes]"},
    "seconds": {"torch.linalg.lstsq(features / t.unsqueeze(1), torch.ones_like(t).unsqueeze(1))":
                "torch.linalg.lstsq(features, t.unsqueeze(1))"},
    "bandwidth": {"    return alpha, beta\n": "    return alpha, 1 / beta\n"},
    "nothing returned": {"    return alpha, beta\n": "    alpha, beta\n"},
    "2 bytes an element": {'dtype=torch.float64) * 4  # float32': 'dtype=torch.float64) * 2  # float32'},
}
PREDICT = {
    "speed-up": {"return compute_s / (compute_s + exposed_s)": "return world * compute_s / (compute_s + exposed_s)"},
    "no overlap": {"exposed_s = max(0.0, allreduce_s - backward_s)": "exposed_s = allreduce_s"},
    "whole step": {"return compute_s / (compute_s + exposed_s)": "return compute_s / max(compute_s, allreduce_s)"},
    "latency once": {"allreduce_s = 2 * (world - 1) * alpha + ": "allreduce_s = alpha + "},
    "algorithm bandwidth": {"2 * (world - 1) / world * grad_bytes * beta": "grad_bytes * beta"},
    "no (W-1)/W": {"2 * (world - 1) / world * grad_bytes * beta": "2 * grad_bytes * beta"},
    # blind audits': the exposed time not clamped at 0; the bandwidth term a reduce-scatter's, (W-1)/W
    "no clamp": {"exposed_s = max(0.0, allreduce_s - backward_s)": "exposed_s = allreduce_s - backward_s"},
    "half the ring": {"2 * (world - 1) / world * grad_bytes * beta": "(world - 1) / world * grad_bytes * beta"},
    # no cause: the feedback names the line whose number is none of the model's
    "a floor on the exposed time": {"max(0.0, allreduce_s - backward_s)": "max(0.001, allreduce_s - backward_s)"},
}
MISTAKES = {
    "one rank's samples": {
        "return dist.get_world_size() * batch_size * iters / elapsed.item()":
            "return batch_size * iters / elapsed.item()", **FIT["elements"], **PREDICT["speed-up"]},
    "warm-up timed": {
        "    for _ in range(warmup):\n": "    start = time.perf_counter()\n    for _ in range(warmup):\n",
        "    start = time.perf_counter()\n    for _ in range(iters):": "    for _ in range(iters):",
        **FIT["latency once"], **PREDICT["no overlap"]},
    "no barrier": {"dist.barrier()": "None", **FIT["algorithm bandwidth"], **PREDICT["whole step"]},
    # two independent mistakes: a step without DDP, and each rank returning its own clock's figure
    "no DDP, own figure per rank": {
        "ddp = DDP(model, device_ids=[device.index] if device.type == \"cuda\" else None)": "ddp = model",
        "dist.broadcast(elapsed, src=0)": "None", **FIT["no (W-1)/W"], **PREDICT["latency once"]},
    # the warm-up steps' samples counted (not timed); and a blind audit's step that never clears the gradients
    # (10 of 10 before: the parameters changed and agreed)
    "warm-up samples": {
        "return dist.get_world_size() * batch_size * iters / elapsed.item()":
            "return dist.get_world_size() * batch_size * (warmup + iters) / elapsed.item()",
        "        opt.zero_grad(set_to_none=True)\n": "",
        **FIT["seconds"], **PREDICT["algorithm bandwidth"]},
    # and two more: the clocks all-reduced with the default SUM, and the forward on the inner module
    "summed clocks, inner forward": {"dist.broadcast(elapsed, src=0)": "dist.all_reduce(elapsed)",
                                     "ddp(x), y)": "ddp.module(x), y)", **FIT["bandwidth"], **PREDICT["no (W-1)/W"]},
    # and the optimizer stepped before the backward (every step finds no gradient)
    "CPU clock": {"start = time.perf_counter()": "start = time.process_time()",
                  "time.perf_counter() - start": "time.process_time() - start",
                  "        loss.backward()\n        opt.step()\n": "        opt.step()\n        loss.backward()\n",
                  **PREDICT["a floor on the exposed time"]},
    # The ranks arrive at the timed steps at different times: no barrier before the clock starts (and a
    # barrier of its own in every real step, which the real run counts).
    # And each warm-up step timed for a log (a blind audit's): the clock is read before the window starts, which
    # is not where it starts.
    "no start barrier, barrier per step": {
        "    dist.barrier()                    # nobody starts the clock before everyone is warm\n": "",
        "    for _ in range(warmup):\n        step()\n":
            "    for _ in range(warmup):\n        t = time.perf_counter()\n        step()\n"
            "        print(f\"warm-up step: {time.perf_counter() - t:.3f} s\")\n",
        "        opt.step()\n": "        opt.step()\n        dist.barrier()\n", **FIT["nothing returned"]},
    # Two independent mistakes: the clock stopped without a barrier, in a file naming its clock and barrier by
    # name (the spies see them: the cause is named from the reads), and a DDP wrapper rebuilt in every step.
    "from-imports no end barrier, wrapper per step": {
        "import time\n": "from time import perf_counter\n",
        "import torch.distributed as dist\n":
            "import torch.distributed as dist\nfrom torch.distributed import barrier\n",
        "time.perf_counter()": "perf_counter()",
        "    dist.barrier()                    # ... on every rank, the slowest included\n": "",
        "    dist.barrier()                    # nobody": "    barrier()                    # nobody",
        "    def step() -> None:\n": "    def step() -> None:\n        ddp = DDP(model, device_ids=None)\n",
        **FIT["2 bytes an element"]},
    # measure_throughput's return dropped (no figure: its own cause, not the grader's TypeError), and a
    # name make_ddp_step never defined (its error at the learner's line)
    "no figure, a name undefined": {
        "    return dist.get_world_size() * batch_size * iters / elapsed.item()\n":
            "    dist.get_world_size() * batch_size * iters / elapsed.item()\n",
        "    device = x.device\n": "", **PREDICT["half the ring"]},
    # a blind audit's: the clock read before the barrier that lines the ranks up after the warm-up
    "clock before the barrier": {
        "    dist.barrier()                    # nobody starts the clock before everyone is warm\n"
        "    start = time.perf_counter()\n": "    start = time.perf_counter()\n    dist.barrier()\n",
        **PREDICT["no clamp"],
        # and another's (10 of 10 before, the grader's lr was bench_rank's): the optimizer's lr hard-coded
        "    opt = torch.optim.SGD(ddp.parameters(), lr=lr)": "    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)"},
}
# a blind audit's two (10 of 10 before): the figure returned as a 0-dim tensor, and SGD with momentum
TENSOR_MOMENTUM = {"return dist.get_world_size() * batch_size * iters / elapsed.item()":
                   "return dist.get_world_size() * batch_size * iters / elapsed",
                   "    opt = torch.optim.SGD(ddp.parameters(), lr=lr)":
                   "    opt = torch.optim.SGD(ddp.parameters(), lr=lr, momentum=0.9)"}
STEP_RAISES = {"        opt.zero_grad(set_to_none=True)\n": "        optimizer.zero_grad(set_to_none=True)\n"}
# measure_throughput raises on every rank (a float to a collective), which ends the launch in the method: the real
# step is then driven by the grader's loop, and make_ddp_step keeps its marks (a hang there cost them, twice)
FLOAT_COLLECTIVE = {"    elapsed = torch.tensor(time.perf_counter() - start, dtype=torch.float64, device=device)\n":
                    "    elapsed = time.perf_counter() - start\n",
                    # and a blind audit's (only "difference" before): the step's loss summed over the batch
                    "        loss = nn.functional.cross_entropy(ddp(x), y)":
                    "        loss = nn.functional.cross_entropy(ddp(x), y, reduction=\"sum\")"}
METHOD = "[W={}] throughput of the timed steps of every rank"
FITTED = "α and β fitted to all-reduce times at several world sizes"
PREDICTED = "efficiency predicted at unmeasured W, the all-reduce overlapping the backward"
REAL = "the real run: one DDP wrapper, one all-reduce per step, the steps after the warm-up timed"
NOT_CHECKED = "not checked: needs 'the real step trains with DDP' first"


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    paths = [SOLUTIONS / FILE]
    for i, repl in enumerate(MISTAKES.values()):
        paths.append(mutant(tmp_path_factory.mktemp(f"m{i}"), FILE, repl))
    paths.append(independent.path(6))
    paths.append(mutant(tmp_path_factory.mktemp("tensor_momentum"), FILE, TENSOR_MOMENTUM))
    paths.append(mutant(tmp_path_factory.mktemp("float_collective"), FILE, FLOAT_COLLECTIVE))
    # last: its real step raises on every rank, which ends the launch; it is launched again without its real run
    paths.append(mutant(tmp_path_factory.mktemp("step_raises"), FILE, STEP_RAISES))
    reports = check.grade(paths, world_sizes=(1, 2), real=REAL_FEW_STEPS)
    return {"solution": reports[0], **dict(zip(MISTAKES, reports[1:-4])), "independent": reports[-4],
            "tensor and momentum": reports[-3], "float collective": reports[-2], "step raises": reports[-1]}


@pytest.mark.slow
def test_solution_full_marks_and_real_figures(graded):
    r = graded["solution"]
    assert r.score == r.max_score, r.feedback
    assert "7 steps, one wrapper and one gradient all-reduce per step at 1, 2 worker(s)" in r.feedback
    # Judged against the learner's own clock reads, so no bound on the ratio to the truth holds on a loaded
    # machine but this one: a window that covers every rank's timed steps is never shorter than they took.
    for w in (1, 2):
        assert r.measurements[f"W{w}_synthetic_reported_over_truth"] <= 1.001
    assert r.measurements["fit_max_rel_error"] <= 0.01  # against the 5% tolerance
    assert "samples/s, efficiency 100%" in r.feedback


@pytest.mark.slow
def test_the_independent_solution_scores_full_marks(graded):
    r = graded["independent"]
    assert r.score == r.max_score, r.feedback


@pytest.mark.slow
def test_a_tensor_figure_and_momentum_are_named_once_each(graded):
    f = failed(graded["tensor and momentum"])
    assert set(f) == {METHOD.format(1), "the real step trains with DDP"}, f
    assert f[METHOD.format(1)].startswith("measure_throughput returned a Tensor on rank 0, where its contract returns "
                                          "a float"), f
    assert f["the real step trains with DDP"].startswith("the optimizer that stepped was SGD with momentum=0.9, where "
                                                          "make_ddp_step's is torch.optim.SGD(lr=lr)"), f


def test_counting_one_rank_fails_at_two_workers(graded):
    f = failed(graded["one rank's samples"])
    assert set(f) == {METHOD.format(2), FITTED, PREDICTED}
    assert "you counted one rank's samples" in f[METHOD.format(2)]


@pytest.mark.slow
def test_timing_the_warmup_fails_at_every_size(graded):
    f = failed(graded["warm-up timed"])
    assert set(f) == {METHOD.format(1), METHOD.format(2), FITTED, PREDICTED}
    assert "includes the 2 slow warm-up steps" in f[METHOD.format(1)]


@pytest.mark.slow
def test_no_barrier_times_rank_zero_alone(graded):
    f = failed(graded["no barrier"])
    assert set(f) == {METHOD.format(2), FITTED, PREDICTED}
    assert "that is rank 0's own time" in f[METHOD.format(2)]
    assert "dist.barrier()" in f[METHOD.format(2)]


@pytest.mark.slow
def test_step_without_ddp_leaves_ranks_apart(graded):
    f = failed(graded["no DDP, own figure per rank"])
    assert set(f) == {"the real step trains with DDP", METHOD.format(2), REAL, FITTED, PREDICTED}
    assert f[REAL] == NOT_CHECKED
    assert "rank 1's parameters differ from rank 0's" in f["the real step trains with DDP"]
    assert "no DistributedDataParallel was made" in f["the real step trains with DDP"]


@pytest.mark.slow
def test_a_figure_per_rank_fails_the_same_figure_clause(graded):
    f = failed(graded["no DDP, own figure per rank"])
    assert "return the same figure on every rank" in f[METHOD.format(2)]
    assert "rank 1 returned" in f[METHOD.format(2)]


@pytest.mark.slow
def test_counting_the_warmup_samples_is_named(graded):
    f = failed(graded["warm-up samples"])
    # the real run's wrapper, all-reduces and steps are judged: its step trains through DDP, only wrongly
    assert set(f) == {METHOD.format(1), METHOD.format(2), "the real step trains with DDP", FITTED, PREDICTED}
    for w in (1, 2):
        assert "that is (2 + 8) / 8: you counted the samples of the 2 warm-up steps too" in f[METHOD.format(w)]
    assert f["the real step trains with DDP"].startswith(
        "at 1 worker(s) rank 0's weights after 7 calls of step() are those that steps whose gradients are never "
        "cleared leave"), f["the real step trains with DDP"]


@pytest.mark.slow
def test_summed_clocks_and_the_inner_forward_are_named_not_their_lookalikes(graded):
    f = failed(graded["summed clocks, inner forward"])
    assert set(f) == {METHOD.format(2), "the real step trains with DDP", REAL, FITTED, PREDICTED}
    assert f[REAL] == NOT_CHECKED  # one mistake, one message
    assert "all-reduced the elapsed time with SUM" in f[METHOD.format(2)]
    assert "counted one rank's samples" not in f[METHOD.format(2)]  # the same 1/W ratio, another cause
    ddp = f["the real step trains with DDP"]
    assert "wrapped in DistributedDataParallel, but no forward went through the wrapper" in ddp
    assert "wrap the model" not in ddp  # it was wrapped


@pytest.mark.slow
def test_cpu_time_is_named(graded):
    f = failed(graded["CPU clock"])
    assert set(f) == {METHOD.format(1), METHOD.format(2), PREDICTED, "the real step trains with DDP", REAL}
    assert "you timed with time.process_time()" in f[METHOD.format(1)]
    real = f["the real step trains with DDP"]  # it did step: at the wrong moment
    assert real.startswith("opt.step() ran 7 times in 7 calls of step(), and every time the parameters held no "
                           "gradient (.grad None or zero)") and ": it ran before loss.backward() made them" in real, \
        real


@pytest.mark.slow
def test_a_clock_started_before_the_late_rank_arrived_is_named(graded):
    f = failed(graded["no start barrier, barrier per step"])
    assert {METHOD.format(2), REAL} <= set(f) and "the real step trains with DDP" not in f
    assert "rank 0 started the clock when its own warm-up ended" in f[METHOD.format(2)]
    assert "before rank 1 finished its warm-up" in f[METHOD.format(2)]
    assert "dist.barrier() after the warm-up" in f[METHOD.format(2)]
    assert "includes the 2 slow warm-up steps" not in f[METHOD.format(2)]  # it read the clock there, for a log


@pytest.mark.slow
def test_a_collective_in_every_real_step_is_counted(graded):
    real = failed(graded["no start barrier, barrier per step"])[REAL]
    assert real.startswith("at 1 worker(s) step() itself called dist.barrier (7 calls in 7 steps)"), real


@pytest.mark.slow
def test_a_wrapper_rebuilt_in_every_step_is_named_from_the_real_run(graded):
    f = failed(graded["from-imports no end barrier, wrapper per step"])
    assert REAL in f and "the real step trains with DDP" not in f  # its training is right
    assert f[REAL].startswith("at 1 worker(s) step() built a new DistributedDataParallel in 7 of its 7 calls")
    assert "Build the wrapper and the optimizer once, in make_ddp_step" in f[REAL]


@pytest.mark.slow
def test_names_bound_by_from_imports_are_seen(graded):
    f = failed(graded["from-imports no end barrier, wrapper per step"])
    assert "rank 0 read the clock after its last step with no barrier in between" in f[METHOD.format(2)]


# Each mutant's fit mistake (FIT), and the words and figures its message must have.
FIT_MESSAGES = {
    "one rank's samples": ["as a fit on the rows' numel gives", "is 4.01x the 5e-10", "bytes = 4 * numel"],
    "warm-up timed": ["is 2.43x the 40.0 µs", "as a model with one latency per all-reduce gives",
                      "its 2(W-1) steps", "2α = 80.0 µs", "14α = 560.0 µs: 7x too little"],
    "no barrier": ["is 1.14x the 5e-10, as bytes * β gives (the algorithm bandwidth)", "1.5 at W=4"],
    "no DDP, own figure per rank": ["is 0.57x the 5e-10, as 2 * bytes * β gives", "(1 at W=2, not 2)"],
    "warm-up samples": ["your α (63.6 µs) is 1.59x the 40.0 µs, as least squares in seconds gives",
                        "carry up to 3% noise", "divide each row's equation by its time"],
    "summed clocks, inner forward": ["you returned 2e+09 as β: that is a bandwidth"],
}
PREDICT_MESSAGES = {
    "one rank's samples": ["you predicted 2.02 at W=8, the speed-up", "= 0.253 (1 at linear scaling)"],
    "warm-up timed": ["at W=8 (a 10 ms step, 6 ms of it the backward, 40 MB of gradients", "you predicted 0.219",
                      "the whole all-reduce (35.56 ms) added", "max(0, all-reduce - backward) = 29.56 ms"],
    "no barrier": ["you predicted 0.281, as max(step, all-reduce) gives", "not under the forward or the update"],
    "no DDP, own figure per rank": ["you predicted 0.256, with one latency (40.0 µs)", "2(W-1) = 14 steps (560.0 µs"],
    "warm-up samples": ["you predicted 0.407, with the all-reduce moving bytes * β", "2(W-1)/W = 1.75 times"],
    "summed clocks, inner forward": ["you predicted 0.224, with 2 * bytes * β", "2(W-1)/W = 1.75"],
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FIT_MESSAGES))
def test_each_fit_and_prediction_mistake_is_named_with_its_numbers(graded, name):
    f = failed(graded[name])
    assert f[FITTED].startswith("on the gloo-like times (12 all-reduces at W = 2, 4, made with α = 40 µs"), f[FITTED]
    for words in FIT_MESSAGES[name]:
        assert words in f[FITTED], f[FITTED]
    for words in PREDICT_MESSAGES[name]:
        assert words in f[PREDICTED], f[PREDICTED]


@pytest.mark.slow
def test_no_figure_returned_and_an_error_in_make_ddp_step_are_named_at_the_learners_line(graded):
    f = failed(graded["no figure, a name undefined"])
    for w in (1, 2):
        assert f[METHOD.format(w)].startswith("measure_throughput returned None on rank 0, so there is no figure"), f
    line = next(i for i, ln in enumerate((SOLUTIONS / FILE).read_text().splitlines(), 1) if "ddp = DDP(model" in ln)
    assert f["the real step trains with DDP"] == (  # one line above the solution's: the mutant dropped one
        f"make_ddp_step raised NameError: name 'device' is not defined, at {FILE} line {line - 1} in make_ddp_step: "
        'ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)'), f


@pytest.mark.slow
def test_a_fit_returning_nothing_and_a_wrong_element_size_are_named(graded):
    assert failed(graded["no start barrier, barrier per step"])[FITTED] == (
        "fit_alpha_beta returned None: every path through it must end in return (alpha, beta)")
    f = failed(graded["from-imports no end barrier, wrapper per step"])[FITTED]
    # the same figures as a bandwidth term of (W-1)/W: both are said
    assert "is 2.00x the 5e-10, as a fit gives whose bandwidth term is (W-1)/W * bytes, half the ring's " in f, f
    assert "or one that counts 2 bytes an element" in f, f


@pytest.mark.slow
def test_a_clock_read_before_the_barrier_and_an_unclamped_exposed_time_are_named(graded):
    f = failed(graded["clock before the barrier"])
    assert set(f) == {METHOD.format(2), PREDICTED, "the real step trains with DDP"}, f  # at 1 rank no one waits
    assert f["the real step trains with DDP"] == ("the optimizer stepped with lr=0.01, where make_ddp_step was given "
                                                  "lr=0.05: build the optimizer with the lr argument (the benchmark's "
                                                  "callers pass their own)"), f
    assert re.search(r"rank 0 read the clock \(perf_counter\) when its warm-up ended, then called dist\.barrier\(\), "
                     r"which returned 0\.\d+ s later, once every rank had reached it: your window", f[METHOD.format(2)])
    assert "as compute + (all-reduce - backward) gives where the all-reduce (3.24 ms) is shorter than the backward " \
        "(6 ms)" in f[PREDICTED], f[PREDICTED]
    said = failed(graded["no figure, a name undefined"])[PREDICTED]
    assert "with (W-1)/W * bytes * β, one reduce-scatter's worth" in said, said


@pytest.mark.slow
def test_a_wrong_prediction_without_a_cause_names_the_line_that_left_the_model(graded):
    f = failed(graded["CPU clock"])[PREDICTED]
    lines = (SOLUTIONS / FILE).read_text().splitlines()
    line = next(i for i, text in enumerate(lines, 1) if "exposed_s = max(" in text)
    assert f.startswith("at W=4 (compute_s=0.01, backward_s=0.006, grad_bytes=4e+06, alpha=4e-05, beta=5e-10) you "
                        "predicted 0.9091, the model 1: "), f
    assert f"ex06_scaling.py line {line} (exposed_s = max(0.001, allreduce_s - backward_s)" in f
    assert "made exposed_s = 0.001, none of the model's numbers at W=4" in f


@pytest.mark.parametrize("raised, name", [
    ("TypeError: Invalid function argument. Expected parameter `tensor` of type torch.Tensor\n but got <class "
     "'float'> instead.", "a Python float passed to a collective"),
    ("ValueError: trying to initialize the default process group twice!",
     "the process group initialised again in the benchmark"),
    ("RuntimeError: No backend type associated with device type cpu", "a CPU tensor in an NCCL collective"),
])
def test_errors_of_known_mistakes_are_translated(raised, name):
    assert translate(raised, check.KNOWN_ERRORS).startswith(name)


def test_launch_timeouts_fit_the_time_limit():
    for sizes in ((1, 2, 4), (1, 2)):
        assert sum(b.nominal_s for b in check.launch_timeouts(sizes).values()) <= check.EXERCISE.time_limit - 10


def test_a_measure_throughput_that_ends_the_launch_costs_the_method_only_and_a_summed_loss_is_named(graded):
    r = graded["float collective"]
    f = failed(r)
    assert list(f) == [METHOD.format(1), METHOD.format(2), "the real step trains with DDP"], r.feedback
    assert f["the real step trains with DDP"].startswith(  # the loss summed, driven by the grader's loop
        "at 1 worker(s) rank 0's weights after 7 calls of step() are those of SGD on each batch's summed "
        "cross-entropy"), f
    assert all(f[METHOD.format(w)].startswith("measure_throughput did not finish: ") for w in (1, 2)), f
    assert "collectives work on tensors" in f[METHOD.format(1)], f
    assert ("(at 1, 2 worker(s) the grader's loop ran the steps, as your measure_throughput did not finish there: "
            "its clock is judged by the throughput's criterion)") in r.feedback, r.feedback


def test_a_real_step_that_raises_costs_the_real_run_only(graded):
    """The audit's: a name the step's closure never had (NameError on every rank, in the real benchmark): the
    method at every world size and the α-β part are graded as they would be alone."""
    r = graded["step raises"]
    f = failed(r)
    assert list(f) == ["the real step trains with DDP", REAL], r.feedback
    line = next(i for i, ln in enumerate((SOLUTIONS / FILE).read_text().splitlines(), 1) if "opt.zero_grad(" in ln)
    assert f["the real step trains with DDP"] == (
        "the real benchmark (make_ddp_step, then measure_throughput) did not finish: at 1 worker(s), your code "
        "raised on rank 0: NameError: name 'optimizer' is not defined\n"
        f"  at {FILE} line {line} in step: optimizer.zero_grad(set_to_none=True)"), f
    assert f[REAL] == ("not checked: the real benchmark (make_ddp_step, then measure_throughput) did not finish "
                       "(see 'the real step trains with DDP')")
