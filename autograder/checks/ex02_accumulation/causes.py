"""Exercise 2's likely mistakes, tested against what the ranks observed (see autograder/grader/diagnosis.py).

``ex02_accumulation`` lists them in its docstring and asks for them, most specific first, when a criterion
fails; each tests one scenario's observations (:class:`~.observations.Scenario`).
"""
from __future__ import annotations

import torch

from ...grader.diagnosis import KnownError, mistake
from ...grader.parity import parity
from .observations import Scenario
from .probes import ATOL, RTOL
from .scenarios import NODES, TOKEN_LENGTHS, windows


KNOWN_ERRORS = [
    KnownError("no_sync called on model.module", r"has no attribute 'no_sync'",
               "no_sync() is a method of the DistributedDataParallel wrapper, not of the model inside it: "
               "call `with model.no_sync():` on the DDP model you were given"),
    KnownError("the window's summed loss back-propagated every micro-step",
               r"Trying to backward through the graph a second time",
               "backward() ran twice through the same graph: a loss summed over the window was back-propagated "
               "on every micro-step; call backward() on each micro-batch's scaled loss once, and keep a float "
               "(loss.item()) for the window's log"),
]


def close(a: dict, b: dict) -> tuple[bool, float]:
    """Whether ``a`` matches ``b`` within the grader's tolerance, and the largest absolute difference."""
    p = parity(a, b, rtol=RTOL, atol=ATOL)
    return p.ok, p.max_abs_diff


def _zero_grads(s: Scenario, mid: bool) -> list[tuple[int, int]]:
    """zero_grad() calls as (window, micro-steps done): inside a window (``mid``) or after its last backward."""
    return [(z.steps, z.micro) for z in s.obs.zero_grads
            if 0 < z.micro and z.steps < s.n_windows and (z.micro < s.expected_micro[z.steps]) == mid]


@mistake("zero_grad inside a window")
def zero_grad_mid_window(s: Scenario) -> str | None:
    if not (cut := _zero_grads(s, mid=True)):
        return None
    return (f"optimizer.zero_grad() ran in the middle of a window (after micro-step {cut[0][1]} of {s.k}), throwing "
            "away the gradients accumulated so far: zero the gradients only after optimizer.step(), once per window")


@mistake("gradients left in .grad when it returns: zero_grad at a window's start")
def grads_left(s: Scenario) -> str | None:
    if s.obs.end_cleared or not s.obs.steps:
        return None
    at_starts = [z.steps for z in s.obs.zero_grads if z.micro == 0] == list(range(s.n_windows))  # before step 1 too
    where = ("optimizer.zero_grad() ran at the start of each window, before its first forward, not after its step: "
             if at_starts and len(s.obs.zero_grads) == s.n_windows else "")
    return (f"{where}train_accumulated returned with the last window's gradients still in .grad, where the contract "
            "leaves them zero, as they were on entry: call optimizer.step(), then optimizer.zero_grad(), at the end "
            "of each window")


@mistake("zero_grad between the last backward and step")
def zero_grad_before_step(s: Scenario) -> str | None:
    zeroed = [step for step in s.obs.steps if not any(g.any() for g in step.grads.values())]
    if not (zeroed and _zero_grads(s, mid=False)):
        return None
    return (f"optimizer.zero_grad() ran after the window's last backward but before optimizer.step(), so "
            f"{len(zeroed)} of {len(s.obs.steps)} steps saw all-zero gradients and moved nothing: call "
            "optimizer.step() first, then optimizer.zero_grad()")


@mistake("optimizer.step() every micro-step")
def step_every_micro_step(s: Scenario) -> str | None:
    if len(s.micro) <= s.n_windows:
        return None
    return (f"optimizer.step() ran {len(s.micro)} times for {len(s.sizes)} micro-batches with accumulation_steps="
            f"{s.k}: step once per window of {s.k} micro-batches ({s.n_windows} steps), not every micro-step")


@mistake("optimizer.step() missing or misplaced")
def step_misplaced(s: Scenario) -> str | None:
    if s.micro == s.expected_micro:
        return None
    short = " (the final, shorter window must still end with a step)" if len(s.micro) < s.n_windows else ""
    return f"optimizer.step() ran after {s.micro} micro-batches; the windows have {s.expected_micro}{short}"


@mistake("gradients never zeroed between windows")
def never_zeroed(s: Scenario) -> str | None:
    if not (stale := [w + 1 for w, ok in enumerate(s.obs.start_cleared) if not ok]):
        return None
    return (f"at the start of window {stale[0]} the gradients still held the previous window's (zero_grad() ran "
            f"{len(s.obs.zero_grads)} times in {s.n_windows} windows), so it stepped with both windows' "
            "gradients: call optimizer.zero_grad() after every optimizer.step()")


def _no_gradient(s: Scenario) -> bool:
    """Whether every optimizer step found the gradients zero (or unset): no backward reached the parameters."""
    steps = s.obs.steps
    return bool(steps) and not any(g.any() for step in steps for g in step.grads.values())


