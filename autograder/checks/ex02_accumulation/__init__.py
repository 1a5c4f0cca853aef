"""Exercise 2 check: gradient accumulation under DDP equals one larger batch (world size 2, and 4 for tokens).

Four scenarios run in one launch, each from the same initial weights:
equal micro-batches (k=4, 3 windows), unequal micro-batches (k=3), a
final window shorter than k, and padded sequences whose token counts differ
between micro-batches and between ranks (k=2): there the reference is one
process's mean cross-entropy over every non-padding token of the window's
global batch, which needs the window's token count summed over the ranks
(the accumulation bug of 2024, where libraries averaged per-micro-batch
means: Hugging Face, "Fixing Gradient Accumulation", Oct 2024). Inside the ranks the grader only observes:
an optimizer that records the gradients it is asked to step with, a forward
pre-hook that counts micro-steps, snapshots the gradients in the middle of a
window and sees whether ``.grad`` is zero when a window starts, spies on
``zero_grad`` (the optimizer's and the model's), and a DDP communication hook
that counts all-reduces (DDP's reducer runs in C++, so wrapping
``dist.all_reduce`` would see nothing). The grader recomputes every window's
gradient and the parameters from a single process on the concatenated global
batch (CS336-style parity), and requires the ranks' gradients to *differ*
mid-window (the negative check of huggingface/accelerate's ``test_sync.py``). Each scenario is kept as it
returns: one whose run ends the launch (an error, a hang) costs its own criteria only (``grader.parts``).
A second launch, at world size 4, runs the padded sequences again (the scenario whose loss needs the world size
to undo DDP's average), its ranks told by torchrun's variables that they run on 2 nodes of 2 (LOCAL_WORLD_SIZE=2):
a world size hard-coded, or taken from one node's processes, is right at 2 ranks and wrong there.
A failure names the first cause below that explains the observations:

| mistake | message |
|---|---|
| zero_grad inside a window | "optimizer.zero_grad() ran in the middle of a window (after micro-step 1 of 4) ..." |
| the world size taken from torch.cuda.device_count() | "...: your code called torch.cuda.device_count() ..." |
| gradients left in .grad when it returns: zero_grad at a window's start | "optimizer.zero_grad() ran at the ..." |
| zero_grad between the last backward and step | "... so 3 of 3 steps saw all-zero gradients ..." |
| optimizer.step() every micro-step | "optimizer.step() ran 12 times for 12 micro-batches ..." |
| optimizer.step() missing or misplaced | "... ran after [4, 4] micro-batches; the windows have [4, 4, 2] ..." |
| gradients never zeroed between windows | "at the start of window 1 the gradients still held the previous ..." |
| no backward: the gradients stay zero | "at all 3 optimizer steps the gradients were zero on rank 0 ..." |
| every micro-step inside no_sync | "DDP never all-reduced the gradients of window 0 (0 all-reduce rounds ..." |
| no_sync on the wrong micro-steps: DDP synced inside the window | "in window 0 DDP all-reduced ... [1] ..." |
| no_sync on the wrong micro-steps: the window's last one not synced | (the same words) |
| loss not divided | "the gradient of window 0 (...) is the micro-batch gradients not divided, not the mean ..." |
| loss divided by accumulation_steps | "... divided by accumulation_steps=4, not the mean over its N=32 samples ..." |
| micro-batches weighted equally | "... divided by the 3 micro-batches (equal weights), not the mean ..." |
| per-micro-batch token means averaged | "... (equal weights), not the mean over its N=29 tokens ...: averaging ..." |
| local token count not all-reduced | "... normalised by each rank's own token count, not the mean ..." |
| local count not all-reduced, times the world size | "... own count and multiplied by the world size ..." |
| padding tokens counted | "... normalised with padding included (64 labels), not the mean over its N=29 ..." |
| a world size other than the launch's | "at 4 ranks on 2 nodes of 2, rank 0's gradient ... was 2/4 of the ..." |
| loss divided by the world size on top of DDP's average | "... averaged by DDP over 2 ranks (1/2 of the mean) ..." |
| no_sync called on model.module | "no_sync() is a method of the DistributedDataParallel wrapper ..." (raised) |
| the window's summed loss back-propagated every micro-step | "backward() ran twice through the same graph" (raised) |
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ...grader.diagnosis import diagnose
from ...grader.parity import parity
from ...grader.launches import each_world_size, launch_timeout, side_by_side
from ...grader.parts import judge_parts, launch_parts
from ...grader.registry import Exercise
from ...grader.report import ExerciseReport, Verdict, criterion, failed, passed
from .causes import (KNOWN_ERRORS, close, divided_by_k, equal_weights, first_wrong, grads_left, last_not_synced,
                     local_count,
                     local_count_times_world, mean_of_means,
                     never_synced, never_zeroed, no_backward, not_divided, over_world, padding_counted, world_from_gpus,
                     step_every_micro_step, step_misplaced, window_in_words, zero_grad_before_step,
                     synced_mid_window, wrong_world, zero_grad_mid_window)
from .observations import RankObservation, Run, Scenario, ScenarioObservation
from .probes import rank_main
from .reference import WORLD, reference
from .scenarios import NODES, SCENARIOS, windows

__all__ = ["CRITERIA", "EXERCISE", "KNOWN_ERRORS", "grade"]

EXERCISE = Exercise(number=2, name="accumulation", filename="ex02_accumulation.py", max_score=10, time_limit=90)

# Most specific first: a broken schedule explains wrong gradients, not the other way round.
SCHEDULE = [zero_grad_mid_window, zero_grad_before_step, step_every_micro_step, step_misplaced, never_zeroed]
CAUSES = SCHEDULE + [no_backward, never_synced, not_divided, mean_of_means, divided_by_k, equal_weights,
                     world_from_gpus, over_world, local_count, local_count_times_world, padding_counted,
                     last_not_synced]


def _first_wrong_step(s: Scenario) -> str:
    """The symptom when no cause explains it: which step's gradient is off, by how much."""
    if (first := first_wrong(s)) is None:
        return ""
    w, diff = first
    what, n = window_in_words(s, w)
    total = f"{n} non-padding tokens on all ranks" if s.name == "tokens" else f"{n} global samples"
    return (f"the gradient at optimizer step {w} ({what}) differs from one batch of the window's {total} (max abs "
            f"difference {diff:.3g})")


