"""The planner's pipeline, context- and expert-parallel figures against the labs' own runs, in one launch.

:func:`planner_runs_job` runs, on every rank of one job, the rank programs of the three labs at their
smallest sizes, unchanged: :func:`distlab.lab.pipeline.run.pipelined_step` (``Schedule1F1B`` of
``torch.distributed.pipelining``, ``p = W`` stages, its timed step recorded by
:class:`~distlab.measure.comm.CollectiveRecorder`), :func:`distlab.lab.context_parallel.jobs.parity_report`
(the ring attention of notebook 10, forward and backward) and
:func:`distlab.lab.expert_parallel.dispatch.ep_report` (notebook 11's padded all-to-all MoE, one expert a
rank). Each lab's workload is then written as the planner's inputs (:func:`pp_inputs`, :func:`cp_inputs`,
:func:`ep_inputs`), so that :func:`distlab.lab.planner.collectives` prices the very run that was measured.

What is compared, and how exactly (``tests/distlab/test_planner.py``):

* **bytes and calls**: every send of each pipeline stage, the ring's sends, the four all-to-alls, as
  recorded, against the planner's rows: equal.
* **the bubble**: the planner's ``(p-1)/(m+p-1)`` is a count of idle slots, not a wall time (on 2 loaded
  cores the measured wall-time bubble also holds the schedule's Python and the waits for a core, see
  notebook 07). So the measured timeline's order of actions on each stage (:func:`stage_orders`) is
  replayed with every forward one slot and every backward two (:func:`ideal_schedule` with ``order``),
  and that replay's idle share is compared: the bubble the schedule torch ran determines.
* **activation memory**: the planner holds ``min(p - s, m)`` micro-batches' activations on stage ``s`` of
  a 1F1B pipeline (:func:`~distlab.lab.planner.in_flight_micro_batches`; the first stage's, ``min(p, m)``,
  is its memory figure). Each stage's measured peak of saved bytes under 1F1B
  (:class:`~distlab.lab.pipeline.costs.SavedBytes`), in micro-batches (one micro-batch's bytes: GPipe's
  peak over ``m``), is that count. The per-micro-batch bytes themselves are the transformer's (Korthikanti
  et al. 2022), not this MLP's, so only the count is checked here.
"""
from __future__ import annotations

from distlab.lab.pipeline.timeline import as_events, bubble_fraction, ideal_schedule, stage_orders
from distlab.lab.planner import Layout, Model, Training

#: The workloads: the pipeline lab's MLP with a fixed micro-batch (4 Linear layers, 64 features), the
#: context-parallel lab's parity shape, the expert-parallel lab's default MoE.
PP = dict(width=64, depth=4, microbatch_rows=8, memory=True, record=True)
#: ``(schedule, m)`` of the pipeline runs: 1F1B needs ``m >= p``; GPipe's stage 0 holds all ``m``
#: micro-batches, which gives one micro-batch's saved bytes.
PP_RUNS = (("gpipe", 4), ("1f1b", 4), ("1f1b", 8))
CP_SEQ = 32
EP_TOKENS = 64


def planner_runs_job() -> dict:
    """Runs on every rank: the three labs' rank programs in one process group; their reports."""
    import torch.distributed as dist

    from distlab.lab.context_parallel.jobs import parity_report
    from distlab.lab.expert_parallel.dispatch import ep_report
    from distlab.lab.pipeline.run import pipelined_step
    from distlab.runtime.distributed import init_distributed, shutdown

    init_distributed()
    try:
        pp = {(s, m): pipelined_step(s, m, **PP) for s, m in PP_RUNS}
        dist.barrier()
        return {"rank": dist.get_rank(), "world": dist.get_world_size(), "pp": pp,
                "cp": parity_report(seq=CP_SEQ), "ep": ep_report(tokens=EP_TOKENS)}
    finally:
        shutdown()


def run_planner_runs(nprocs: int = 4, timeout: float = 120) -> list[dict]:
    """Launch :func:`planner_runs_job` on ``nprocs`` ranks; every rank's report, in rank order."""
    from distlab.runtime.launch import torchrun

    return torchrun(planner_runs_job, nprocs, timeout=timeout).results


def pp_inputs(world: int, m: int) -> tuple[Model, Layout, Training]:
    """The pipeline lab's MLP as the planner sees it: ``depth`` layers whose activations, ``rows x width``
    float32 (a sequence of one position), cross each stage boundary."""
    model = Model(layers=PP["depth"], hidden=PP["width"], heads=1, seq=1, vocab=10)
    return model, Layout(pp=world), Training(batch=PP["microbatch_rows"] * m, micro_batches=m, precision="fp32")


def cp_inputs(world: int, heads: int = 2, head_dim: int = 16) -> tuple[Model, Layout, Training]:
    """The ring's parity shape (one sequence of :data:`CP_SEQ`, ``heads x head_dim``) as one attention layer."""
    model = Model(layers=1, hidden=heads * head_dim, heads=heads, seq=CP_SEQ, vocab=1)
    return model, Layout(cp=world), Training(batch=1, precision="fp32")


def ep_inputs(world: int, hidden: int = 16, top_k: int = 1, capacity_factor: float = 1.25
              ) -> tuple[Model, Layout, Training]:
    """The MoE lab's layer: ``W`` experts, one a rank, :data:`EP_TOKENS` tokens a rank (one sequence each)."""
    model = Model(layers=1, hidden=hidden, heads=1, seq=EP_TOKENS, vocab=1, experts=world, top_k=top_k,
                  capacity_factor=capacity_factor)
    return model, Layout(ep=world), Training(batch=world, precision="fp32")


def slot_bubble(per_rank: list[dict], p: int, m: int) -> float:
    """The bubble of the order of actions a measured timeline ran, in slots (forward 1, backward 2)."""
    events = as_events([r["events"] for r in per_rank])
    return bubble_fraction(ideal_schedule(p, m, order=stage_orders(events)))


def sends(ops: list[tuple]) -> dict[int, int]:
    """``{bytes: calls}`` of the sends among recorded ``(kind, bytes, ...)`` ops."""
    out: dict[int, int] = {}
    for kind, nbytes, *_ in ops:
        if kind == "send":
            out[nbytes] = out.get(nbytes, 0) + 1
    return out
