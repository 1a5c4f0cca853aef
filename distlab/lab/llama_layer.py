"""A Llama layer's activations: the per-layer formula beside Korthikanti et al.'s GPT layer, and the run it is
checked against (notebook 08).

Korthikanti et al. (2022, Table 2) count GPT's layer: a ``4h`` GeLU MLP, dropout, the attention scores stored,
``s b h (34 + 5 a s / h)`` bytes with 16-bit activations
(:func:`distlab.lab.activation_memory.transformer_layer_bytes`). A Llama layer (Touvron et al. 2023; Llama 3, 2024)
differs in four ways: RMSNorm, no dropout, grouped-query attention (``k`` and ``v`` of ``h_kv = kv_heads x
head_dim`` columns, ``h_kv <= h``) computed by a fused attention that keeps no scores (FlashAttention; PyTorch's
``scaled_dot_product_attention``), and a SwiGLU MLP of width ``f`` (Shazeer 2020: ``w2(silu(w1 x) * w3 x)``).
:class:`LlamaBlock` is such a layer (without rotary embeddings: they keep only their cos and sin tables, and the
attention keeps the rotated ``q`` and ``k`` in place of these), and what eager PyTorch 2.13 saves for its
backward, per token, in a run with 16-bit weights and activations (``act`` bytes an element) is, storage by
storage:

* each RMSNorm (two): its input and its output upcast to fp32, and one fp32 ``rstd``: ``2 (8h + 4)``;
* the inputs of the projections: the first norm's output (shared by ``wq, wk, wv``), the attention's output
  (``wo``'s input, the same storage as what the attention keeps), the second norm's (``w1, w3``): ``3 act h``;
* the attention: ``q`` (``act h``), ``k`` and ``v`` (``2 act h_kv``), and its log-sum-exp (fp32, one per head:
  ``4 a``);
* the SwiGLU: ``w1 x``, ``w3 x``, ``silu(w1 x)`` and ``w2``'s input, ``4 act f``.

So ``s b (16h + 8 + act (4h + 2 h_kv + 4f) + 4a)`` bytes a layer (:func:`llama_layer_bytes`); the norms keep
fp32 copies whatever the run's dtype, so an fp32 run is the same formula with ``act = 4``. Checked to the byte against
``distlab.measure.memory.saved_tensor_bytes`` of :class:`LlamaBlock` (``tests/distlab/test_llama_layer.py``).
A fused RMSNorm (``torch.compile``, Apex's) keeps ``act h + 4`` per norm instead of ``8h + 4``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class LlamaBlock(nn.Module):
    """Pre-norm ``x + attn(norm(x))``, then ``x + swiglu(norm(x))``: grouped-query causal attention of ``heads``
    query heads sharing ``kv_heads`` key/value heads, and a SwiGLU MLP of width ``ffn``; no bias, no dropout."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, ffn: int):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, hidden // heads
        self.attn_norm, self.mlp_norm = nn.RMSNorm(hidden), nn.RMSNorm(hidden)
        self.wq, self.wo = nn.Linear(hidden, hidden, bias=False), nn.Linear(hidden, hidden, bias=False)
        self.wk, self.wv = (nn.Linear(hidden, kv_heads * self.head_dim, bias=False) for _ in range(2))
        self.w1, self.w3 = (nn.Linear(hidden, ffn, bias=False) for _ in range(2))
        self.w2 = nn.Linear(ffn, hidden, bias=False)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (w(x).view(b, s, n, self.head_dim).transpose(1, 2)
                   for w, n in ((self.wq, self.heads), (self.wk, self.kv_heads), (self.wv, self.kv_heads)))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.wo(out.transpose(1, 2).flatten(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attn_norm(x))
        h = self.mlp_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


def llama_layer_bytes(seq: int, batch: int, hidden: int, heads: int, kv_heads: int, ffn: int,
                      act_bytes: int = 2) -> int:
    """Bytes one :class:`LlamaBlock` keeps for its backward in eager PyTorch (the module's docstring counts them)."""
    kv = kv_heads * (hidden // heads)
    return seq * batch * (16 * hidden + 8 + act_bytes * (4 * hidden + 2 * kv + 4 * ffn) + 4 * heads)


def measured_layer_bytes(seq: int, batch: int, hidden: int, heads: int, kv_heads: int, ffn: int,
                         dtype: torch.dtype = torch.bfloat16) -> int:
    """What a :class:`LlamaBlock` of that shape saves for its backward, measured: the distinct storages autograd
    keeps (``distlab.measure.memory.saved_tensor_bytes``), its weights left out (they exist anyway)."""
    from distlab.measure.memory import saved_tensor_bytes

    block = LlamaBlock(hidden, heads, kv_heads, ffn).to(dtype)
    x = torch.randn(batch, seq, hidden, dtype=dtype, requires_grad=True)
    return saved_tensor_bytes(lambda: block(x), exclude=list(block.parameters()))
