"""The typed contract of exercise 3's accumulation part: what the rank observed of ``accumulated_step``.

``probes.observe`` fills an :class:`Accumulation` (three runs, each a :class:`Windows`); it crosses to the
grading process inside the check's ``AmpObservation`` (``..observations``). Imported by both sides: it
imports nothing of either.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ....rank.observation import Observation


@dataclass
class Windows(Observation):
    """One run of the learner's ``accumulated_step`` over some windows of K micro-batches, on its own model
    and GradScaler, up to the window that raised (if one did)."""

    # per window, the calls in order: "scale", "backward", "unscale_", "step", "optimizer.step", "update"
    events: list[list[str]] = field(default_factory=list)
    # the gradient norm the optimizer stepped with, at each optimizer.step() of the run
    norms: list[float] = field(default_factory=list)
    # per window that returned, the loss accumulated_step returned
    losses: list[float] = field(default_factory=list)
    # per window that returned, the mean cross-entropy of the model's own forwards in it (each output against
    # its micro-batch's labels, in float32); None where it made other than one forward per micro-batch
    forward_means: list[float | None] = field(default_factory=list)
    # per window, the scaler's scale before and after it
    scales: list[tuple[float, float]] = field(default_factory=list)
    # whether the last window that returned left every weight as it was (a skipped window)
    unchanged: bool = False
    # per window, whether .grad still held the NaN the grader left in it when the window's first backward began
    stale: list[bool] = field(default_factory=list)
    # per window, the model's forwards and backwards in order: "F" and "B" ("FBFBFBFB": one micro-batch at a time)
    passes: list[str] = field(default_factory=list)
    # the model's weights after the run, by parameter name
    state: dict[str, torch.Tensor] = field(default_factory=dict)
    # the error a window raised, "Type: message (line N: code)" at the learner's line ("" if none did)
    error: str = ""


@dataclass
class Accumulation(Observation):
    """The three runs of ``accumulated_step`` (``None`` where the part could not run at all: ``error`` says why)."""

    # WINDOWS windows with a max_norm no gradient reaches: the update is the mean gradient itself
    parity: Windows | None = None
    # one window with MAX_NORM, which the window's true gradient exceeds
    clipped: Windows | None = None
    # one window whose micro-batch INF_MICRO holds an inf: skipped whole, the scale halved once
    overflow: Windows | None = None
    # why none of the three ran (no accumulated_step in the file, or the part raised as a whole; "" if they ran)
    error: str = ""
