"""The measuring instruments, each written once, shared by the notebooks, the benchmarks and the grader.

``timing`` (medians with warm-up and synchronisation, virtual clocks), ``memory`` (bytes saved for
backward, peak memory), ``comm`` (the one recorder of collectives and point-to-point ops, and their
bytes on the wire), ``profiling`` (``torch.profiler`` spans and timelines).

Imports only :mod:`distlab.runtime`; the notebooks' labs (:mod:`distlab.lab`) build on it.
"""
