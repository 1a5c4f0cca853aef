"""Exercise 2 check: gradient accumulation under DDP equals one larger batch (world size 2).

Three scenarios run in one launch, each from the same initial weights:
equal micro-batches (k=4, 3 windows), unequal micro-batches (k=3), and a
final window shorter than k. Inside the ranks the grader only observes:
an optimizer that records the gradients it is asked to step with, a forward
pre-hook that counts micro-steps and snapshots the gradients in the middle
of a window, and a DDP communication hook that counts all-reduces (DDP's
reducer runs in C++, so wrapping ``dist.all_reduce`` would see nothing).
The grader recomputes every window's gradient and the parameters from a
single process on the concatenated global batch (CS336-style parity), and
requires the ranks' gradients to *differ* mid-window (the negative check of
huggingface/accelerate's ``test_sync.py``).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
from torch import nn

from distlab.models import cpu_state, make_mlp

from ..grading import launch_files, launch_timeout
from ..parity import parity
from ..registry import Exercise
from ..report import ExerciseReport, Verdict, criterion, failed, passed
# The scenarios and data are shared with the rank-side instruments, which define them.
from ._ex02_probes import LR, MODEL, SCENARIOS, micro_batches, rank_main

EXERCISE = Exercise(number=2, name="accumulation", filename="ex02_accumulation.py", max_score=10, time_limit=90)
WORLD = 2
RTOL, ATOL = 1e-4, 1e-6  # DDP averages per-rank sums: another order than one big mean


def windows(n: int, k: int) -> list[range]:
    return [range(s, min(s + k, n)) for s in range(0, n, k)]


def _grad(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict:
    model.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@functools.lru_cache(maxsize=None)  # one per scenario, shared by every file graded in this process
def reference(scenario: str) -> tuple[list[dict], dict]:
    """Single process on the global batches: per window, the big-batch gradient ``"big"`` and the
    usual wrong answers at the same weights (for feedback); then SGD with the big-batch gradient."""
    sizes, k = SCENARIOS[scenario]
    model = make_mlp(seed=5, **MODEL)
    per_rank = [micro_batches(sizes, r, WORLD) for r in range(WORLD)]
    out = []
    for win in windows(len(sizes), k):
        cat = lambda i, part: torch.cat([per_rank[r][j][part] for j in i for r in range(WORLD)])  # noqa: E731
        big = _grad(model, cat(win, 0), cat(win, 1))
        micro = [_grad(model, cat([i], 0), cat([i], 1)) for i in win]
        total = {n: sum(g[n] for g in micro) for n in big}
        out.append({
            "big": big,
            "not divided": total,
            f"divided by accumulation_steps={k}": {n: t / k for n, t in total.items()},
            f"divided by the {len(win)} micro-batches (equal weights)": {n: t / len(win) for n, t in total.items()},
        })
        with torch.no_grad():
            for n, p in model.named_parameters():
                p -= LR * big[n]
    return out, cpu_state(model)


def _close(a: dict, b: dict) -> tuple[bool, float]:
    p = parity(a, b, rtol=RTOL, atol=ATOL)
    return p.ok, p.max_abs_diff


ADVICE = {
    "not divided": "the loss was not divided; scale each micro-batch's mean loss by n_i / N",
    "divided by accumulation_steps": "scale each micro-batch's mean loss by n_i / N, its share of the "
                                     "window's samples, rather than dividing by accumulation_steps",
    "divided by the": "weight each micro-batch's mean loss by its share of the window's samples n_i / N",
}
SHORT_WINDOW_ADVICE = ("this window is shorter than accumulation_steps: normalise the final, shorter window "
                       "over its own samples (n_i / N), not by accumulation_steps")


def _schedule_fault(obs: dict, sizes: list[int], k: int) -> str:
    """Why the optimizer's schedule is off (a window cut by zero_grad, steps in the wrong places), or ""."""
    if obs["mid_zero_grad"]:
        return (f"optimizer.zero_grad() ran in the middle of a window (after micro-step "
                f"{obs['mid_zero_grad'][0]} of {k}), throwing away the gradients accumulated so far: "
                "zero the gradients only after optimizer.step(), once per window")
    micro = [s["micro"] for s in obs["steps"]]
    expected = [len(w) for w in windows(len(sizes), k)]
    if micro == expected:
        return ""
    if len(micro) > len(expected):
        return (f"optimizer.step() ran {len(micro)} times for {len(sizes)} micro-batches with "
                f"accumulation_steps={k}: step once per window of {k} micro-batches "
                f"({len(expected)} steps), not every micro-step")
    return (f"optimizer.step() ran after {micro} micro-batches; the windows have {expected}"
            + (" (the final, shorter window must still end with a step)" if len(micro) < len(expected) else ""))


