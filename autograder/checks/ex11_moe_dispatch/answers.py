"""The runtime's working copy of an exercise 11 graded function (notebook 11 uses it).

``distlab.lab.expert_parallel.dispatch.exchange_counts`` exchanges the counts that uneven all-to-alls need, for
notebook 11's padded dispatch and its imbalance measurement: ``exchange_split_sizes`` is that call on a list
(issue 38). Shared by the rank side (``probes``: whether the graded function *is* the copy, whether the copy ran
from the learner's functions) and the grading process (the feedback). Resolved when this module is imported, on
the rank, before any learner file is loaded (``probes`` imports it).
"""
from __future__ import annotations

from ...rank.runtime_copies import RuntimeCopies

ANSWERS = RuntimeCopies({"exchange_split_sizes": ("distlab.lab.expert_parallel.dispatch.exchange_counts",)})
