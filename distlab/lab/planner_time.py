"""The planner's step time: compute, the bubble priced in compute, each collective on the link it uses, and
the data-parallel communication that hides behind the compute.

:mod:`distlab.lab.planner` counts what a layout holds and sends; this module turns the count into seconds,
with three things that one bandwidth and no compute cannot tell apart:

* **compute**: the FLOPs the hardware does per token, Kaplan's ``6 N`` (``8 N`` under full recomputation,
  :func:`distlab.lab.mfu.hardware_flops_per_token`; a MoE counts its active parameters), over the GPUs, at
  ``efficiency`` of each GPU's peak (the FLOPs the hardware does, so with full recomputation the HFU of
  Chowdhery et al. 2022, appendix B; the MFU otherwise). Attention's ``s^2`` FLOPs are left out, as ``6 N``
  leaves them out;
* **the bubble**, priced as idle compute: a 1F1B pipeline of ``p`` stages and ``m`` micro-batches takes
  ``(m + p - 1) / m`` of its stages' compute (Narayanan et al. 2021, section 2.2), the idle fraction being
  :func:`distlab.lab.pipeline.timeline.theoretical_bubble`;
* **links**: ranks are numbered with ``tp`` innermost, then ``cp``, ``ep``, ``fsdp``, ``dp``, ``pp``
  (Megatron-LM's order; torchtitan's mesh is the same from ``pp`` inwards), ``gpus_per_node`` to a node; a
  group whose ranks lie in one node is priced at the node's bandwidth (NVLink), one that spans nodes at the
  network's (InfiniBand), :func:`link`;
* **overlap**: tensor, context and expert parallelism's collectives and the pipeline's sends wait for their
  results (the critical path); DDP's bucketed all-reduce runs during the backward (``2/3`` of the compute:
  ``4 N`` of ``6 N``), FSDP's gathers and reduce-scatters during the forward and the backward (prefetch), so
  only what exceeds that window is exposed (Li et al. 2020; Zhao et al. 2023, *PyTorch FSDP*).

It is still a model: no kernel launch, memory-bandwidth-bound op or contention between groups sharing a link
is priced, and the efficiency is an input, not a prediction.
"""
from __future__ import annotations

import math

from distlab.lab.bandwidth import allreduce_time
from distlab.lab.mfu import hardware_flops_per_token
from distlab.lab.pipeline.timeline import theoretical_bubble
from distlab.measure.comm import wire_bytes

RANK_ORDER = ("tp", "cp", "ep", "fsdp", "dp", "pp")  # innermost first: consecutive ranks differ in tp
CRITICAL = ("tp", "cp", "ep", "pp")  # their results are waited for; dp and fsdp overlap the compute
BACKWARD_SHARE = 2 / 3  # of a step's compute: 4 N of 6 N per token


def stride(dim: str, layout, order: tuple[str, ...] = RANK_ORDER) -> int:
    """How many ranks apart two neighbours in a ``dim`` group are: the product of the degrees inside it."""
    return math.prod(getattr(layout, d) for d in order[:order.index(dim)])


def spans_nodes(dims: tuple[str, ...], layout, gpus_per_node: int, order: tuple[str, ...] = RANK_ORDER) -> bool:
    """Whether a group over ``dims`` has ranks on more than one node, ranks numbered in ``order`` (innermost
    first): its outermost dimension of degree > 1 reaches past a node (``gpus_per_node`` 0: one node)."""
    used = [d for d in dims if getattr(layout, d) > 1]
    if not used or gpus_per_node <= 0:
        return False
    outer = max(used, key=order.index)
    return stride(outer, layout, order) * getattr(layout, outer) > gpus_per_node


def link(dims: tuple[str, ...], layout, cluster) -> tuple[float, float]:
    """``(bandwidth, latency)`` of the slowest link a group over ``dims`` uses, ranks placed in the cluster's
    ``placement`` order: the network's between nodes (where the cluster has one), the node's own within."""
    if cluster.inter_bandwidth > 0 and spans_nodes(dims, layout, cluster.gpus_per_node, cluster.placement):
        return cluster.inter_bandwidth, cluster.inter_latency
    return cluster.bandwidth, cluster.latency


def row_seconds(row: dict, layout, cluster) -> float:
    """The alpha-beta time of a collective row's calls on the link its group uses: ``2(n-1)`` latencies an
    all-reduce (:func:`~distlab.lab.bandwidth.allreduce_time`), ``n-1`` a gather, scatter or all-to-all, one a
    send."""
    bandwidth, latency = link(row["dims"], layout, cluster)
    kind, n, s = row["kind"], row["group"], row["bytes"]
    if kind == "all_reduce":
        one = allreduce_time(s, n, bandwidth, latency)
    else:
        one = (1 if kind == "send" else n - 1) * latency + wire_bytes(kind, s, n) / bandwidth
    return row["calls"] * one


def compute_seconds(n_active: float, model, layout, training, cluster) -> float:
    """The seconds each GPU computes in a step of ``n_active`` parameters per token (a MoE's active ones): the
    step's hardware FLOPs over ``world x peak x efficiency``; 0 where the cluster has no peak."""
    if cluster.peak_flops <= 0:
        return 0.0
    recompute = "full" if training.recompute == "full" else "none"  # selective recomputes little: 6 N
    flops = hardware_flops_per_token(n_active, recompute) * training.batch * model.seq
    return flops / (layout.world * cluster.peak_flops * cluster.efficiency)


def step_time(n_active: float, model, layout, training, cluster, rows: list[dict]) -> dict:
    """A step's seconds, its collectives ``rows`` (:func:`distlab.lab.planner.collectives`) on their links:
    ``compute`` with the ``bubble`` (idle compute), the ``critical`` collectives' time, the data-parallel
    communication (``overlappable``) and what of it the compute does not hide (``exposed``); ``step`` their
    sum."""
    compute = compute_seconds(n_active, model, layout, training, cluster)
    b = theoretical_bubble(layout.pp, training.micro_batches)
    bubble = compute * b / (1 - b)
    critical = sum(row_seconds(r, layout, cluster) for r in rows if r["dim"] in CRITICAL)
    overlappable = sum(row_seconds(r, layout, cluster) for r in rows if r["dim"] not in CRITICAL)
    window = compute * (1.0 if layout.fsdp > 1 else BACKWARD_SHARE)
    exposed = max(0.0, overlappable - window)
    return {"compute": compute, "bubble": bubble, "critical": critical, "overlappable": overlappable,
            "exposed": exposed, "step": compute + bubble + critical + exposed}