def _gradient_fault(obs: dict, sizes: list[int], k: int, refs: list[dict]) -> str:
    """Which usual wrong normalisation the first wrong window's gradient is, or how far it is off ("")."""
    wins = windows(len(sizes), k)
    for w, (step, ref) in enumerate(zip(obs["steps"], refs)):
        ok, diff = _close(step["grads"], ref["big"])
        if ok:
            continue
        n = sum(sizes[i] for i in wins[w])
        what = f"window {w} ({[sizes[i] for i in wins[w]]} samples per micro-batch on each rank)"
        for wrong, grads in list(ref.items())[1:]:
            if _close(step["grads"], grads)[0]:
                advice = next(v for key, v in ADVICE.items() if wrong.startswith(key))
                if wrong.startswith("divided by accumulation_steps") and len(wins[w]) != k:
                    advice = SHORT_WINDOW_ADVICE
                return (f"the gradient of {what} is the micro-batch gradients {wrong}, not the mean over "
                        f"its N={n} samples (max abs difference {diff:.3g}): {advice}")
        return (f"the gradient at optimizer step {w} differs from one batch of the window's {WORLD * n} "
                f"global samples (max abs difference {diff:.3g})")
    return ""


@dataclass
class Scenario:
    """One scenario of one file: rank 0's and rank 1's observations, and the single-process reference."""

    name: str
    ranks: list[dict]

    @property
    def obs(self) -> dict:  # rank 0's: DDP leaves both ranks with the same steps
        return self.ranks[0]

    @property
    def n_windows(self) -> int:
        sizes, k = SCENARIOS[self.name]
        return len(windows(len(sizes), k))

    @functools.cached_property
    def why(self) -> str:
        """The most specific reason the gradients or parameters are off ("" if none found)."""
        sizes, k = SCENARIOS[self.name]
        return _schedule_fault(self.obs, sizes, k) or _gradient_fault(self.obs, sizes, k, reference(self.name)[0])


@dataclass
class Run:
    """One file's run: every rank's observation, as one :class:`Scenario` per scenario."""

    ranks: list[dict]

    def __post_init__(self):
        self.scenarios = {name: Scenario(name, [r[name] for r in self.ranks]) for name in SCENARIOS}


def _parameters_match(s: Scenario) -> Verdict:
    """Rank 0's final parameters against the big-batch run's (the criterion of every scenario)."""
    ok, diff = _close(s.obs["final"], reference(s.name)[1])
    measured = {f"{s.name}_max_abs_diff_vs_reference": diff}
    if ok and not s.why:
        return passed(f"max abs difference {diff:.2g}", **measured)
    rank_diff = parity(s.ranks[1]["final"], s.obs["final"]).max_abs_diff
    return failed(s.why or (f"rank 0's parameters differ from the big-batch run (max abs difference {diff:.3g}, "
                            f"rank 1 differs from rank 0 by {rank_diff:.3g})"), **measured)


# The criteria's names quote their scenario.
EQUAL_SIZES, K = SCENARIOS["equal"]
EQUAL = f"[equal sizes, k={K}]"
UNEQUAL_SIZES, UNEQUAL_K = SCENARIOS["unequal"]
SHORT_SIZES, SHORT_K = SCENARIOS["short"]


