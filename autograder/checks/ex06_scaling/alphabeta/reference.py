"""Exercise 6's α-β part: the all-reduce times the grader makes from a known latency and bandwidth, the
prediction cases, and the ring model's reference fit and prediction, with the variants the classic
mistakes compute (the causes match the learner's figures against them).

The ring all-reduce of ``n`` bytes on ``W`` ranks (Patarasuk & Yuan, 2009; Thakur, Rabenseifner & Gropp,
2005): ``2(W-1)`` steps of latency ``alpha``, and ``2(W-1)/W * n`` bytes through every link at ``beta``
seconds a byte. The times carry a multiplicative noise of up to ``NOISE`` (seeded: the same rows on every
run), small enough that a correct relative fit lands within 0.3% of the truth (``FIT_TOL`` is 5%);
the sizes span five decades, so that a fit in seconds (not relative) loses ``alpha`` in the largest
messages' noise. The second set measures each world size at a few sizes only (W=8 at one), as a real
campaign does: a fit per world size cannot be averaged into the joint fit there.
"""
from __future__ import annotations

import random

import torch

NOISE = 0.03   # the times' relative noise, uniform in [-NOISE, NOISE]
FIT_TOL = 0.05  # the fit's tolerance on alpha and beta (relative): the reference lands within 0.003
PREDICT_RTOL = 1e-6  # the prediction is a formula: float64 rounding only
ELEMENT_BYTES = 4   # the rows' tensors are float32


def allreduce_s(nbytes: float, world: int, alpha: float, beta: float, *, latency_steps=None,
                bus=None) -> float:
    """The ring's time; ``latency_steps(W)`` and ``bus(W)`` replace ``2(W-1)`` and ``2(W-1)/W`` (the variants)."""
    steps = latency_steps(world) if latency_steps else 2 * (world - 1)
    factor = bus(world) if bus else 2 * (world - 1) / world
    return steps * alpha + factor * nbytes * beta