@mistake("no backward: the gradients stay zero")
def no_backward(s: Scenario) -> str | None:
    if not _no_gradient(s):
        return None
    return (f"at all {len(s.obs.steps)} optimizer steps the gradients were zero on rank 0 (every .grad None or 0, "
            f"after {sum(s.micro)} forwards): no backward() reached the parameters, so DDP had nothing to all-reduce "
            "and SGD nothing to step with: call loss.backward() on each micro-batch's loss")


@mistake("every micro-step inside no_sync")
def never_synced(s: Scenario) -> str | None:
    if _no_gradient(s):
        return None  # no backward at all: no_backward
    if not (unsynced := [w for w, n in enumerate(s.window_rounds) if n == 0]):
        return None
    return (f"DDP never all-reduced the gradients of window {unsynced[0]} (0 all-reduce rounds in its "
            f"{s.expected_micro[unsynced[0]]} micro-steps, {len(unsynced)} of {s.n_windows} windows so, counted "
            "with a comm hook), so each rank stepped with its own gradient: run the last micro-step of each window "
            "outside model.no_sync()")


def _synced_early(s: Scenario) -> tuple[int, list[int], int] | None:
    """The first window whose gradients DDP all-reduced during a micro-step other than its last (counted with a
    comm hook: the rounds at each micro-step's forward): the window, those micro-steps (from 1), its length."""
    total = s.obs.total_rounds
    for w, window in enumerate(windows(len(s.sizes), s.k)):
        if window.stop >= len(total):
            break
        synced = [i - window.start + 1 for i in window if total[i + 1] > total[i]]
        if synced and synced != [len(window)]:
            return w, synced, len(window)
    return None


def _synced_said(found: tuple[int, list[int], int]) -> str:
    w, synced, n = found
    every = ", which costs an all-reduce per micro-step" if len(synced) == n else ""
    return (f"in window {w} DDP all-reduced the gradients during micro-step(s) {synced} of its {n} (counted "
            "with a comm hook), so the ranks' gradients were averaged before the window's last micro-step"
            f"{every}: DDP syncs a micro-step whose forward ran outside model.no_sync(), whatever the backward's "
            "context; run every micro-step but the window's last, its forward and its backward, inside "
            "model.no_sync()")


@mistake("no_sync on the wrong micro-steps: DDP synced inside the window")
def synced_mid_window(s: Scenario) -> str | None:
    found = _synced_early(s)
    return _synced_said(found) if found is not None else None


@mistake("no_sync on the wrong micro-steps: the window's last one not synced")
def last_not_synced(s: Scenario) -> str | None:
    """:func:`synced_mid_window` where it makes the gradient wrong: the window's last micro-step not all-reduced
    (all-reduced at every micro-step, the sum of averages is the average of the sum: right, and only costly)."""
    found = _synced_early(s)
    return _synced_said(found) if found is not None and found[2] not in found[1] else None


def first_wrong(s: Scenario) -> tuple[int, float] | None:
    """The first optimizer step whose gradient is not its window's big-batch gradient, and by how much."""
    for w, (step, ref) in enumerate(zip(s.obs.steps, s.references)):
        ok, diff = close(step.grads, ref["big"])
        if not ok:
            return w, diff
    return None


def window_in_words(s: Scenario, w: int) -> tuple[str, int]:
    """Window ``w``'s micro-batches in words, and its ``N`` (the contract's: summed over the window's micro-batches
    and over the ranks): every rank's samples, or every rank's tokens."""
    win = windows(len(s.sizes), s.k)[w]
    if s.name != "tokens":
        return (f"{[s.sizes[i] for i in win]} samples per micro-batch on each rank",
                len(s.ranks) * sum(s.sizes[i] for i in win))
    counts = [[sum(TOKEN_LENGTHS[r][i]) for i in win] for r in range(s.world)]
    each = [f"{c} on rank {r}" for r, c in enumerate(counts)]
    return f"non-padding tokens per micro-batch {', '.join(each[:-1])} and {each[-1]}", sum(map(sum, counts))


def _normalisation(s: Scenario, wrong: str, advice: str) -> str | None:
    """The message if every step's gradient is the micro-batch gradients ``wrong`` (at that step's weights)."""
    label = [next((key for key in ref if key.startswith(wrong)), None) for ref in s.references]
    first = first_wrong(s)
    if not first or None in label or not all(close(step.grads, ref[label[w]])[0]
                                             for w, (step, ref) in enumerate(zip(s.obs.steps, s.references))):
        return None
    w, diff = first
    win = windows(len(s.sizes), s.k)[w]
    if wrong.startswith("divided by accumulation_steps") and len(win) != s.k:
        advice = ("this window is shorter than accumulation_steps: normalise the final, shorter window over its "
                  "own samples (n_i / N), not by accumulation_steps")
    what, n = window_in_words(s, w)
    unit = "tokens on all ranks" if s.name == "tokens" else "samples on all ranks"
    return (f"the gradient of window {w} ({what}) is the micro-batch gradients {label[w]}, not the mean over its "
            f"N={n} {unit} (max abs difference {diff:.3g}): {advice}")


