"""Exercise 10, written independently: isend/irecv imported by name, k and v as two messages, the ring
run the other way round (receive from the next rank), and the online softmax kept as a running maximum,
numerator and denominator (Milakov & Gimelshein 2018) instead of an lse. The backward: einsum, the mask
by torch.where, and dk, dv as two messages of their own, posted after the block's compute while k, v's
exchange (posted before it) is in flight, every hop including the last, home."""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch.distributed import irecv, isend


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    me, w = dist.get_rank(), dist.get_world_size()
    n = q.size(-2)
    rows = me * n + torch.arange(n).view(-1, 1)
    m = torch.full((*q.shape[:-1], 1), -math.inf)
    num, den = torch.zeros_like(q), torch.zeros_like(m)
    keys, values, owner = k, v, me
    for hop in range(w):
        pending = []
        if hop + 1 < w:
            nk, nv = torch.empty_like(keys), torch.empty_like(values)
            pending = [isend(keys, (me - 1) % w), isend(values, (me - 1) % w),
                       irecv(nk, (me + 1) % w), irecv(nv, (me + 1) % w)]
        cols = owner * n + torch.arange(n).view(1, -1)
        if owner * n <= me * n + n - 1:
            s = torch.einsum("bhqd,bhkd->bhqk", q, keys) / math.sqrt(q.size(-1))
            s = torch.where(cols <= rows, s, torch.tensor(-math.inf))
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            shrink, p = torch.exp(m - m_new), torch.exp(s - m_new)
            num = num * shrink + p @ values
            den = den * shrink + p.sum(-1, keepdim=True)
            m = m_new
        for req in pending:
            req.wait()
        if pending:
            keys, values, owner = nk, nv, (owner + 1) % w
    return num / den


def ring_attention_backward(q, k, v, out, lse, dout):
    me, w = dist.get_rank(), dist.get_world_size()
    n, c = q.size(-2), 1.0 / math.sqrt(q.size(-1))
    rows = me * n + torch.arange(n).view(-1, 1)
    d = torch.einsum("bhqd,bhqd->bhq", dout, out).unsqueeze(-1)
    dq = torch.zeros_like(q)
    keys, values, owner = k, v, me
    gk, gv = torch.zeros_like(k), torch.zeros_like(v)
    for hop in range(w):
        pending, nk, nv = [], None, None
        if hop + 1 < w:  # the next shard's k, v: posted first, in flight during the compute
            nk, nv = torch.empty_like(keys), torch.empty_like(values)
            pending = [isend(keys, (me - 1) % w), isend(values, (me - 1) % w),
                       irecv(nk, (me + 1) % w), irecv(nv, (me + 1) % w)]
        if owner <= me:
            cols = owner * n + torch.arange(n).view(1, -1)
            s = torch.einsum("bhqd,bhkd->bhqk", q, keys) * c
            prob = torch.where(cols <= rows, torch.exp(s - lse), torch.zeros(()))
            dprob = torch.einsum("bhqd,bhkd->bhqk", dout, values)
            dscore = prob * (dprob - d)
            dq = dq + c * torch.einsum("bhqk,bhkd->bhqd", dscore, keys)
            gk = gk + c * torch.einsum("bhqk,bhqd->bhkd", dscore, q)
            gv = gv + torch.einsum("bhqk,bhqd->bhkd", prob, dout)
        ngk, ngv = torch.empty_like(gk), torch.empty_like(gv)  # the accumulators go where their shard goes
        pending += [isend(gk, (me - 1) % w), isend(gv, (me - 1) % w), irecv(ngk, (me + 1) % w),
                    irecv(ngv, (me + 1) % w)]
        for req in pending:
            req.wait()
        gk, gv = ngk, ngv
        if nk is not None:
            keys, values, owner = nk, nv, (owner + 1) % w
    return dq, gk, gv
