"""FLOPs counted from the matrix products' shapes: the one counter, ``torch.utils.flop_counter.FlopCounterMode``.

``FlopCounterMode`` knows ``mm``, ``bmm``, convolutions and the GPU kernels of
``F.scaled_dot_product_attention``, but not the CPU one (``_scaled_dot_product_flash_attention_for_cpu``,
which SDPA runs on every CPU input): without a formula, attention written with SDPA would count 0 on a
laptop and its real cost on a GPU. :func:`flop_counter` adds the CPU kernel with PyTorch's own formula
(``sdpa_flop_count``: ``q k^T`` and ``p v``, every score counted, masked or not, as the kernel computes them).

Used by :mod:`distlab.lab.mfu` (a step's FLOPs against ``6 N``) and by exercise 10's check (the work each
rank of a causal ring does: equal on every rank, nothing the mask hides entirely).
"""
from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

_aten = torch.ops.aten


def _cpu_sdpa(query, key, value, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query, key, value)


def _cpu_sdpa_backward(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out, query, key, value)


CPU_ATTENTION = {_aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa,
                 _aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_sdpa_backward}


def flop_counter() -> FlopCounterMode:
    """A ``FlopCounterMode`` (no table printed) that also counts SDPA's CPU kernel; ``get_total_flops()`` after."""
    return FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION)
