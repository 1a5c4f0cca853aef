"""The activation term of the memory calculator: what a layer keeps for backward, per micro-batch.

``distlab.lab.training_memory.training_memory`` counts parameters, gradients, master weights and
optimizer state, and adds the activations this module models: they scale with the micro-batch,
the sequence and the depth, not with the parameters. Two models of them:

* the course's :class:`~distlab.resmlp.ResidualMLP`, exactly (float32): a block saves its input
  (for ``fc1``'s weight gradient) and its ReLU output (for the ReLU and ``fc2``: one storage).
  Tensor parallelism over ``t`` ranks splits the ReLU output, not the input; recomputation
  (Chen et al., 2016) keeps only each checkpointed segment's input. It matches
  ``distlab.measure.memory.saved_tensor_bytes`` to the byte on the CPU (the tests allow 5%), and stays
  below ``distlab.lab.fsdp_memory.activation_bytes``, the FSDP lesson's bound with its 2x margin.
* a transformer layer, Korthikanti et al. (2022), *Reducing Activation Recomputation in Large
  Transformer Models*, Table 2: GPT's layer (a ``4h`` GeLU MLP, dropout, the attention scores
  stored), ``s b h (34 + 5 a s / h)`` bytes with 16-bit activations,
  ``10 + 24/t`` with tensor parallelism (the layer norms, dropouts and layer inputs are not
  split), ``34/t`` with sequence parallelism too; selective recomputation drops the
  ``5 a s / h`` attention-score term; full recomputation keeps the layer input only.

And the communication tensor parallelism adds per layer (Megatron-LM, Shoeybi et al., 2019,
sec. 3): an all-reduce after attention and one after the MLP in the forward, two in the
backward; sequence parallelism turns each into an all-gather and a reduce-scatter of the same
volume. Full recomputation repeats the forward's two (Megatron reruns the whole forward;
PyTorch's non-reentrant checkpoint stops once the last saved tensor is back, before the MLP's).
torchtitan's selective policy saves every second ``mm`` and the reduce-scatters, not the
all-gathers nor the all-reduces, so its recomputation re-issues both all-gathers with sequence
parallelism, and attention's all-reduce without (its output feeds the MLP's norm; the MLP's
all-reduce feeds nothing saved, and PyTorch's non-reentrant checkpoint stops before it). Measured
with ``distlab.measure.comm.CollectiveRecorder`` in ``tests/distlab/test_tensor_parallel.py``.
"""
from __future__ import annotations

import math

from distlab.lab.training_memory import training_memory

FLOAT32 = 4
RECOMPUTE = ("none", "selective", "full")
# Transformer shapes (hidden, attention heads, layers) for the calculator. The layer is Korthikanti et al.'s GPT
# layer at each model's width: for "Llama-2 7B" that overstates a SwiGLU layer with flash attention.
PRESETS = {"GPT-2 XL (1.5B)": dict(hidden=1600, heads=25, layers=48),
           "Llama-2 7B": dict(hidden=4096, heads=32, layers=32),
           "GPT-3 175B": dict(hidden=12288, heads=96, layers=96)}


