"""The course's one memory accounting: what a GPU holds to train a model (notebooks 00-05, 07, 08).

ZeRO (Rajbhandari et al., 2020, sec. 3) splits a GPU's memory into *model states* (parameters,
gradients, the optimizer's state) and *residual states* (activations, buffers, fragmentation).
Per parameter, with Adam:

============================  ======  =========  ==================  ==============  =====
precision                     params  gradients  fp32 master copy    Adam's moments  total
============================  ======  =========  ==================  ==============  =====
fp32                          4       4          0 (the params are)  4 + 4           16
bf16 / fp16 mixed precision   2       2          4                   4 + 4           16
============================  ======  =========  ==================  ==============  =====

Mixed precision (Micikevicius et al., 2018) keeps an fp32 master copy of the weights for the
update, so it saves no model-state memory: ZeRO's ``2Ψ + 2Ψ + KΨ`` with ``K = 12`` (master,
momentum, variance). The ZeRO stages divide these terms by the data-parallel degree ``N_d``:
stage 1 (``P_os``) the optimizer state, which holds the master copy, stage 2 (``P_os+g``) the
gradients too, stage 3 (``P_os+g+p``, FSDP's ``fully_shard``) the parameters too. The paper's
7.5B-parameter example at ``N_d = 64``: 120, 31.4, 16.6 and 1.9 GB (its Figure 1).

Activations are the residual state that matters: they scale with the micro-batch and the
sequence, not with ``Ψ``, and ZeRO-DP does not divide them (each rank keeps its own
micro-batch's). They come in as a number of bytes: from
:mod:`distlab.lab.activation_memory` or from a measurement.
"""
from __future__ import annotations

FP32 = 4
#: Bytes per parameter of the parameters, the gradients and the fp32 master copy, by training precision.
PRECISIONS = {"fp32": {"params": 4, "grads": 4, "master": 0},
              "bf16": {"params": 2, "grads": 2, "master": 4},
              "fp16": {"params": 2, "grads": 2, "master": 4}}
OPTIMIZER_STATES = {"adam": 2, "sgd+momentum": 1, "sgd": 0}  # fp32 tensors kept per parameter
LEVELS = ("none", "optimizer", "+gradients", "full")  # ZeRO-0 (DDP), ZeRO-1, ZeRO-2, ZeRO-3 / FSDP
#: The ZeRO level from which each term is divided by the data-parallel degree.
SHARDED_FROM = {"master": 1, "optimizer": 1, "grads": 2, "params": 3}


def bytes_per_param(precision: str = "fp32", optimizer: str = "adam") -> dict[str, int]:
    """``{"params", "grads", "master", "optimizer"}`` bytes per parameter, unsharded (16 in all for
    Adam in fp32 and in bf16 mixed precision alike)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {tuple(PRECISIONS)}")
    if optimizer not in OPTIMIZER_STATES:
        raise ValueError(f"optimizer must be one of {tuple(OPTIMIZER_STATES)}")
    return {**PRECISIONS[precision], "optimizer": FP32 * OPTIMIZER_STATES[optimizer]}


def training_memory(n_params: float, *, precision: str = "fp32", optimizer: str = "adam", world: int = 1,
                    level: str = "none", activations: float = 0.0) -> dict[str, float]:
    """Bytes per GPU of ``n_params`` parameters trained over ``world`` data-parallel ranks.

    Returns ``params``, ``grads``, ``master`` (the fp32 copy mixed precision keeps; 0 in fp32),
    ``optimizer`` (the moments), ``activations`` (as given: bytes of this GPU's micro-batch,
    never divided) and their ``total``. ``level`` is the ZeRO sharding (:data:`LEVELS`): each
    term is divided by ``world`` from the stage in :data:`SHARDED_FROM` on.
    """
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}")
    stage = LEVELS.index(level)
    out = {term: n_params * b / (world if stage >= SHARDED_FROM[term] else 1)
           for term, b in bytes_per_param(precision, optimizer).items()}
    out["activations"] = float(activations)
    out["total"] = sum(out.values())
    return out