@criterion(f"{EQUAL} gradient after {K} micro-batches equals one {K}x larger batch", points=2)
def first_window_gradient(run: Run) -> Verdict:
    s = run.scenarios["equal"]
    first_ok = bool(s.obs["steps"]) and _close(s.obs["steps"][0]["grads"], reference("equal")[0][0]["big"])[0]
    return passed() if first_ok and not s.why else failed(s.why or "the gradient at the first optimizer step differs")


@criterion(f"{EQUAL} parameters after {len(windows(len(EQUAL_SIZES), K))} optimizer steps equal "
           "the big-batch run", points=2)
def equal_parameters(run: Run) -> Verdict:
    return _parameters_match(run.scenarios["equal"])


@criterion(f"{EQUAL} one optimizer step and zero_grad per window", points=1)
def step_per_window(run: Run) -> Verdict:
    s = run.scenarios["equal"]
    micro = [step["micro"] for step in s.obs["steps"]]
    if micro == [K] * s.n_windows and not s.obs["mid_zero_grad"]:
        return passed()
    return failed(s.why or f"optimizer.step() ran after {micro} micro-batches; expected {[K] * s.n_windows}")


@criterion(f"{EQUAL} gradients all-reduced once per optimizer step", points=1)
def allreduce_per_step(run: Run) -> Verdict:
    s = run.scenarios["equal"]
    rounds = [step["rounds"] for step in s.obs["steps"]]
    if rounds == [1] * s.n_windows:
        return passed()
    if any(r > 1 for r in rounds):
        return failed(f"DDP all-reduced the gradients {rounds} times per optimizer step (counted with a comm "
                      f"hook); expected once: run the first {K - 1} micro-steps of each window (forward and "
                      "backward) inside `with model.no_sync():`")
    return failed(f"DDP all-reduced {rounds} times per optimizer step; expected once, on the last micro-batch "
                  "of each window (outside no_sync)")


@criterion(f"{EQUAL} ranks' gradients still differ inside a window", points=1)
def differ_inside_window(run: Run) -> Verdict:
    # The negative check: identical gradients mid-window mean DDP already averaged them (no no_sync).
    mid0, mid1 = (r["mid_grads"] for r in run.scenarios["equal"].ranks)
    if mid0 is None or mid1 is None:
        return failed("no micro-step ever followed another within a window: accumulate over several micro-batches")
    gap = parity(mid0, mid1).max_abs_diff
    if gap > 1e-6:
        return passed(f"max abs difference between ranks {gap:.2g}")
    return failed("on a micro-step that does not end a window the two ranks already had identical gradients: "
                  "DDP averaged them, which costs an all-reduce per micro-step; use model.no_sync() until the "
                  "last micro-batch of the window")


@criterion(f"[unequal sizes {UNEQUAL_SIZES}, k={UNEQUAL_K}] parameters equal the big-batch run", points=1.5)
def unequal_parameters(run: Run) -> Verdict:
    return _parameters_match(run.scenarios["unequal"])


@criterion(f"[{len(SHORT_SIZES)} micro-batches, k={SHORT_K}] the final short window steps, normalised over "
           "its own samples", points=1.5)
def short_window_parameters(run: Run) -> Verdict:
    return _parameters_match(run.scenarios["short"])


CRITERIA = [first_window_gradient, equal_parameters, step_per_window, allreduce_per_step, differ_inside_window,
            unequal_parameters, short_window_parameters]


def grade(paths: Sequence[Path]) -> list[ExerciseReport]:
    """Grade the files at ``paths`` in one launch at world size 2 (every scenario); one report each.

    For one file the launch's timeout fits inside ``EXERCISE.time_limit``, so a hang is reported as a
    ``LaunchTimeout`` naming the ranks that never finished rather than killed by the outer limit.
    """
    reports = [EXERCISE.new_report() for _ in paths]
    runs, wall_s = launch_files(rank_main, paths, world=WORLD, timeout=launch_timeout(EXERCISE, files=len(paths)))
    for report, ranks in zip(reports, runs):
        report.judge(CRITERIA, Run(ranks))
        report.measurements["launch_s"] = round(wall_s, 2)
    return [r.scale_to() for r in reports]
