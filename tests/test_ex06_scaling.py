"""Exercise 6 (DDP scaling benchmark): the solution and an independent one (tests/independent) score
full marks, the stub 0, and each classic measuring mistake fails with its own diagnosis, whatever the
file's import style; what the real run does (wrappers built, all-reduces and collectives per step) is
counted. The solution, the independent one and the mutants are graded together: one launch per world
size (1 and 2; the CLI also grades 4)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from autograder.checks import ex06_scaling as check
from autograder.diagnosis import translate
from autograder.runner import grade_one

from tests import independent
from tests.helpers import EXERCISES, SOLUTIONS, failed, mutant

FILE = check.EXERCISE.filename
MISTAKES = {
    "one rank's samples": {
        "return dist.get_world_size() * batch_size * iters / elapsed.item()":
            "return batch_size * iters / elapsed.item()"},
    "warm-up timed": {
        "    for _ in range(warmup):\n": "    start = time.perf_counter()\n    for _ in range(warmup):\n",
        "    start = time.perf_counter()\n    for _ in range(iters):": "    for _ in range(iters):"},
    "no barrier": {"dist.barrier()": "None"},
    # two independent mistakes: a step without DDP, and each rank returning its own clock's figure
    "no DDP, own figure per rank": {
        "ddp = DDP(model, device_ids=[device.index] if device.type == \"cuda\" else None)": "ddp = model",
        "dist.broadcast(elapsed, src=0)": "None"},
    # two more: the warm-up steps' samples counted (not timed), and the speed-up returned as the efficiency
    "warm-up samples, speed-up": {
        "return dist.get_world_size() * batch_size * iters / elapsed.item()":
            "return dist.get_world_size() * batch_size * (warmup + iters) / elapsed.item()",
        "return {w: t / (w * base) for w, t in sorted(throughput.items())}":
            "return {w: t / base for w, t in sorted(throughput.items())}"},
    # and two more: the clocks all-reduced with the default SUM, and the forward on the inner module
    "summed clocks, inner forward": {"dist.broadcast(elapsed, src=0)": "dist.all_reduce(elapsed)",
                                     "ddp(x), y)": "ddp.module(x), y)"},
    "CPU clock": {"start = time.perf_counter()": "start = time.process_time()",
                  "time.perf_counter() - start": "time.process_time() - start"},
    # The ranks arrive at the timed steps at different times: no barrier before the clock starts (and a
    # barrier of its own in every real step, which the real run counts).
    "no start barrier, barrier per step": {
        "    dist.barrier()                    # nobody starts the clock before everyone is warm\n": "",
        "        opt.step()\n": "        opt.step()\n        dist.barrier()\n"},
    # Two independent mistakes: the clock stopped without a barrier, in a file naming its clock and barrier by
    # name (the spies see them: the cause is named from the reads), and a DDP wrapper rebuilt in every step.
    "from-imports no end barrier, wrapper per step": {
        "import time\n": "from time import perf_counter\n",
        "import torch.distributed as dist\n":
            "import torch.distributed as dist\nfrom torch.distributed import barrier\n",
        "time.perf_counter()": "perf_counter()",
        "    dist.barrier()                    # ... on every rank, the slowest included\n": "",
        "    dist.barrier()                    # nobody": "    barrier()                    # nobody",
        "    def step() -> None:\n": "    def step() -> None:\n        ddp = DDP(model, device_ids=None)\n"},
}
REAL_FEW_STEPS = dict(warmup=2, iters=5)  # the real benchmark's steps in the tests (a learner's: REAL)
METHOD = "[W={}] throughput within 10% of the truth"
REAL = "the real run: one DDP wrapper, one all-reduce per step, the steps after the warm-up timed"
NOT_CHECKED = "not checked: needs 'the real step trains with DDP' first"


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    paths = [SOLUTIONS / FILE]
    for i, repl in enumerate(MISTAKES.values()):
        paths.append(mutant(tmp_path_factory.mktemp(f"m{i}"), FILE, repl))
    paths.append(independent.path(6))
    out = tmp_path_factory.mktemp("results")
    reports = check.grade(paths, world_sizes=(1, 2), out_dir=out, real=REAL_FEW_STEPS)
    independent.record(6, reports[-1])
    return {"solution": reports[0], **dict(zip(MISTAKES, reports[1:-1])), "independent": reports[-1]}, out


@pytest.mark.slow
def test_solution_full_marks_and_real_figures(graded):
    reports, out = graded
    r = reports["solution"]
    assert r.score == r.max_score, r.feedback
    assert "7 steps, one wrapper and one gradient all-reduce per step at 1, 2 worker(s)" in r.feedback
    # A ratio of timings, but not of the machine's speed: the truth is computed from the very step
    # times the ranks recorded, so only the barriers' latency separates a correct figure from it
    # (0.989-0.998 measured on 2 cores at load 5.5, against a 10% tolerance). The mistakes are off
    # by factors (1/W, the 2 warm-up steps, rank 0's 2/3 of the window), not by percent.
    for w in (1, 2):
        assert abs(r.measurements[f"W{w}_synthetic_reported_over_truth"] - 1) <= check.TOL
    doc = json.loads((out / "submission0" / "scaling.json").read_text())
    assert set(doc["throughput"]) == {"1", "2"} and doc["efficiency"]["1"] == pytest.approx(1.0)
    assert "samples/s" in r.feedback and "scaling.png" in r.feedback


def test_without_out_dir_nothing_is_left_in_tmp(tmp_path, monkeypatch):
    """The grader's temporary folder is removed once the files are read back, and the feedback says
    so (no launch: a fake one writes what the learner's write_results would, and observes rank 0)."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    written = []

    def fake_launch(rank_main, paths, *, world, timeout, args):
        so_far, out_dirs, final, real = args
        out = Path(out_dirs[0])
        out.mkdir()  # inside the grader's folder, which exists while the launch runs
        (out / "scaling.json").write_text(json.dumps({"throughput": {"1": 100.0}, "efficiency": {"1": 1.0}}))
        (out / "scaling.png").write_bytes(b"\x89PNG\r\n\x1a\n")
        written.append(out)
        rank0 = {"rank": 0, "backend": "gloo", "reported": 1.0, "real": 100.0, "step_error": None,
                 "times": torch.arange(20, dtype=torch.float64).reshape(10, 2), "initial": {}, "final": {},
                 "throughput": {1: 100.0}, "efficiency": {1: 1.0},
                 "files": {"json": str(out / "scaling.json"), "plot": str(out / "scaling.png")}}
        return [[rank0]], 0.0

    monkeypatch.setattr(check, "launch_files", fake_launch)
    (report,) = check.grade([SOLUTIONS / FILE], world_sizes=(1,))
    assert "JSON result and plot written" not in failed(report)
    assert "in a temporary folder the grader removed after reading it back" in report.feedback
    assert written[0].parent.parent == tmp_path and list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_counting_one_rank_fails_at_two_workers(graded):
    f = failed(graded[0]["one rank's samples"])
    assert list(f) == [METHOD.format(2)]
    assert "you counted one rank's samples" in f[METHOD.format(2)]


@pytest.mark.slow
def test_timing_the_warmup_fails_at_every_size(graded):
    f = failed(graded[0]["warm-up timed"])
    assert set(f) == {METHOD.format(1), METHOD.format(2)}
    assert "includes the 2 slow warm-up steps" in f[METHOD.format(1)]


@pytest.mark.slow
def test_no_barrier_times_rank_zero_alone(graded):
    f = failed(graded[0]["no barrier"])
    assert list(f) == [METHOD.format(2)]
    assert "that is rank 0's own time" in f[METHOD.format(2)]
    assert "dist.barrier()" in f[METHOD.format(2)]


@pytest.mark.slow
def test_step_without_ddp_leaves_ranks_apart(graded):
    f = failed(graded[0]["no DDP, own figure per rank"])
    assert set(f) == {"the real step trains with DDP", METHOD.format(2), REAL}
    assert f[REAL] == NOT_CHECKED
    assert "rank 1's parameters differ from rank 0's" in f["the real step trains with DDP"]
    assert "no DistributedDataParallel was made" in f["the real step trains with DDP"]


@pytest.mark.slow
def test_a_figure_per_rank_fails_the_same_figure_clause(graded):
    f = failed(graded[0]["no DDP, own figure per rank"])
    assert "return the same figure on every rank" in f[METHOD.format(2)]
    assert "rank 1 returned" in f[METHOD.format(2)]


@pytest.mark.slow
def test_counting_the_warmup_samples_and_the_speedup_are_named(graded):
    f = failed(graded[0]["warm-up samples, speed-up"])
    assert set(f) == {METHOD.format(1), METHOD.format(2), "scaling efficiency against linear"}
    for w in (1, 2):
        assert "that is (2 + 8) / 8: you counted the samples of the 2 warm-up steps too" in f[METHOD.format(w)]
    assert "the speed-up throughput[2] / throughput[1]" in f["scaling efficiency against linear"]


@pytest.mark.slow
def test_summed_clocks_and_the_inner_forward_are_named_not_their_lookalikes(graded):
    f = failed(graded[0]["summed clocks, inner forward"])
    assert set(f) == {METHOD.format(2), "the real step trains with DDP", REAL}
    assert f[REAL] == NOT_CHECKED  # one mistake, one message
    assert "all-reduced the elapsed time with SUM" in f[METHOD.format(2)]
    assert "counted one rank's samples" not in f[METHOD.format(2)]  # the same 1/W ratio, another cause
    ddp = f["the real step trains with DDP"]
    assert "wrapped in DistributedDataParallel, but no forward went through the wrapper" in ddp
    assert "wrap the model" not in ddp  # it was wrapped


@pytest.mark.slow
def test_cpu_time_is_named(graded):
    f = failed(graded[0]["CPU clock"])
    assert set(f) == {METHOD.format(1), METHOD.format(2)}
    assert "you timed with time.process_time()" in f[METHOD.format(1)]


@pytest.mark.slow
def test_a_clock_started_before_the_late_rank_arrived_is_named(graded):
    f = failed(graded[0]["no start barrier, barrier per step"])
    assert {METHOD.format(2), REAL} <= set(f) and "the real step trains with DDP" not in f
    assert "rank 0 started the clock when its own warm-up ended" in f[METHOD.format(2)]
    assert "before rank 1 finished its warm-up" in f[METHOD.format(2)]
    assert "dist.barrier() after the warm-up" in f[METHOD.format(2)]


@pytest.mark.slow
def test_a_collective_in_every_real_step_is_counted(graded):
    real = failed(graded[0]["no start barrier, barrier per step"])[REAL]
    assert real.startswith("at 1 worker(s) step() itself called dist.barrier (7 calls in 7 steps)"), real


@pytest.mark.slow
def test_a_wrapper_rebuilt_in_every_step_is_named_from_the_real_run(graded):
    f = failed(graded[0]["from-imports no end barrier, wrapper per step"])
    assert REAL in f and "the real step trains with DDP" not in f  # its training is right
    assert f[REAL].startswith("at 1 worker(s) step() built a new DistributedDataParallel in 7 of its 7 calls")
    assert "Build the wrapper and the optimizer once, in make_ddp_step" in f[REAL]


@pytest.mark.slow
def test_names_bound_by_from_imports_are_seen(graded):
    f = failed(graded[0]["from-imports no end barrier, wrapper per step"])
    assert "rank 0 read the clock after its last step with no barrier in between" in f[METHOD.format(2)]


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
        assert sum(check.launch_timeouts(sizes).values()) <= check.EXERCISE.time_limit - 10


def test_stub_is_not_implemented():
    r = grade_one(check.EXERCISE, EXERCISES)
    assert r.score == 0 and "not implemented yet" in r.feedback, r.feedback


def test_every_criterion_has_three_tiers_of_hints():
    from autograder.checks import ex06_scaling as package
    from autograder.checks.ex06_scaling.hints import HINTS
    assert set(HINTS) == {c.__name__ for c in package.METHOD_CRITERIA + package.CRITERIA}
    assert all(len(tiers) == 3 and all(tiers) for tiers in HINTS.values())
