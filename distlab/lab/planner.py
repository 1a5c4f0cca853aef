"""The planner: for every way of splitting ``W`` GPUs, the memory per GPU, the bytes each sends a step, the bubble.

In the manner of the Ultra-Scale Playbook (Tazi et al., Hugging Face, 2025): a layout is six degrees
that multiply to ``W``, ``dp`` (replicated data parallelism, DDP), ``fsdp`` (sharded data parallelism,
ZeRO-3: Rajbhandari et al. 2020), ``tp`` (Megatron's tensor parallelism, Shoeybi et al. 2019), ``pp``
(pipeline stages, 1F1B: Narayanan et al. 2021), ``cp`` (ring attention on sequence shards, Liu et al.
2023) and ``ep`` (experts, GShard: Lepikhin et al. 2020). Nothing here is a second accounting:

* memory: :func:`distlab.lab.training_memory.training_memory` of the parameters a GPU keeps (its stage's
  layers, its ``1/tp`` of each split matrix, its ``1/ep`` of the experts, ZeRO-3 over ``fsdp``), plus
  :func:`distlab.lab.activation_memory.transformer_layer_bytes` (Korthikanti et al. 2022) for the
  micro-batches a 1F1B stage holds (``min(pp, m)``);
* communication: one row per collective (:func:`collectives`), its size ``S`` as
  :class:`distlab.measure.comm.CollectiveRecorder` records it, priced by
  :func:`distlab.measure.comm.wire_bytes` (ring) and timed with the alpha-beta model of
  :mod:`distlab.lab.bandwidth`; tensor parallelism's collectives are
  :func:`distlab.lab.activation_memory.tp_collectives_per_layer`; the pipeline's sends
  (:func:`pp_sends`), the ring's (:func:`cp_sends`) and the MoE's padded all-to-alls
  (:func:`ep_all_to_all_bytes`) are those the labs' rank programs make, checked against their runs
  (:mod:`distlab.lab.planner_runs`);
* the bubble: :func:`distlab.lab.pipeline.timeline.theoretical_bubble`, ``(p-1)/(m+p-1)``, idle slots of
  the schedule (checked against the order of a real run's actions);
* time, where the cluster gives a peak: :mod:`distlab.lab.planner_time` (compute from ``6 N`` or ``8 N``
  per token, the bubble priced as idle compute, each group on the link it spans, data-parallel communication
  hidden behind the compute), a model checked against no run.

The model is :mod:`distlab.transformer`'s layer (separate ``wq, wk, wv, wo`` without bias, a ``4h`` MLP
with biases, two RMSNorms; embeddings, norm and head whole on every tensor-parallel rank, as
:mod:`distlab.lab.mesh2d` runs it), so the planner is exact for the run notebook 12 measures: the
bytes each rank holds and every collective of its step (``tests/distlab/test_planner.py``). FSDP2 is modelled
as it behaves: a unit per layer gathered before its forward and again before its backward, the root
unit (embeddings, norm, head) once unless ``reshard_root``, every unit reduce-scattered, once per
micro-batch. CP and EP ranks see other tokens, so the dense gradients are all-reduced over
``dp x cp x ep`` (torchtitan folds cp into its FSDP mesh instead); the experts' over ``dp x cp``.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass

from distlab.lab.activation_memory import tp_collectives_per_layer, transformer_layer_bytes
from distlab.lab.pipeline.timeline import theoretical_bubble
from distlab.lab.planner_time import RANK_ORDER, step_time
from distlab.lab.training_memory import PRECISIONS, training_memory
from distlab.measure.comm import wire_bytes

DEGREES = ("dp", "fsdp", "tp", "pp", "cp", "ep")
BUCKET_BYTES = 25 * 2**20  # DDP's bucket_cap_mb: one all-reduce per bucket (Li et al. 2020)


@dataclass(frozen=True)
class Model:
    """A decoder of ``layers`` layers of width ``hidden``; ``positions``: learned position rows (the
    tiny transformer's ``max_seq``; 0 for rotary); ``experts > 1``: a mixture of experts of top-``top_k``,
    each expert taking at most GShard's capacity of slots (``capacity_factor``)."""
    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int
    mlp_ratio: int = 4
    positions: int = 0
    experts: int = 1
    top_k: int = 1
    capacity_factor: float = 1.25

    @classmethod
    def of(cls, cfg, seq: int) -> Model:
        """The :class:`distlab.transformer.TransformerConfig` ``cfg`` trained on sequences of ``seq``."""
        return cls(layers=cfg.n_layers, hidden=cfg.dim, heads=cfg.n_heads, seq=seq, vocab=cfg.vocab,
                   mlp_ratio=cfg.mlp_ratio, positions=cfg.max_seq)


@dataclass(frozen=True)
class Cluster:
    """``gpus`` of ``memory`` bytes each; ``bandwidth``: a link's bus bandwidth (bytes/s), ``latency``: one
    ring step's (s), the alpha and 1/beta of :func:`distlab.lab.bandwidth.fit_latency_bandwidth`.

    With ``gpus_per_node`` and ``inter_bandwidth`` (and ``inter_latency``), ``bandwidth`` is a node's own
    links' (NVLink) and a group spanning nodes is priced at the network's (:func:`~.planner_time.link`); with
    ``peak_flops`` (per GPU, dense, in the training's precision) and ``efficiency`` (the fraction of it
    achieved) the plan adds the compute, the bubble and the overlap (:mod:`distlab.lab.planner_time`).
    ``placement``: the order in which the degrees number the ranks, innermost first (Megatron-LM's, ``tp``
    inside a node, by default): another order puts other groups across nodes."""
    gpus: int
    memory: float
    bandwidth: float
    latency: float = 0.0
    gpus_per_node: int = 0  # 0: every GPU in one node
    inter_bandwidth: float = 0.0
    inter_latency: float = 0.0
    peak_flops: float = 0.0  # 0: no compute modelled (then layouts rank by communication time)
    efficiency: float = 0.4
    placement: tuple[str, ...] = RANK_ORDER  # how ranks are numbered onto nodes, innermost degree first


@dataclass(frozen=True)
class Training:
    """``batch`` sequences a step in ``micro_batches`` micro-batches; precision and optimizer as
    :func:`~distlab.lab.training_memory.training_memory` names them."""
    batch: int
    micro_batches: int = 1
    precision: str = "bf16"
    optimizer: str = "adam"
    recompute: str = "none"
    sp: bool = False
    reshard_root: bool = False


@dataclass(frozen=True)
class Layout:
    dp: int = 1
    fsdp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1

    @property
    def world(self) -> int:
        return math.prod(asdict(self).values())

    def __str__(self) -> str:
        return " x ".join(f"{k} {v}" for k, v in asdict(self).items() if v > 1) or "one GPU"


def layer_params(model: Model, tp: int = 1, ep: int = 1) -> dict[str, float]:
    """Parameters of one layer on one rank: ``attention`` (``4h^2``, split ``tp`` ways), ``mlp`` (``w1``,
    its bias and ``w2`` split, ``w2``'s bias whole; per expert, ``experts / ep`` of them), ``norms`` (whole)."""
    h, r = model.hidden, model.mlp_ratio
    mlp = (2 * r * h * h + r * h) / tp + h
    return {"attention": 4 * h * h / tp, "mlp": mlp * model.experts / ep, "norms": 2 * h}


def stage_params(model: Model, layout: Layout) -> dict[str, float]:
    """Parameters of the largest pipeline stage on one rank, before FSDP shards them: its ``layers``
    (``layers / pp`` of :func:`layer_params`) and its ``root`` share: the embeddings on the first stage,
    the final norm and head on the last (both on one stage when ``pp = 1``)."""
    per_layer = sum(layer_params(model, layout.tp, layout.ep).values())
    h = model.hidden
    first, last = (model.vocab + model.positions) * h, h + model.vocab * h
    root = first + last if layout.pp == 1 else max(first, last)
    return {"layers": model.layers // layout.pp * per_layer, "root": root, "per_layer": per_layer}


def micro_batch(model: Model, layout: Layout, training: Training) -> int:
    """Sequences in one rank's micro-batch: the batch over the ranks that see other samples, ``dp fsdp ep``."""
    return training.batch // (layout.dp * layout.fsdp * layout.ep * training.micro_batches)


def memory_per_gpu(model: Model, layout: Layout, training: Training) -> dict[str, float]:
    """:func:`~distlab.lab.training_memory.training_memory` of the stage's parameters, ZeRO-3 over
    ``fsdp``, plus the activations of the ``min(pp, m)`` micro-batches a 1F1B first stage holds."""
    n = sum(v for k, v in stage_params(model, layout).items() if k != "per_layer")
    layer = transformer_layer_bytes(model.seq // layout.cp, micro_batch(model, layout, training), model.hidden,
                                    model.heads, tp=layout.tp, sp=training.sp, recompute=training.recompute)
    in_flight = in_flight_micro_batches(layout.pp, training.micro_batches)
    return training_memory(n, precision=training.precision, optimizer=training.optimizer, world=layout.fsdp,
                           level="full" if layout.fsdp > 1 else "none",
                           activations=layer * (model.layers // layout.pp) * in_flight)


def in_flight_micro_batches(pp: int, m: int, stage: int = 0) -> int:
    """Micro-batches whose activations 1F1B's stage ``stage`` holds at once: ``min(pp - stage, m)``."""
    return min(pp - stage, m)


def collectives(model: Model, layout: Layout, training: Training) -> list[dict]:
    """Every collective one rank joins in a step: ``dim`` (the degree it belongs to), ``kind`` (as
    :data:`distlab.measure.comm.KINDS`), ``bytes`` (the size ``S`` of one call), ``group`` and ``calls``."""
    m, lo, h = training.micro_batches, layout, model.hidden
    layers = model.layers // lo.pp
    pbytes, gbytes = PRECISIONS[training.precision]["params"], PRECISIONS[training.precision]["grads"]
    act = micro_batch(model, lo, training) * (model.seq // lo.cp) * h * pbytes  # one b x s x h activation
    stage = stage_params(model, lo)
    rows = []

    def add(dim, kind, nbytes, group, calls, dims=None):
        if group > 1 and calls > 0:
            rows.append({"dim": dim, "kind": kind, "bytes": nbytes, "group": group, "calls": calls,
                         "dims": dims or (dim,)})

    layer, root = stage["per_layer"], stage["root"]
    add("fsdp", "all_gather", layer * pbytes, lo.fsdp, 2 * layers * m)
    add("fsdp", "all_gather", root * pbytes, lo.fsdp, (2 if training.reshard_root else 1) * m)
    add("fsdp", "reduce_scatter", layer * gbytes, lo.fsdp, layers * m)
    add("fsdp", "reduce_scatter", root * gbytes, lo.fsdp, m)
    experts = layers * layer_params(model, lo.tp, lo.ep)["mlp"] if model.experts > 1 else 0
    for dims, n in ((("dp", "cp", "ep"), stage["layers"] + root - experts), (("dp", "cp"), experts)):
        grads = n * gbytes / lo.fsdp
        buckets = max(1, math.ceil(grads / BUCKET_BYTES))
        add("dp", "all_reduce", grads / buckets, math.prod(getattr(lo, d) for d in dims), buckets if grads else 0,
            dims)
    for kind, n in tp_collectives_per_layer(lo.tp, training.sp, training.recompute).items():
        add("tp", kind.replace("-", "_"), act, lo.tp, n * layers * m)
    add("pp", "send", act, lo.pp, pp_sends(lo.pp, m))
    for nbytes, calls in cp_sends(act // lo.tp, lo.cp):  # a rank's heads' k (or v): its 1/tp of h
        add("cp", "send", nbytes, lo.cp, calls * layers * m)
    if model.experts > 1:
        add("ep", "all_to_all", ep_all_to_all_bytes(model, micro_batch(model, lo, training) * (model.seq // lo.cp),
                                                    pbytes), lo.ep, 4 * layers * m)
    return rows


def pp_sends(pp: int, m: int, stage: int | None = None) -> int:
    """Sends of one pipeline stage in a step of ``m`` micro-batches (GPipe or 1F1B alike): each micro-batch's
    activation to the next stage, its gradient to the one before; ``stage=None``: the busiest (a middle
    stage sends both ways). As :func:`distlab.lab.pipeline.run.pipelined_step` records them."""
    if pp == 1:
        return 0
    stages = range(pp) if stage is None else (stage,)
    return max(m * ((s > 0) + (s < pp - 1)) for s in stages)


def cp_sends(kv_bytes: float, cp: int) -> list[tuple[float, int]]:
    """``(bytes, calls)`` of one layer's ring attention on one rank (:mod:`distlab.lab.context_parallel.ring`),
    ``kv_bytes`` the size of the rank's shard of ``k`` (or ``v``): forward ``cp - 1`` sends of the packed
    ``(k, v)``; backward ``cp - 1`` of ``(k, v, dk, dv)`` and a last one of ``(dk, dv)`` home."""
    if cp == 1:
        return []
    return [(2 * kv_bytes, cp), (4 * kv_bytes, cp - 1)]  # (k, v) cp - 1 times, (dk, dv) once


def ep_all_to_all_bytes(model: Model, tokens: int, dtype_bytes: int) -> float:
    """The size ``S`` of each of a MoE layer's four all-to-alls (dispatch and combine, forward and backward)
    for ``tokens`` on a rank, GShard's padded way (:func:`distlab.lab.expert_parallel.padded_dispatch`):
    ``experts x C`` rows of ``hidden``, ``C`` the capacity of :func:`distlab.lab.expert_parallel.capacity`."""
    from distlab.lab.expert_parallel.moe import capacity

    return model.experts * capacity(tokens, model.experts, model.top_k, model.capacity_factor) * model.hidden * \
        dtype_bytes


def plan_layout(model: Model, layout: Layout, training: Training, cluster: Cluster) -> dict:
    """One layout's figures: memory per GPU (and whether it fits), bytes sent per step by degree, the
    collectives' alpha-beta time on their links, the bubble, and the step's time
    (:func:`~distlab.lab.planner_time.step_time`: compute, bubble, critical and exposed communication)."""
    memory = memory_per_gpu(model, layout, training)
    rows = collectives(model, layout, training)
    time = step_time(active_params(model), model, layout, training, cluster, rows)  # every row priced once
    by_dim: dict[str, float] = {}
    for row in rows:
        by_dim[row["dim"]] = by_dim.get(row["dim"], 0.0) + row["calls"] * wire_bytes(row["kind"], row["bytes"],
                                                                                     row["group"])
    return {"layout": layout, "memory": memory, "fits": memory["total"] <= cluster.memory,
            "comm_bytes": sum(by_dim.values()), "comm_by_dim": by_dim,
            "comm_s": time["critical"] + time["overlappable"],
            "bubble": theoretical_bubble(layout.pp, training.micro_batches), "collectives": rows, "time": time}


def active_params(model: Model) -> float:
    """The parameters one token goes through: every dense one, and ``top_k`` of each layer's experts."""
    whole = stage_params(model, Layout())
    idle = model.layers * layer_params(model)["mlp"] * (1 - min(model.top_k, model.experts) / model.experts)
    return whole["layers"] + whole["root"] - idle


def valid(model: Model, layout: Layout, training: Training) -> bool:
    """Whether a layout can run: heads split by ``tp``, layers by ``pp``, the sequence by ``cp``, experts
    by ``ep`` (``ep`` only with experts), and every rank gets a whole micro-batch."""
    return (model.heads % layout.tp == 0 and model.layers % layout.pp == 0 and model.seq % layout.cp == 0
            and model.experts % layout.ep == 0 and (layout.ep == 1 or model.experts > 1)
            and training.batch % (layout.dp * layout.fsdp * layout.ep * training.micro_batches) == 0)


def layouts(world: int) -> list[Layout]:
    """Every assignment of the six degrees whose product is ``world``."""
    divisors = [d for d in range(1, world + 1) if world % d == 0]
    return [Layout(*ds) for ds in itertools.product(divisors, repeat=len(DEGREES)) if math.prod(ds) == world]


def plan(model: Model, cluster: Cluster, training: Training) -> list[dict]:
    """:func:`plan_layout` of every valid layout on ``cluster.gpus``: those that fit first, then by the step's
    time where the cluster has a peak (compute, bubble, exposed communication; then the communication the
    compute must hide), else by the collectives' time; then the bubble and the memory."""
    rows = [plan_layout(model, lo, training, cluster) for lo in layouts(cluster.gpus) if valid(model, lo, training)]
    if cluster.peak_flops > 0:  # equal steps: the one with less to hide behind the compute is the safer
        return sorted(rows, key=lambda r: (not r["fits"], round(r["time"]["step"], 9), r["time"]["overlappable"],
                                           r["bubble"], r["memory"]["total"]))
    return sorted(rows, key=lambda r: (not r["fits"], r["comm_s"], r["bubble"], r["memory"]["total"]))