@mistake("loss not divided")
def not_divided(s: Scenario) -> str | None:
    return _normalisation(s, "not divided", "the loss was not divided; scale each micro-batch's mean loss by n_i / N")


@mistake("loss divided by accumulation_steps")
def divided_by_k(s: Scenario) -> str | None:
    return _normalisation(s, "divided by accumulation_steps", "scale each micro-batch's mean loss by n_i / N, "
                          "its share of the window's samples, rather than dividing by accumulation_steps")


@mistake("micro-batches weighted equally")
def equal_weights(s: Scenario) -> str | None:
    return _normalisation(s, "divided by the", "weight each micro-batch's mean loss by its share of the "
                          "window's samples n_i / N")


@mistake("loss divided by the world size on top of DDP's average")
def over_world(s: Scenario) -> str | None:
    return _normalisation(s, OVER_WORLD, "DDP averages the ranks' "
                          "gradients (their sum over the world size): a loss summed over this rank's labels and "
                          "divided by the global N must be multiplied by the world size to give the global mean")


OVER_WORLD = "summed over the labels, divided by N and then"  # the reference's label for over_world's gradient


@mistake("the world size taken from torch.cuda.device_count()")
def world_from_gpus(s: Scenario) -> str | None:
    if not s.obs.device_count_at:
        return None
    return _normalisation(s, OVER_WORLD, f"your code called torch.cuda.device_count() ({s.obs.device_count_at}), "
                          f"which counts this machine's GPUs ({torch.cuda.device_count()} here), not the ranks "
                          f"({len(s.ranks)}): the world size is dist.get_world_size()")


@mistake("per-micro-batch token means averaged")
def mean_of_means(s: Scenario) -> str | None:
    if s.name != "tokens":
        return None
    return _normalisation(s, "divided by the", "averaging each micro-batch's token mean weighs a token of a "
                          "short micro-batch more than one of a long one (the accumulation bug several libraries "
                          "shipped in 2024); sum the token losses (reduction='sum') and divide by the window's "
                          "token count over all ranks")


@mistake("local token count not all-reduced")
def local_count(s: Scenario) -> str | None:
    return _normalisation(s, "normalised by each rank's own token count", "each rank divided by its own token "
                          "count, so a token of the rank with fewer weighs more; all_reduce the window's token count "
                          "before its first backward and divide by that global N")


@mistake("local count not all-reduced, times the world size")
def local_count_times_world(s: Scenario) -> str | None:
    return _normalisation(s, "normalised by each rank's own count and", "each rank divided by its own count (of "
                          "samples, or of tokens) and multiplied by the world size, so DDP's average is the sum of the "
                          "ranks' means; all_reduce the window's count before its first backward and divide by that "
                          "global N")


@mistake("padding tokens counted")
def padding_counted(s: Scenario) -> str | None:
    return _normalisation(s, "normalised with padding", "the count included the padding labels (IGNORE_INDEX), which "
                          "add nothing to the loss: count only the labels that are not IGNORE_INDEX")


def _scale(s: Scenario) -> float | None:
    """The one factor ``c`` such that every optimizer step's gradient is ``c`` times its window's big-batch
    gradient (least squares over every step, then checked step by step), if there is one."""
    pairs = [(step.grads, ref["big"]) for step, ref in zip(s.obs.steps, s.references)]
    if not pairs or len(pairs) != s.n_windows:
        return None
    c = float(sum((g[n] * big[n]).sum() for g, big in pairs for n in big) /
              sum((big[n] ** 2).sum() for _, big in pairs for n in big))
    return c if all(close(g, {n: c * b for n, b in big.items()})[0] for g, big in pairs) else None


@mistake("a world size other than the launch's")
def wrong_world(s: Scenario) -> str | None:
    """Every step is ``m / W`` of the mean, ``m`` a whole number but not the world size ``W``: the loss was
    multiplied by ``m`` where DDP divides by ``W`` (a constant, or the ranks of one node: LOCAL_WORLD_SIZE)."""
    if (c := _scale(s)) is None or abs(c * s.world - round(c * s.world)) > 1e-3 or round(c * s.world) in (0, s.world):
        return None
    m, nodes, read = round(c * s.world), NODES.get(s.world, 1), s.obs.local_world_size_at
    where = f"{s.world} ranks" + (f" on {nodes} nodes of {s.world // nodes}" if nodes > 1 else "")
    why = (f"your code read LOCAL_WORLD_SIZE ({read}), which counts the processes of one node ({s.world // nodes} "
           "here), not the ranks of the job: " if read else "")
    unit = "non-padding token" if s.name == "tokens" else "sample"
    return (f"at {where}, rank 0's gradient at each of its {len(s.obs.steps)} optimizer steps was {m}/{s.world} of "
            f"the window's mean over every {unit} on all ranks (x{c:.3g}): the loss was multiplied by {m} where DDP "
            f"divides the ranks' summed gradients by the world size, {s.world}; {why}take the world size from "
            "dist.get_world_size()")