def _parameters_match(s: Scenario, causes: list = CAUSES) -> Verdict:
    """Rank 0's final parameters against the big-batch run's (the criterion of every scenario)."""
    ok, diff = close(s.obs.final, reference(s.name, s.world))
    why = diagnose(causes, s) or _first_wrong_step(s)  # the most specific reason ("" if none found)
    measured = {f"{'' if s.world == WORLD else f'W{s.world}_'}{s.name}_max_abs_diff_vs_reference": diff}
    if ok and not why:
        return passed(f"max abs difference {diff:.2g}", **measured)
    rank_diff = parity(s.ranks[1].final, s.obs.final).max_abs_diff
    return failed(why or (f"rank 0's parameters differ from the big-batch run (max abs difference {diff:.3g}, "
                            f"rank 1 differs from rank 0 by {rank_diff:.3g})"), **measured)


# The criteria's names quote their scenario.
EQUAL_SIZES, K = SCENARIOS["equal"]
EQUAL = f"[equal sizes, k={K}]"
UNEQUAL_SIZES, UNEQUAL_K = SCENARIOS["unequal"]
SHORT_SIZES, SHORT_K = SCENARIOS["short"]
_, TOKENS_K = SCENARIOS["tokens"]


@criterion(f"{EQUAL} gradient after {K} micro-batches equals one {K}x larger batch", points=2)
def first_window_gradient(run: Run) -> Verdict:
    s = run.scenarios["equal"]
    first_ok = bool(s.obs.steps) and close(s.obs.steps[0].grads, s.references[0]["big"])[0]
    if first_ok and s.micro[0] == K:
        return passed()
    first_window = [c for c in CAUSES if c is not never_zeroed]  # stale gradients start in window 1
    return failed(diagnose(first_window, s) or _first_wrong_step(s) or (
        f"the first optimizer step came after {s.micro[0]} micro-batches, not {K}" if s.micro else
        f"no optimizer step ran in the whole run ({len(EQUAL_SIZES)} micro-batches): step once every {K}"))


@criterion(f"{EQUAL} parameters after {len(windows(len(EQUAL_SIZES), K))} optimizer steps equal "
           "the big-batch run", points=2)
def equal_parameters(run: Run) -> Verdict:
    return _parameters_match(run.scenarios["equal"])


@criterion(f"{EQUAL} one optimizer step and zero_grad per window", points=1)
def step_per_window(run: Run) -> Verdict:
    # Passes only on what was seen: a step after every K micro-steps, and .grad zero at every later window's start.
    s = run.scenarios["equal"]
    cleared = s.obs.start_cleared
    if s.micro == s.expected_micro and cleared == [True] * (s.n_windows - 1) and not diagnose(SCHEDULE, s) and \
            s.obs.end_cleared:
        return passed(f"zero_grad() ran {len(s.obs.zero_grads)} times in {s.n_windows} windows")
    return failed(diagnose(SCHEDULE + [grads_left], s) or f"optimizer.step() ran after {s.micro} micro-batches; "
                  f"expected {s.expected_micro}, with the gradients zeroed at the start of every window")


@criterion(f"{EQUAL} gradients all-reduced once per window", points=1)
def allreduce_per_window(run: Run) -> Verdict:
    s = run.scenarios["equal"]
    if s.window_rounds == [1] * s.n_windows:
        return passed()
    if any(r > 1 for r in s.window_rounds):
        return failed(f"DDP all-reduced the gradients {s.window_rounds} times per window of {K} micro-steps (counted "
                      f"with a comm hook); expected once: run the first {K - 1} micro-steps of each window (forward "
                      "and backward) inside `with model.no_sync():`")
    return failed(diagnose([no_backward, never_synced], s) or f"DDP all-reduced {s.window_rounds} times per window; "
                  "expected once, on the last micro-batch of each window (outside no_sync)")


