"""Exercise 4 (FSDP2): the solution scores full marks, the stub zero, and the usual mistakes
(only the root wrapped, optimizer built before sharding, state dict saved on every rank or on
none) are each named with their numbers. The solution and both mutants are graded in ONE launch
at world size 2 (the CLI grades 2 and 4); the stub in one more, through the grading subprocess's
code (run_one.main, here in-process: the subprocess around it is exercise 1's CLI tests')."""
from __future__ import annotations

import json

import pytest

from autograder import run_one
from autograder.checks import ex04_fsdp
from autograder.report import ExerciseReport
from distlab.fsdp_memory import expected_bytes, full_shapes, memory_per_gpu, shard_rows
from distlab.resmlp import make_resmlp
from tests.helpers import EXERCISES, SOLUTIONS, failed, mutant


def test_padded_shard_arithmetic():
    # 10 rows over 4 ranks: chunks of 3, the last rank has 1 real row and stores 3.
    assert [shard_rows(10, 4, r) for r in range(4)] == [(3, 3), (3, 3), (3, 3), (1, 3)]
    exp = expected_bytes({"w": (10, 5)}, world=4, rank=3)
    assert exp == {"params": 60, "grads": 60, "optimizer": 2 * 20 + 4, "padding": 40}


def test_calculator_gives_the_overview_figures():
    # 7B parameters, fp32 + Adam = 16 B each: 112 GB on one GPU, 14 GB each on 8 with full sharding.
    assert memory_per_gpu(7e9, 4, "adam", 1, "none")["total"] == 112e9
    assert memory_per_gpu(7e9, 4, "adam", 8, "full")["total"] == 14e9
    assert memory_per_gpu(7e9, 4, "adam", 8, "optimizer")["total"] == 7e9 * (4 + 4 + 8 / 8)


MISTAKES = {
    "    for block in model.blocks:\n        fully_shard(block)": "    for block in []:\n        fully_shard(block)",
    "    model = shard(model)\n    optimizer = make_optimizer(model, lr)":
        "    optimizer = make_optimizer(model, lr)\n    model = shard(model)",
    "    if dist.get_rank() != 0:\n        return None\n    torch.save(state, path)": "    torch.save(state, path)",
}
NO_SAVE = {"    torch.save(state, path)\n    return state": "    return state"}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """(solution, mutant with three mistakes, mutant that never saves), graded in one launch at W=2."""
    paths = [SOLUTIONS / "ex04_fsdp.py", mutant(tmp_path_factory.mktemp("mistakes"), "ex04_fsdp.py", MISTAKES),
             mutant(tmp_path_factory.mktemp("nosave"), "ex04_fsdp.py", NO_SAVE)]
    return ex04_fsdp.grade(paths, world_sizes=(2,))


def test_solution_full_marks_with_exact_bytes_and_peak_under_bound(graded):
    report = graded[0]
    assert report.score == report.max_score, report.feedback
    m = report.measurements
    assert m["W2_max_abs_diff_vs_reference"] < 1e-3
    shapes = full_shapes(make_resmlp(seed=0, **ex04_fsdp.MODEL))
    for r in (0, 1):
        assert 0 < m[f"W2_rank{r}_peak_bytes"] <= m[f"W2_rank{r}_peak_bound_bytes"]
        exp = expected_bytes(shapes, 2, r)
        assert [m[f"W2_rank{r}_{part}_bytes"] for part in ("params", "grads", "optimizer")] == \
            [exp["params"], exp["grads"], exp["optimizer"]]
    assert "rank 0 holds 2145104 B of params+grads+Adam state (expected 2145104 B" in report.feedback


@pytest.mark.slow
def test_stub_scores_zero_not_implemented(tmp_path):
    out = tmp_path / "report.json"
    assert run_one.main(["4", str(EXERCISES / "ex04_fsdp.py"), str(out)]) == 0
    report = ExerciseReport.from_dict(json.loads(out.read_text()))
    assert report.score == 0 and not report.ran
    assert "not implemented yet (ex04_fsdp.py line" in report.feedback


def test_root_only_optimizer_first_and_every_rank_saving_are_named(graded):
    fails = failed(graded[1])
    assert "[W=2] parameters are DTensors sharded on dim 0" not in fails  # root-only still shards
    peak = fails["[W=2] peak memory within the per-block bound"]
    assert peak.startswith("only the root is wrapped (0 of 8 blocks are fully_shard units)")
    assert "MiB (live tensor storage) on rank" in peak and "Call fully_shard on each block" in peak
    opt = fails["[W=2] optimizer built after sharding"]
    assert "the optimizer does not hold 36 of the model's 36 parameters" in opt
    assert "Build the optimizer after shard(model)" in opt
    held = fails["[W=2] each rank holds 1/2 of params, grads and Adam state"]
    assert "optimizer: expected 1072624 B, measured 0 B" in held
    assert "max abs difference" in fails["[W=2] matches single-process training"]
    assert fails["[W=2] rank 0 exports the full state dict once"].startswith(
        "torch.save was called on ranks [0, 1]")


def test_saving_nothing_names_the_path(graded):
    fails = failed(graded[2])
    assert list(fails) == ["[W=2] rank 0 exports the full state dict once"]
    assert fails["[W=2] rank 0 exports the full state dict once"].startswith("nothing was saved to /")
    assert "full_state-2.pt: torch.save the full state dict to export_path on rank 0" in \
        fails["[W=2] rank 0 exports the full state dict once"]