def _rows(alpha: float, beta: float, plan: dict[int, tuple[int, ...]], seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [{"world": w, "numel": n, "seconds": allreduce_s(ELEMENT_BYTES * n, w, alpha, beta)
             * (1 + rng.uniform(-NOISE, NOISE))} for w, sizes in plan.items() for n in sizes]


# (name, alpha, beta, which numels at which world size): a CPU's gloo, and a GPU node's NCCL.
DATASETS = [
    dict(name="gloo-like", alpha=40e-6, beta=1 / 2e9,
         rows=_rows(40e-6, 1 / 2e9, {2: (1 << 10, 1 << 13, 1 << 16, 1 << 19, 1 << 22, 1 << 26),
                                     4: (1 << 10, 1 << 13, 1 << 16, 1 << 19, 1 << 22, 1 << 26)}, seed=14)),
    dict(name="nccl-like", alpha=8e-6, beta=1 / 80e9,
         rows=_rows(8e-6, 1 / 80e9, {2: (1 << 10, 1 << 16, 1 << 22, 1 << 26), 4: (1 << 14, 1 << 24),
                                     8: (1 << 12,)}, seed=1)),
]

# The prediction's cases: an all-reduce the backward cannot hide at W=8, one it hides at W=4, a
# latency-bound one at W=16 (small gradients, many ranks), and one worker.
CASES = [
    dict(compute_s=0.010, backward_s=0.006, grad_bytes=40e6, world=8, alpha=40e-6, beta=1 / 2e9),
    dict(compute_s=0.010, backward_s=0.006, grad_bytes=4e6, world=4, alpha=40e-6, beta=1 / 2e9),
    dict(compute_s=0.001, backward_s=0.0002, grad_bytes=64e3, world=16, alpha=40e-6, beta=1 / 2e9),
    dict(compute_s=0.010, backward_s=0.006, grad_bytes=40e6, world=1, alpha=40e-6, beta=1 / 2e9),
]


# How each classic mistake builds the model: the latency's steps, the bandwidth term's factor, the bytes
# per element, and whether the errors are relative.
FIT_VARIANTS = {
    "reference": {},
    "elements": dict(element_bytes=1),
    "latency once": dict(latency_steps=lambda w: 1 if w > 1 else 0),
    "algorithm bandwidth": dict(bus=lambda w: 1.0 if w > 1 else 0.0),
    "no (W-1)/W": dict(bus=lambda w: 2.0 if w > 1 else 0.0),
    "half the ring": dict(bus=lambda w: (w - 1) / w),
    "seconds": dict(relative=False),
}


def fit(rows: list[dict], *, element_bytes: int = ELEMENT_BYTES, latency_steps=None, bus=None,
        relative: bool = True) -> tuple[float, float]:
    """``(alpha, beta)`` by least squares of the relative errors (a variant's options: its mistake)."""
    x = torch.tensor([[allreduce_s(0, r["world"], 1.0, 0, latency_steps=latency_steps, bus=bus),
                       allreduce_s(element_bytes * r["numel"], r["world"], 0, 1.0, latency_steps=latency_steps,
                                   bus=bus)] for r in rows], dtype=torch.float64)
    t = torch.tensor([r["seconds"] for r in rows], dtype=torch.float64).unsqueeze(1)
    a, b = (x / t, torch.ones_like(t)) if relative else (x, t)
    alpha, beta = torch.linalg.lstsq(a, b).solution.squeeze(1).tolist()
    return alpha, beta


def step_s(case: dict, *, overlap: str = "backward", **model) -> float:
    """One step at ``case['world']`` workers: the compute, and the all-reduce the overlap leaves exposed
    (``overlap``: ``"backward"``, the reference; ``"none"``; ``"step"``, hidden under the whole step; ``"unclamped"``,
    the all-reduce minus the backward even where that is negative)."""
    ar = allreduce_s(case["grad_bytes"], case["world"], case["alpha"], case["beta"], **model)
    if overlap == "none":
        return case["compute_s"] + ar
    if overlap == "step":
        return max(case["compute_s"], ar)
    if overlap == "unclamped":
        return case["compute_s"] + ar - case["backward_s"]
    return case["compute_s"] + max(0.0, ar - case["backward_s"])


def predict(case: dict, *, speedup: bool = False, **how) -> float:
    """The efficiency ``t_step(1) / t_step(W)`` (``speedup``: times W, the mistake)."""
    eff = case["compute_s"] / step_s(case, **how)
    return eff * case["world"] if speedup else eff


# A prediction's mistakes, as written: one worker pays them too (its case is left out when they are matched).
PREDICT_VARIANTS = {
    "reference": {},
    "no overlap": dict(overlap="none"),
    "overlap with the whole step": dict(overlap="step"),
    "exposed time not clamped": dict(overlap="unclamped"),
    "speed-up": dict(speedup=True),
    "latency once": dict(latency_steps=lambda w: 1),
    "algorithm bandwidth": dict(bus=lambda w: 1.0),
    "no (W-1)/W": dict(bus=lambda w: 2.0),
    "half the ring": dict(bus=lambda w: (w - 1) / w),
}


def quantities(case: dict) -> dict[str, float]:
    """The model's numbers for ``case``, by name: the inputs and the terms a correct prediction assigns on
    its way, in the orders it may take (a learner's line that makes none of them is where it went wrong;
    few on purpose, so that a wrong number rarely equals one of them by chance)."""
    w, a, b, n = case["world"], case["alpha"], case["beta"], case["grad_bytes"]
    ar = allreduce_s(n, w, a, b)
    step = step_s(case)
    named = {**case, "W-1": w - 1, "2(W-1)": 2 * (w - 1), "2(W-1)/W": 2 * (w - 1) / w,
             "latency 2(W-1)α": 2 * (w - 1) * a, "bytes through a link": 2 * (w - 1) / w * n,
             "bandwidth term": 2 * (w - 1) / w * n * b, "all-reduce": ar,
             "all-reduce - backward": ar - case["backward_s"], "exposed all-reduce": max(0.0, ar - case["backward_s"]),
             "forward and update": case["compute_s"] - case["backward_s"],
             "max(backward, all-reduce)": max(case["backward_s"], ar), "step": step, "efficiency": predict(case)}
    return named


def close(got: float | None, want: float, rtol: float) -> bool:
    return got is not None and abs(got - want) <= rtol * abs(want) + 1e-15
