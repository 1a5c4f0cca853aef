"""Exercise 3's criteria of ``accumulated_step`` (the part notebook 03 does not show): float16 over ``K``
micro-batches with a GradScaler, against the same window written the right way in one process
(:func:`.probes.reference`): the weights and losses, the scaler's calls per window with the clipped norm, and a
window whose one micro-batch overflows skipped whole, the scale halved once. The verdicts read what the rank
observed (:class:`.observations.Accumulation`); the causes (:mod:`.causes`) name the mistake.
"""
from __future__ import annotations

from ....grader.diagnosis import diagnose
from ....grader.parity import parity
from ....grader.report import Verdict, criterion, failed, passed
from ..observations import Run
from ..workloads import LOSS_TOL, MAX_NORM
from .causes import (backwards_not_k, broken as acc_broken, clipped_scaled as acc_clipped_scaled, forwards_first,
                     loss_not_the_windows, not_cleared, not_divided, steps_not_one as acc_steps_not_one,
                     unscaled_per_micro, updated_per_micro)
from .observations import Windows
from .probes import INF_MICRO, K, WINDOWS, reference

ACC_RTOL, ACC_ATOL = 1e-3, 1e-4  # fp16 windows vs the reference: other legal roundings, far from any mistake

ORDER_CAUSES = [backwards_not_k, acc_steps_not_one, unscaled_per_micro, updated_per_micro]  # most specific first


@criterion(f"fp16 accumulation over {K} micro-batches matches the reference ({WINDOWS} windows)", points=1.5)
def accumulation_parity(run: Run) -> Verdict:
    a = run.obs.accumulation
    p = a.parity or Windows(error=a.error)
    if why := acc_broken(p, "accumulated_step"):
        return failed(why)
    ref = reference()
    same = parity(p.state, ref["state"], rtol=ACC_RTOL, atol=ACC_ATOL)
    gaps = [abs(got - want) / max(1.0, abs(want)) for got, want in zip(p.losses, ref["losses"])]
    if why := loss_not_the_windows(p):
        return failed(why)
    if same.ok and max(gaps) <= LOSS_TOL:
        return passed(f"max abs difference {same.max_abs_diff:.2g}, loss gap {max(gaps):.2g}")
    if cause := diagnose([not_cleared, *ORDER_CAUSES, not_divided], p):
        return failed(cause)
    if not same.ok:
        return failed(f"after {WINDOWS} windows the weights differ from the whole batch's mean gradient stepped "
                      f"once per window (max abs difference {same.max_abs_diff:.3g} in {same.worst}; stepped "
                      f"gradient norms {[round(n, 4) for n in p.norms]}, the reference's "
                      f"{[round(n, 4) for n in ref['norms']]})")
    step = gaps.index(max(gaps))
    return failed(f"the loss returned for window {step + 1} is {p.losses[step]:.4g}, the whole batch's mean "
                  f"cross-entropy is {ref['losses'][step]:.4g}: return the mean of the micro-batches' losses, unscaled")


@criterion("accumulation: scale per micro-batch; unscale_, clip, step, update once per window", points=1)
def accumulation_order(run: Run) -> Verdict:
    a = run.obs.accumulation
    c = a.clipped or Windows(error=a.error)
    if why := acc_broken(c, "accumulated_step with max_norm"):
        return failed(why)
    if cause := diagnose([*ORDER_CAUSES, forwards_first, acc_clipped_scaled], c):
        return failed(cause)
    norm = c.norms[0] if c.norms else float("nan")
    if abs(norm - MAX_NORM) <= 1e-3 * MAX_NORM:
        return passed()
    return failed(f"the optimizer stepped with a gradient norm of {norm:.3g} where clipping the window's true "
                  f"gradient gives max_norm={MAX_NORM}: clip with torch.nn.utils.clip_grad_norm_ after unscale_")


@criterion("accumulation: one overflowing micro-batch skips the window, the scale halves once", points=0.5)
def accumulation_overflow(run: Run) -> Verdict:
    a = run.obs.accumulation
    o = a.overflow or Windows(error=a.error)
    if why := acc_broken(o, "accumulated_step with an inf in one micro-batch"):
        return failed(why)
    (before, after), = o.scales
    if o.unchanged and after == before / 2:
        return passed()
    where = f"micro-batch {INF_MICRO + 1} of {K} held an inf"
    if cause := diagnose(ORDER_CAUSES, o):
        return failed(cause)
    if not o.unchanged:
        return failed(f"{where} and the weights changed: the whole window must be skipped, through one "
                      "scaler.step(optimizer) after the last micro-batch")
    return failed(f"{where} and the scale went from {before:g} to {after:g}, where one scaler.update() per "
                  f"window halves it ({before / 2:g})")
