"""Pipeline bubble: measured with torch.distributed.pipelining against (p-1)/(m+p-1).

Two stages (two ranks), GPipe, m = 1, 2, 4, 8 micro-batches of one batch of 256, all in
one job. Each stage's forwards and backwards are timed by distlab.pipeline.TimedStage;
the bubble is the share of stages x step time in which no stage computed. It includes
the send/recv time, which the formula ignores, so measured > theory, more so when
micro-batches get small (on a CPU gloo's per-message latency is ~0.1-1 ms).
"""
from __future__ import annotations

from distlab import torchrun
from distlab.pipeline import as_events, bubble_fraction, theoretical_bubble

from . import Row

MICRO = (1, 2, 4, 8)
STAGES = 2


def rows() -> list[Row]:
    runs = [dict(schedule="gpipe", n_microbatches=m, width=1024, batch=256) for m in MICRO]
    res = torchrun("distlab.pipeline_run:pipeline_sweep", STAGES, args=(runs,), timeout=300).results
    out = []
    for i, m in enumerate(MICRO):
        events = as_events([res[r][i]["events"] for r in range(STAGES)])
        ok = all(res[r][i]["grads_match"] for r in range(STAGES))
        theory = theoretical_bubble(STAGES, m)
        out.append(Row("pipeline", f"GPipe bubble, p={STAGES}, m={m}", bubble_fraction(events), "fraction",
                       f"theory (p-1)/(m+p-1) = {theory:.3f}; gradients match unsplit: {ok}"))
    return out
