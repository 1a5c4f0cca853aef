"""A tiny decoder-only transformer: the model context parallelism (notebook 10) and the attention block of
tensor parallelism (notebook 08) split.

Pre-norm blocks as in Llama (Touvron et al. 2023): ``x + attn(norm(x))``, then ``x + mlp(norm(x))``, with
RMSNorm (Zhang & Sennrich 2019, ``nn.RMSNorm``) and multi-head causal self-attention computed by
``F.scaled_dot_product_attention`` (Vaswani et al. 2017). Positions are learned embeddings, so that the
attention itself is the one operation that mixes positions: what a sequence split has to get right.
Small enough that a step takes milliseconds on one CPU core.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class TransformerConfig:
    vocab: int = 64
    dim: int = 32
    n_heads: int = 4
    n_layers: int = 2
    max_seq: int = 128
    mlp_ratio: int = 4


class Attention(nn.Module):
    """Multi-head self-attention: ``wq, wk, wv`` project to ``n_heads`` heads of ``dim / n_heads``, ``wo``
    projects back. Separate ``wq/wk/wv`` (not one fused QKV) so that a head split is a split of rows."""

    def __init__(self, dim: int, n_heads: int):
        super().__init__()
        if dim % n_heads:
            raise ValueError(f"dim {dim} is not a multiple of n_heads {n_heads}")
        self.n_heads, self.head_dim = n_heads, dim // n_heads
        self.wq, self.wk, self.wv = (nn.Linear(dim, dim, bias=False) for _ in range(3))
        self.wo = nn.Linear(dim, dim, bias=False)

    def heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``q, k, v`` of ``x`` (``B x S x dim``), each ``B x n_heads x S x head_dim``; ``n_heads`` is read
        from the projection's width, so a module holding a slice of the heads works too."""
        b, s, _ = x.shape
        return tuple(w(x).view(b, s, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))

    def forward(self, x: torch.Tensor, causal: bool = True) -> torch.Tensor:
        q, k, v = self.heads(x)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return self.wo(out.transpose(1, 2).flatten(2))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1, self.w2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.gelu(self.w1(x)))


class Block(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.attn_norm, self.mlp_norm = nn.RMSNorm(cfg.dim), nn.RMSNorm(cfg.dim)
        self.attn = Attention(cfg.dim, cfg.n_heads)
        self.mlp = FeedForward(cfg.dim, cfg.mlp_ratio * cfg.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class Transformer(nn.Module):
    """Token and position embeddings, ``n_layers`` blocks, a final RMSNorm and the head to ``vocab`` logits."""

    def __init__(self, cfg: TransformerConfig = TransformerConfig()):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab, cfg.dim)
        self.pos = nn.Embedding(cfg.max_seq, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.RMSNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """``tokens`` (``B x S`` ints, ``S <= max_seq``) -> logits ``B x S x vocab``."""
        s = tokens.shape[1]
        x = self.tok(tokens) + self.pos(torch.arange(s, device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def make_transformer(seed: int, **kwargs) -> Transformer:
    """A :class:`Transformer` (``kwargs``: :class:`TransformerConfig`'s fields) whose weights depend only
    on ``seed``."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return Transformer(TransformerConfig(**kwargs))


def next_token_loss(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """The language-modelling loss: the cross-entropy of each position's logits against the next token."""
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
