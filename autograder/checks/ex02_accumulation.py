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

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from distlab import init_distributed, shutdown
from distlab.data import digits
from distlab.models import cpu_state, make_mlp

from ..grading import grade_files
from ..harness import CapturedPrints, echo, load_learner
from ..parity import parity
from ..registry import Exercise
from ..report import ExerciseReport

EXERCISE = Exercise(number=2, name="accumulation", filename="ex02_accumulation.py", max_score=10, time_limit=90)
WORLD = 2
LR = 0.5
MODEL = dict(hidden=32)
RTOL, ATOL = 1e-4, 1e-6  # DDP averages per-rank sums: another order than one big mean
# name -> (micro-batch sizes, identical on every rank; accumulation_steps)
SCENARIOS = {
    "equal": ([8] * 12, 4),
    "unequal": ([4, 12, 8, 10, 2, 6], 3),
    "short": ([8] * 10, 4),
}


@functools.lru_cache(maxsize=1)
def _digits() -> tuple[torch.Tensor, torch.Tensor]:
    return digits().tensors


def micro_batches(sizes: list[int], rank: int, world: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Rank ``rank``'s micro-batches: micro-step i takes consecutive digits, rank-major."""
    x_all, y_all = _digits()
    out, start = [], 0
    for n in sizes:
        lo = start + rank * n
        out.append((x_all[lo:lo + n], y_all[lo:lo + n]))
        start += world * n
    return out


def windows(n: int, k: int) -> list[range]:
    return [range(s, min(s + k, n)) for s in range(0, n, k)]


class Probe:
    """Counters and snapshots shared by the instruments of one scenario."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.forwards = 0          # micro-steps since the last optimizer step
        self.rounds = 0            # DDP all-reduce rounds since the last optimizer step
        self.steps: list[dict] = []
        self.mid_window_zero_grad: list[int] = []  # micro-step count when zero_grad() cut a window
        self.mid_grads: dict | None = None

    def grads(self) -> dict:
        return {n: (p.grad.detach().to("cpu", copy=True) if p.grad is not None else torch.zeros_like(p, device="cpu"))
                for n, p in self.model.named_parameters()}

    def before_forward(self, module, args) -> None:
        if self.forwards > 0 and self.mid_grads is None:
            self.mid_grads = self.grads()  # after a micro-step that did not end the window
        self.forwards += 1

    def comm_hook(self, state, bucket):
        if bucket.index() == 0:
            self.rounds += 1
        return default_hooks.allreduce_hook(None, bucket)


def _recording_sgd(probe: Probe, params, lr: float) -> torch.optim.SGD:
    class RecordingSGD(torch.optim.SGD):
        def step(self, closure=None):
            probe.steps.append({"grads": probe.grads(), "micro": probe.forwards, "rounds": probe.rounds})
            probe.forwards = probe.rounds = 0
            return super().step(closure)

        def zero_grad(self, set_to_none: bool = True):
            if probe.forwards > 0:
                probe.mid_window_zero_grad.append(probe.forwards)
            return super().zero_grad(set_to_none)

    return RecordingSGD(params, lr=lr)


def _observe(path: str, device: torch.device, rank: int, world: int) -> dict:
    """Each scenario trains a fresh DDP model with the learner's loop; return what was observed."""
    learner = load_learner(path)
    out = {}
    for name, (sizes, k) in SCENARIOS.items():
        model = make_mlp(seed=5, **MODEL).to(device)
        ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
        probe = Probe(model)
        ddp.register_comm_hook(None, probe.comm_hook)
        model.register_forward_pre_hook(probe.before_forward)
        opt = _recording_sgd(probe, ddp.parameters(), LR)
        batches = [(x.to(device), y.to(device)) for x, y in micro_batches(sizes, rank, world)]
        with CapturedPrints() as printed:
            learner.train_accumulated(ddp, opt, batches, accumulation_steps=k)
        echo(printed.lines)
        out[name] = {"steps": probe.steps, "final": cpu_state(model), "mid_grads": probe.mid_grads,
                     "mid_zero_grad": probe.mid_window_zero_grad}
    return out


def rank_main(paths: list[str]) -> list[dict]:
    """Runs on every rank: observe each learner file in turn (tests grade several per launch)."""
    device = init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    results = [_observe(p, device, rank, world) for p in paths]
    shutdown()
    return results


def _grad(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict:
    model.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def reference(sizes: list[int], k: int) -> tuple[list[dict], dict]:
    """Single process on the global batches: per window, the big-batch gradient ``"big"`` and the
    usual wrong answers at the same weights (for feedback); then SGD with the big-batch gradient."""
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


def diagnose(obs: dict, sizes: list[int], k: int, refs: list[dict]) -> str:
    """The most specific reason a scenario's gradients or parameters are off ("" if none found)."""
    wins = windows(len(sizes), k)
    if obs["mid_zero_grad"]:
        return (f"optimizer.zero_grad() ran in the middle of a window (after micro-step "
                f"{obs['mid_zero_grad'][0]} of {k}), throwing away the gradients accumulated so far: "
                "zero the gradients only after optimizer.step(), once per window")
    micro = [s["micro"] for s in obs["steps"]]
    expected = [len(w) for w in wins]
    if micro != expected:
        if len(micro) > len(expected):
            return (f"optimizer.step() ran {len(micro)} times for {len(sizes)} micro-batches with "
                    f"accumulation_steps={k}: step once per window of {k} micro-batches "
                    f"({len(expected)} steps), not every micro-step")
        return (f"optimizer.step() ran after {micro} micro-batches; the windows have {expected}"
                + (" (the final, shorter window must still end with a step)" if len(micro) < len(expected) else ""))
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


def _verdicts(report: ExerciseReport, results: list[dict]) -> None:
    r0, r1 = results[0], results[1]  # one observation dict per rank
    for name, (sizes, k) in SCENARIOS.items():
        refs, ref_final = reference(sizes, k)
        obs = r0[name]
        why = diagnose(obs, sizes, k, refs)
        final_ok, diff = _close(obs["final"], ref_final)
        rank_diff = parity(r1[name]["final"], obs["final"]).max_abs_diff
        report.measurements[f"{name}_max_abs_diff_vs_reference"] = diff
        params_fb = why or (f"rank 0's parameters differ from the big-batch run (max abs difference {diff:.3g}, "
                            f"rank 1 differs from rank 0 by {rank_diff:.3g})")
        nwin = len(windows(len(sizes), k))
        if name == "equal":
            first_ok = bool(obs["steps"]) and _close(obs["steps"][0]["grads"], refs[0]["big"])[0]
            report.check(f"[equal sizes, k={k}] gradient after {k} micro-batches equals one {k}x larger batch", 2,
                         first_ok and not why, why or "the gradient at the first optimizer step differs")
            report.check(f"[equal sizes, k={k}] parameters after {nwin} optimizer steps equal the big-batch run",
                         2, final_ok and not why, params_fb, pass_note=f"max abs difference {diff:.2g}")
            micro = [s["micro"] for s in obs["steps"]]
            sched_ok = micro == [k] * nwin and not obs["mid_zero_grad"]
            report.check(f"[equal sizes, k={k}] one optimizer step and zero_grad per window", 1, sched_ok,
                         why or f"optimizer.step() ran after {micro} micro-batches; expected {[k] * nwin}")
            rounds = [s["rounds"] for s in obs["steps"]]
            report.check(f"[equal sizes, k={k}] gradients all-reduced once per optimizer step", 1,
                         rounds == [1] * nwin,
                         f"DDP all-reduced the gradients {rounds} times per optimizer step (counted with a comm "
                         f"hook); expected once: run the first {k - 1} micro-steps of each window (forward and "
                         "backward) inside `with model.no_sync():`" if any(r > 1 for r in rounds) else
                         f"DDP all-reduced {rounds} times per optimizer step; expected once, on the last "
                         "micro-batch of each window (outside no_sync)")
            mid0, mid1 = obs["mid_grads"], r1[name]["mid_grads"]
            if mid0 is None or mid1 is None:
                differ, gap = False, 0.0
                fb = "no micro-step ever followed another within a window: accumulate over several micro-batches"
            else:
                gap = parity(mid0, mid1).max_abs_diff
                differ = gap > 1e-6
                fb = ("on a micro-step that does not end a window the two ranks already had identical "
                      "gradients: DDP averaged them, which costs an all-reduce per micro-step; use "
                      "model.no_sync() until the last micro-batch of the window")
            report.check(f"[equal sizes, k={k}] ranks' gradients still differ inside a window", 1, differ, fb,
                         pass_note=f"max abs difference between ranks {gap:.2g}")
        elif name == "unequal":
            report.check(f"[unequal sizes {sizes}, k={k}] parameters equal the big-batch run", 1.5,
                         final_ok and not why, params_fb, pass_note=f"max abs difference {diff:.2g}")
        else:
            report.check(f"[{len(sizes)} micro-batches, k={k}] the final short window steps, normalised "
                         "over its own samples", 1.5, final_ok and not why, params_fb,
                         pass_note=f"max abs difference {diff:.2g}")


def grade_many(paths: list) -> list[ExerciseReport]:
    """Grade several files in one launch (the test suite's mutants); the learner's code runs in the ranks.

    The launch's timeout stays inside ``EXERCISE.time_limit`` for one file, so a hang is reported as
    ``LaunchTimeout`` naming the ranks that never finished rather than killed by the outer limit.
    """
    timeout = EXERCISE.time_limit - 20 + 10 * (len(paths) - 1)
    return grade_files(EXERCISE, rank_main, paths, world=WORLD, timeout=timeout, verdict=_verdicts)


def grade(path) -> ExerciseReport:
    """Grade the file at ``path``: one launch at world size 2 runs every scenario."""
    return grade_many([path])[0]