@criterion(f"{EQUAL} ranks' gradients still differ inside a window", points=1)
def differ_inside_window(run: Run) -> Verdict:
    # The negative check: identical gradients mid-window mean DDP already averaged them (no no_sync).
    mid0, mid1 = (r.mid_grads for r in run.scenarios["equal"].ranks)
    if mid0 is None or mid1 is None:
        return failed(diagnose(SCHEDULE, run.scenarios["equal"]) or "no micro-step ever followed another within a "
                      "window: accumulate over several micro-batches")
    gap = parity(mid0, mid1).max_abs_diff
    if gap > 1e-6:
        return passed(f"max abs difference between ranks {gap:.2g}")
    # why they are equal: zeroed there (both all zero), or synced there (the comm hook's count says when)
    return failed(diagnose([*SCHEDULE, synced_mid_window], run.scenarios["equal"]) or
                  "on a micro-step that does not end a window the two ranks already had identical gradients: use "
                  "model.no_sync() until the last micro-batch of the window")


@criterion(f"[unequal sizes {UNEQUAL_SIZES}, k={UNEQUAL_K}] parameters equal the big-batch run", points=1.5)
def unequal_parameters(run: Run) -> Verdict:
    return _parameters_match(run.scenarios["unequal"])


@criterion(f"[{len(SHORT_SIZES)} micro-batches, k={SHORT_K}] the final short window steps, normalised over "
           "its own samples", points=1.5)
def short_window_parameters(run: Run) -> Verdict:
    return _parameters_match(run.scenarios["short"])


@criterion(f"[padded sequences, token counts differ by micro-batch and rank, k={TOKENS_K}] parameters equal "
           "one process's token mean over the global batch", points=2)
def token_parameters(run: Run) -> Verdict:
    return _parameters_match(run.scenarios["tokens"])


FOUR = 4  # the second world size: the padded sequences alone, on NODES[FOUR] nodes
UNNAMED_WORLD = WORLD  # the criteria whose names give no world size judge the first launch's (grader.divergence)


@criterion(f"[W={FOUR}] padded sequences at {FOUR} ranks on {NODES[FOUR]} nodes: parameters equal one process's "
           "token mean over the global batch", points=2)
def four_rank_token_parameters(run: Run) -> Verdict:
    return _parameters_match(run.scenarios["tokens"], CAUSES + [wrong_world])


CRITERIA = [first_window_gradient, equal_parameters, step_per_window, allreduce_per_window, differ_inside_window,
            unequal_parameters, short_window_parameters, token_parameters, four_rank_token_parameters]


# Each scenario's criteria (CRITERIA's order), and how its feedback names the run that ended its launch.
BY_SCENARIO = {"equal": ("train_accumulated on equal micro-batches", CRITERIA[:5]),
               "unequal": ("train_accumulated on unequal micro-batches", CRITERIA[5:6]),
               "short": ("train_accumulated on a short final window", CRITERIA[6:7]),
               "tokens": ("train_accumulated on padded sequences", CRITERIA[7:8])}
# world size -> the scenarios its launch runs, and how each scenario's feedback names the run that ended it
LAUNCHES = {WORLD: BY_SCENARIO,
            FOUR: {"tokens": (f"train_accumulated on padded sequences at {FOUR} ranks", CRITERIA[8:])}}


def grade(paths: Sequence[Path]) -> list[ExerciseReport]:
    """Grade the files at ``paths`` in one launch at world size 2 (every scenario) and one at 4 (the padded
    sequences), one more for each scenario that ends one (``grader.parts``); one report each.

    On the CPU the two launches run side by side (as exercise 4's: most of a launch is its ranks waiting on
    each other and on process starts), each within ``EXERCISE.time_limit``, so a hang is reported as a
    ``LaunchTimeout`` naming the ranks that never finished rather than killed by the outer limit. On a GPU
    machine one after the other, each its share of the time.
    """
    reports = [EXERCISE.new_report() for _ in paths]
    together = side_by_side()

    def launch(world: int) -> tuple[list, float | None]:
        share = None if together else (0.6 if world == WORLD else 0.4)
        return launch_parts(rank_main, paths, world=world, parts=list(LAUNCHES[world]), args=(list(LAUNCHES[world]),),
                            timeout=launch_timeout(EXERCISE, files=len(paths), share=share), known=KNOWN_ERRORS)

    empty = ScenarioObservation().to_wire()  # a scenario that ended its launch: not judged
    for world, (parted, wall_s) in each_world_size(launch, list(LAUNCHES)):
        by_scenario = LAUNCHES[world]
        for report, file in zip(reports, parted):
            run = Run([RankObservation.from_wire({"scenarios": {n: r[n] if n not in file.ended else empty
                                                                for n in by_scenario}}) for r in file.ranks])
            judge_parts(report, by_scenario, file.ended, run)
            if wall_s is not None:
                report.measurements["launch_s" if world == WORLD else f"W{world}_launch_s"] = round(wall_s, 2)
    return [r.scale_to() for r in reports]
