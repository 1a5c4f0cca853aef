"""Exercise 10, written independently: isend/irecv imported by name, k and v as two messages, the ring
run the other way round (receive from the next rank), the work cut into pairs of chunks (a query chunk
against a key chunk: skipped when the key chunk comes after, masked on the diagonal, whole before it), and
the online softmax kept as a running maximum, numerator and denominator per query chunk (Milakov &
Gimelshein 2018) instead of an lse. The backward: einsum, the mask by torch.where, and dk, dv as two
messages of their own, posted after the block's compute while k, v's exchange (posted before it) is in
flight, every hop including the last, home."""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch.distributed import irecv, isend


def _chunks(rank: int, world: int) -> tuple[int, int]:
    return rank, 2 * world - 1 - rank


def _pairs(me: int, owner: int, world: int):
    """(query half, key half, diagonal?) of every pair of chunks that some query sees."""
    for i, a in enumerate(_chunks(me, world)):
        for j, b in enumerate(_chunks(owner, world)):
            if b <= a:
                yield i, j, a == b


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    me, w = dist.get_rank(), dist.get_world_size()
    c = q.size(-2) // 2
    tri = torch.ones(c, c, dtype=torch.bool).tril()
    qs = q.split(c, -2)
    m = [torch.full((*x.shape[:-1], 1), -math.inf) for x in qs]
    num, den = [torch.zeros_like(x) for x in qs], [torch.zeros_like(x) for x in m]
    keys, values, owner = k, v, me
    for hop in range(w):
        pending = []
        if hop + 1 < w:
            nk, nv = torch.empty_like(keys), torch.empty_like(values)
            pending = [isend(keys, (me - 1) % w), isend(values, (me - 1) % w),
                       irecv(nk, (me + 1) % w), irecv(nv, (me + 1) % w)]
        ks, vs = keys.split(c, -2), values.split(c, -2)
        for i, j, diagonal in _pairs(me, owner, w):
            s = torch.einsum("bhqd,bhkd->bhqk", qs[i], ks[j]) / math.sqrt(q.size(-1))
            if diagonal:
                s = torch.where(tri, s, torch.tensor(-math.inf))
            m_new = torch.maximum(m[i], s.amax(-1, keepdim=True))
            shrink, p = torch.exp(m[i] - m_new), torch.exp(s - m_new)
            num[i] = num[i] * shrink + p @ vs[j]
            den[i] = den[i] * shrink + p.sum(-1, keepdim=True)
            m[i] = m_new
        for req in pending:
            req.wait()
        if pending:
            keys, values, owner = nk, nv, (owner + 1) % w
    return torch.cat([n / d for n, d in zip(num, den)], -2)


def ring_attention_backward(q, k, v, out, lse, dout):
    me, w = dist.get_rank(), dist.get_world_size()
    c, scale = q.size(-2) // 2, 1.0 / math.sqrt(q.size(-1))
    tri = torch.ones(c, c, dtype=torch.bool).tril()
    d = torch.einsum("bhqd,bhqd->bhq", dout, out).unsqueeze(-1)
    qs, ls, ds_, dos = q.split(c, -2), lse.split(c, -2), d.split(c, -2), dout.split(c, -2)
    dq = [torch.zeros_like(x) for x in qs]
    keys, values, owner = k, v, me
    gk, gv = torch.zeros_like(k), torch.zeros_like(v)
    for hop in range(w):
        pending, nk, nv = [], None, None
        if hop + 1 < w:  # the next shard's k, v: posted first, in flight during the compute
            nk, nv = torch.empty_like(keys), torch.empty_like(values)
            pending = [isend(keys, (me - 1) % w), isend(values, (me - 1) % w),
                       irecv(nk, (me + 1) % w), irecv(nv, (me + 1) % w)]
        ks, vs, gks, gvs = keys.split(c, -2), values.split(c, -2), list(gk.split(c, -2)), list(gv.split(c, -2))
        for i, j, diagonal in _pairs(me, owner, w):
            s = torch.einsum("bhqd,bhkd->bhqk", qs[i], ks[j]) * scale
            prob = torch.exp(s - ls[i])
            if diagonal:
                prob = torch.where(tri, prob, torch.zeros(()))
            dscore = prob * (torch.einsum("bhqd,bhkd->bhqk", dos[i], vs[j]) - ds_[i])
            dq[i] = dq[i] + scale * torch.einsum("bhqk,bhkd->bhqd", dscore, ks[j])
            gks[j] = gks[j] + scale * torch.einsum("bhqk,bhqd->bhkd", dscore, qs[i])
            gvs[j] = gvs[j] + torch.einsum("bhqk,bhqd->bhkd", prob, dos[i])
        gk, gv = torch.cat(gks, -2), torch.cat(gvs, -2)
        ngk, ngv = torch.empty_like(gk), torch.empty_like(gv)  # the accumulators go where their shard goes
        pending += [isend(gk, (me - 1) % w), isend(gv, (me - 1) % w), irecv(ngk, (me + 1) % w),
                    irecv(ngv, (me + 1) % w)]
        for req in pending:
            req.wait()
        gk, gv = ngk, ngv
        if nk is not None:
            keys, values, owner = nk, nv, (owner + 1) % w
    return torch.cat(dq, -2), gk, gv
