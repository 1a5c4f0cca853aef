"""The dispatch all-to-all's time against routing imbalance: the busiest rank sets the pace.

An all-to-all finishes when its last rank has received everything. When the router sends a share
``rho / W`` of every rank's tokens to one *hot* expert (``rho = 1``: balanced; ``rho = W``: every token
to it), the hot expert's rank receives ``rho`` times the balanced rows, and (on a network where each
rank's link is the limit) the collective takes about ``rho`` times as long: the imbalance is paid
in communication before the hot expert's compute, ``rho`` times the balanced too, is paid again.
Capacity (GShard) bounds ``rho`` by dropping tokens; dropless training (``dropless.py``) must balance
the router instead (``balance.py``).

:func:`a2a_imbalance_report` times ``dist.all_to_all_single`` with the uneven splits of each ``rho``
(``distlab.measure.timing.distributed_median_seconds``: warm-up, a barrier, blocks of calls, the slowest
rank's time, the median block), beside the rows each rank received. On CPU ranks that share cores the
copies compete for memory bandwidth rather than for links, so the notebook shows what was measured
beside the ``rho`` a link-bound network would give, and says which machine measured it.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from distlab.measure.timing import distributed_median_seconds, median_seconds, slowest_rank

from .dispatch import exchange_counts

RATIOS = (1.0, 1.5, 2.0, 3.0, 4.0)


def imbalanced_splits(tokens: int, world: int, rho: float) -> list[int]:
    """Rows a rank sends each rank when a share ``rho / world`` of its ``tokens`` goes to rank 0's
    (hot) expert and the rest is spread evenly over the others (``1 <= rho <= world``)."""
    if not 1.0 <= rho <= world:
        raise ValueError(f"rho must be between 1 (balanced) and the world size {world}, not {rho}")
    if world == 1:
        return [tokens]
    hot = round(rho * tokens / world)
    rest, others = tokens - hot, world - 1
    return [hot, *(rest // others + (j < rest % others) for j in range(others))]


def _dispatch(x: torch.Tensor, send: list[int]):
    """The rows this rank receives from each rank, their buffer, and the dispatch all-to-all filling it."""
    recv = exchange_counts(torch.tensor(send, device=x.device)).tolist()
    received = x.new_empty(sum(recv), x.shape[1])
    return recv, received, lambda: dist.all_to_all_single(received, x, recv, send)


def _busiest_expert_seconds(expert: torch.nn.Module, rows: torch.Tensor, min_run_time: float) -> float:
    """Each rank's expert on the rows it received, timed one rank at a time while the others wait at a
    barrier (so that no rank shares a core with another, as each GPU computes alone): the slowest's."""
    mine = 0.0
    for turn in range(dist.get_world_size()):
        dist.barrier()
        if dist.get_rank() == turn:
            mine = median_seconds(lambda: expert(rows), min_run_time=min_run_time)
    return slowest_rank(mine, rows.device)


@torch.no_grad()
def a2a_imbalance_report(*, tokens: int = 2048, hidden: int = 128, ffn: int = 256,
                         ratios: tuple[float, ...] = RATIOS, calls: int = 3, repeats: int = 5,
                         min_run_time: float = 0.05) -> dict:
    """Runs on every rank (the process group up): for each ``rho`` of ``ratios``, the rows this rank and the
    busiest rank received; the median seconds (the slowest rank's) of the uneven dispatch all-to-all of
    ``tokens x hidden`` float32 rows per rank; and the busiest rank's expert (``hidden -> ffn -> hidden``)
    on what it received, each rank timed alone on one thread."""
    from distlab.runtime.distributed import device

    from .moe import expert_mlp

    dev, world = device(), dist.get_world_size()
    x, expert = torch.randn(tokens, hidden, device=dev), expert_mlp(hidden, ffn).to(dev)
    exchanges = {rho: (send, *_dispatch(x, send)) for rho in ratios
                 for send in [imbalanced_splits(tokens, world, rho)]}
    for *_, a2a in exchanges.values():   # each split once before any is timed (the first sets up the pairs)
        a2a()
    rows = []
    for rho, (send, recv, received, a2a) in exchanges.items():
        seconds = distributed_median_seconds(a2a, calls=calls, repeats=repeats, device=dev, warmup=1)
        busiest = torch.tensor([sum(recv)], device=dev)
        dist.all_reduce(busiest, op=dist.ReduceOp.MAX)
        rows.append({"rho": rho, "send": send, "recv": recv, "busiest_rows": int(busiest.item()),
                     "all_to_all": seconds, "expert": _busiest_expert_seconds(expert, received, min_run_time)})
    return {"rank": dist.get_rank(), "world": world, "tokens": tokens, "hidden": hidden, "ffn": ffn, "rows": rows}