def block_bytes(batch: int, hidden: int, *, tp: int = 1, recomputed: bool = False) -> int:
    """Bytes one ResidualMLP block keeps for backward, per micro-batch of ``batch`` rows.

    Its input ``batch x hidden`` (whole on every tensor-parallel rank: ``fc1``'s input is
    replicated) and its ReLU output ``batch x 2 hidden / tp``. A recomputed block keeps its input only.
    """
    return FLOAT32 * batch * (hidden if recomputed else hidden + 2 * hidden // tp)


def resmlp_saved_bytes(batch: int, *, in_features: int, hidden: int, depth: int, out_features: int,
                       tp: int = 1, every: int = 0) -> int:
    """Bytes a ResidualMLP trained with cross-entropy keeps for backward at the end of the forward.

    ``every``: blocks per checkpointed segment (0: none); each segment keeps its input. Besides
    the blocks: the batch (the input layer's input), the head's input, the log-probabilities,
    and the loss's int64 targets and 4-byte weight total.
    """
    if every:
        blocks = math.ceil(depth / every) * block_bytes(batch, hidden, recomputed=True)
    else:
        blocks = depth * block_bytes(batch, hidden, tp=tp)
    return blocks + FLOAT32 * batch * (in_features + hidden + out_features) + 8 * batch + 4


def resmlp_peak_bytes(batch: int, *, in_features: int, hidden: int, depth: int, out_features: int,
                      every: int = 0) -> int:
    """An estimate of the peak a step adds above parameters and gradients: what the forward keeps,
    one segment recomputed in the backward (``every`` blocks), and the largest weight gradient
    while it is formed (``2 hidden x hidden``, before it is added to ``.grad``).

    Chen et al.'s trade-off: with segments of ``k`` blocks the peak holds ``depth/k`` segment
    inputs and ``k`` blocks' activations, smallest near ``k = √depth``: O(√depth).
    """
    saved = resmlp_saved_bytes(batch, in_features=in_features, hidden=hidden, depth=depth,
                               out_features=out_features, every=every)
    return saved + every * block_bytes(batch, hidden) + FLOAT32 * 2 * hidden * hidden


def transformer_layer_bytes(seq: int, batch: int, hidden: int, heads: int, *, tp: int = 1,
                            sp: bool = False, recompute: str = "none") -> float:
    """Activation bytes of one transformer layer per micro-batch, per rank (Korthikanti et al.,
    2022, Table 2: 16-bit activations, 1-byte dropout masks). With full recomputation the
    table's ``2 s b h`` (the layer input) is split by sequence parallelism too."""
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {RECOMPUTE}")
    sbh = seq * batch * hidden
    if recompute == "full":
        return 2 * sbh / (tp if sp else 1)
    scores = 0 if recompute == "selective" else 5 * heads * seq / hidden / tp  # softmax, its mask and output
    return sbh * ((34 / tp if sp else 10 + 24 / tp) + scores)


def tp_collectives_per_layer(tp: int, sp: bool = False, recompute: str = "none") -> dict[str, int]:
    """Collectives per layer and micro-batch (forward and backward) that tensor parallelism adds.
    ``"full"``: Megatron's recomputation of the whole forward; ``"selective"``: torchtitan's
    op-level policy (the module docstring says which collectives it re-issues)."""
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {RECOMPUTE}")
    if tp == 1:
        return {}
    n = 6 if recompute == "full" else 4  # 2 forward, 2 backward, 2 more when the forward runs again
    if recompute == "selective":  # torchtitan's policy: the all-gathers (SP), attention's all-reduce (TP) again
        return {"all-gather": 6, "reduce-scatter": 4} if sp else {"all-reduce": 5}
    return {"all-gather": n, "reduce-scatter": n} if sp else {"all-reduce": n}


def tp_comm_bytes_per_layer(seq: int, batch: int, hidden: int, *, tp: int, sp: bool = False,
                            recompute: str = "none", dtype_bytes: int = 2) -> float:
    """Bytes each rank sends per layer and micro-batch (ring algorithms): every collective moves
    one ``s x b x h`` activation, an all-reduce ``2 (t-1)/t`` of it, the others ``(t-1)/t``."""
    from distlab.measure.comm import wire_bytes

    counts = tp_collectives_per_layer(tp, sp, recompute)
    return sum(n * wire_bytes(kind, seq * batch * hidden * dtype_bytes, tp) for kind, n in counts.items())


def per_rank(preset: str, *, seq: int, batch: int = 1, tp: int = 1, sp: bool = False,
             recompute: str = "none") -> dict[str, float]:
    """Bytes per rank of a transformer with tensor parallelism only: the weight state (``12 h^2``
    parameters a layer, split ``t`` ways; bf16 mixed precision with Adam, 2 + 2 + 4 + 8 = 16 bytes
    a parameter), the activations of one micro-batch (GPT's layer at the preset's width), and the
    bytes sent per step; all through :func:`~distlab.lab.training_memory.training_memory`."""
    shape = PRESETS[preset]
    h, layers = shape["hidden"], shape["layers"]
    layer = transformer_layer_bytes(seq, batch, h, shape["heads"], tp=tp, sp=sp, recompute=recompute)
    m = training_memory(12 * h * h * layers / tp, precision="bf16", optimizer="adam", activations=layers * layer)
    return {"weight state": m["total"] - m["activations"], "activations": m["activations"], "per layer": layer,
            "total": m["total"],
            "comm per step": layers * tp_comm_bytes_per_layer(seq, batch, h, tp=tp, sp=sp, recompute=recompute),
            "collectives per step": layers * sum(tp_collectives_per_layer(tp, sp, recompute).values())}
