"""What exercise 4's ranks train on, and the grader's reference too: the model, the steps, the data.

Shared by the rank side (``probes``, ``zero1.probes``) and the grading process (``reference``, whose
single-process Adam runs on the same global batches); a module of its own so that ``observations``
(which reads the reference) and ``probes`` (which builds the observations) do not import each other.
"""
from __future__ import annotations

import torch

from distlab.data import synthetic_classification

MODEL = dict(in_features=64, hidden=90, out_features=10, depth=8)
STEPS, MICRO_BATCH, LR, SEED = 4, 8, 1e-2, 11
RTOL, ATOL = 1e-3, 1e-4  # reduce-scatter sums in another order; Adam's 1/sqrt(v) amplifies it on tiny gradients
MEASURE_STEP = 2  # the second step: Adam's state exists before it, so the step sees the steady state


def data():
    return synthetic_classification(256, MODEL["in_features"], MODEL["out_features"], seed=SEED)  # no sklearn


def global_batches(world: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(SEED)
    perm = torch.randperm(len(data()), generator=g)
    size = MICRO_BATCH * world
    return [perm[s * size:(s + 1) * size] for s in range(STEPS)]


def rank_batches(world: int, rank: int, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """This rank's micro-batch (its slice) of each global batch, on ``device``."""
    x_all, y_all = data().tensors
    mine = slice(rank * MICRO_BATCH, (rank + 1) * MICRO_BATCH)
    return [(x_all[idx[mine]].to(device), y_all[idx[mine]].to(device)) for idx in global_batches(world)]
