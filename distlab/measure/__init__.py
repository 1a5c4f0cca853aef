"""The measuring instruments, each written once, shared by the notebooks, the benchmarks and the grader.

``timing`` (medians with warm-up and synchronisation, virtual clocks), ``memory`` (the one counter
of tensors saved for backward, the one peak: ``live_storage`` on the CPU, ``max_memory_allocated``
on a GPU), ``comm`` (the one recorder of collectives and point-to-point ops, and their bytes on the
wire), ``ddp_hooks`` (the one DDP comm hook that logs buckets), ``profiling`` (``torch.profiler``
spans and timelines), ``flops`` (``FlopCounterMode``, with SDPA's CPU kernel counted).

Imports only :mod:`distlab.runtime`; the notebooks' labs (:mod:`distlab.lab`) build on it.
"""
