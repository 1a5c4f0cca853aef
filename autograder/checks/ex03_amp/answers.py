"""The runtime's working copies of exercise 3's graded measuring functions (the notebooks use them).

Shared by the rank side (``probes``: which graded functions *are* a copy, which copies ran) and the
grading process (``observations.Run.copied``: the feedback). Resolved when this module is imported, on
the rank before any learner file is loaded (``probes`` imports it).
"""
from __future__ import annotations

from ...rank.runtime_copies import RuntimeCopies

ANSWERS = RuntimeCopies({
    "median_seconds": ("distlab.measure.timing.median_seconds", "distlab.measure.timing.distributed_median_seconds"),
    # the counter class too: a learner's saved_bytes built on it runs its _pack (issue 22 added it)
    "saved_bytes": ("distlab.measure.memory.saved_tensor_bytes", "distlab.measure.memory.saved_tensor_bytes_by_kind",
                    "distlab.measure.memory.SavedTensors._pack"),
})
