"""Dropless MoE: no capacity, every slot computed, the experts run as one grouped matrix multiply.

GShard's capacity (``moe.py``) buys fixed shapes with dropped tokens. MegaBlocks (Gale et al., 2022,
"MegaBlocks: Efficient Sparse Training with Mixture-of-Experts", arXiv:2211.15841) keeps every slot:
sort the slots by expert, so that each expert's rows are one contiguous block of uneven length, and
run all the experts at once as a *grouped* GEMM over those blocks (block-sparse kernels in MegaBlocks;
``torch._grouped_mm`` with offsets in PyTorch, what torchtitan's ``GroupedExperts`` calls). DeepSeek-V3
trains dropless too. With expert parallelism the sort is what makes each rank's dispatch one contiguous
block per destination rank (exercise 11 does that sort across ranks, for the slots kept).

``torch._grouped_mm`` is a private operator. In torch 2.13 it has a CPU kernel, forward and backward,
which wants every stride a multiple of 16 bytes (fp32: widths divisible by 4); :func:`grouped_mm_works`
tries it, and :func:`dropless_forward` falls back to a loop over the experts' blocks where it fails.
Both give the single-process MoE's output and gradients when its capacity drops nothing.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .moe import MoE, MoEOutput, load_balancing_loss, tokens_per_expert, assign

KERNELS = ("grouped_mm", "loop")


def grouped_mm_works(hidden: int, ffn: int, dtype: torch.dtype = torch.float32) -> bool:
    """Whether ``torch._grouped_mm`` runs here for these widths, forward and backward (tried on 3 rows)."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    x = torch.zeros(3, hidden, dtype=dtype, requires_grad=True)
    w = torch.zeros(2, hidden, ffn, dtype=dtype, requires_grad=True)
    try:
        torch._grouped_mm(x, w, offs=torch.tensor([1, 3], dtype=torch.int32)).backward(torch.ones(3, ffn, dtype=dtype))
    except (RuntimeError, NotImplementedError):
        return False
    return True


def _stacked(moe: MoE) -> tuple[torch.Tensor, ...]:
    """The experts' weights as ``(E, in, out)`` stacks and their biases as ``(E, out)``: differentiable
    views of ``moe``'s own parameters (``torch.stack``), so the gradients land on them."""
    first = [e[0] for e in moe.experts]
    second = [e[2] for e in moe.experts]
    return (torch.stack([m.weight.t() for m in first]), torch.stack([m.bias for m in first]),
            torch.stack([m.weight.t() for m in second]), torch.stack([m.bias for m in second]))


def grouped_ffn(rows: torch.Tensor, counts: torch.Tensor, moe: MoE, kernel: str = "grouped_mm") -> torch.Tensor:
    """Expert ``e``'s FFN on its block of ``rows`` (``counts[e]`` rows, blocks in expert order)."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, not {kernel!r}")
    if kernel == "loop":
        blocks = rows.split(counts.tolist())
        return torch.cat([moe.experts[e](block) for e, block in enumerate(blocks)])
    w1, b1, w2, b2 = _stacked(moe)
    offs = counts.cumsum(0).to(torch.int32)   # where each expert's block ends
    h = F.gelu(torch._grouped_mm(rows, w1, offs=offs) + b1.repeat_interleave(counts, dim=0))
    return torch._grouped_mm(h, w2, offs=offs) + b2.repeat_interleave(counts, dim=0)


def dropless_forward(moe: MoE, x: torch.Tensor, kernel: str = "grouped_mm") -> MoEOutput:
    """``moe`` on ``x`` with no capacity: every slot sorted by expert, the experts run by ``kernel``
    (``"grouped_mm"``: one ``torch._grouped_mm`` per matrix; ``"loop"``: one call per expert)."""
    routing = moe.router(x)
    n = moe.n_experts
    slots = assign(routing, n, cap=routing.experts.numel())   # capacity = every slot: nothing dropped
    order = torch.argsort(slots.expert, stable=True)            # each expert's slots one block, token order
    counts = torch.bincount(slots.expert, minlength=n)
    out = grouped_ffn(x[slots.token[order]], counts, moe, kernel)
    y = torch.zeros_like(x).index_add(0, slots.token[order], slots.gate[order, None] * out)
    return MoEOutput(y, load_balancing_loss(routing, n), tokens_per_expert(slots, n), 0, slots)
