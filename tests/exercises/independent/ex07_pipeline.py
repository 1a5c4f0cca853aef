"""Exercise 7, written independently of the reference: non-blocking point-to-point
(``isend``/``irecv`` imported by name, each waited on before its buffer is used or dropped),
``torch.tensor_split`` for the micro-batches, stage 1's backward through ``torch.autograd.backward``
of every loss at once. Its 1F1B walks a schedule written out first as a list of ("F", i) / ("B", i), posts
every send and receive through ``batch_isend_irecv``, and keeps the activations in a deque.
Graded by tests/exercises/test_ex07_pipeline.py."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from collections import deque

from torch.distributed import P2POp, batch_isend_irecv, get_rank, get_world_size, irecv, isend


def split_stages(model: nn.Sequential, boundary: int) -> tuple[nn.Sequential, nn.Sequential]:
    """Layers ``[:boundary]`` are stage 0, ``[boundary:]`` stage 1 (given, not graded)."""
    return model[:boundary], model[boundary:]


def _first_stage(stage: nn.Module, x: torch.Tensor, m: int) -> None:
    outputs, sends = [], []
    for micro in torch.tensor_split(x, m):
        out = stage(micro)
        sends.append(isend(out.detach().contiguous(), dst=1))  # on its way while the next one computes
        outputs.append(out)
    for work in sends:
        work.wait()
    for out in outputs:
        grad = torch.empty_like(out)
        irecv(grad, src=1).wait()
        out.backward(grad)


def _second_stage(stage: nn.Module, x: torch.Tensor, y: torch.Tensor, m: int, hidden: int) -> torch.Tensor:
    received, losses = [], []
    for labels in torch.tensor_split(y, m):
        act = torch.empty((labels.numel(), hidden), dtype=x.dtype, device=x.device)
        irecv(act, src=0).wait()
        act.requires_grad_(True)
        received.append(act)
        losses.append(F.cross_entropy(stage(act), labels) / m)
    sends = []
    for act, loss in zip(received, losses):
        torch.autograd.backward(loss)
        sends.append(isend(act.grad.contiguous(), dst=0))
    for work in sends:
        work.wait()
    return torch.stack(losses).sum().detach()


def gpipe_step(stage: nn.Module, x: torch.Tensor, y: torch.Tensor, *, n_microbatches: int,
               hidden: int) -> torch.Tensor | None:
    """One GPipe forward and backward of a 2-stage pipeline: the batch's mean loss on rank 1, None on 0."""
    if get_rank() == 0:
        _first_stage(stage, x, n_microbatches)
        return None
    return _second_stage(stage, x, y, n_microbatches, hidden)


def _schedule(p: int, s: int, m: int) -> list[tuple[str, int]]:
    warm = min(p - 1 - s, m)
    steady = [step for i in range(m - warm) for step in (("F", warm + i), ("B", i))]
    return [("F", i) for i in range(warm)] + steady + [("B", i) for i in range(m - warm, m)]


def one_f_one_b_step(stage: nn.Module, x: torch.Tensor, y: torch.Tensor, *, n_microbatches: int,
                     hidden: int) -> torch.Tensor | None:
    """1F1B: the schedule written out, then walked; every transfer through batch_isend_irecv."""
    s, p = get_rank(), get_world_size()
    xs, ys = torch.tensor_split(x, n_microbatches), torch.tensor_split(y, n_microbatches)
    live, pending, total = deque(), [], torch.zeros((), dtype=x.dtype)
    for kind, i in _schedule(p, s, n_microbatches):
        if kind == "F":
            if s == 0:
                inp = xs[i]
            else:
                inp = x.new_empty(len(ys[i]), hidden)
                batch_isend_irecv([P2POp(irecv, inp, s - 1)])[0].wait()
                inp.requires_grad_(True)
            out = stage(inp)
            if s == p - 1:
                out = F.cross_entropy(out, ys[i]) / n_microbatches
                total = total + out.detach()
            else:
                pending += batch_isend_irecv([P2POp(isend, out.detach().contiguous(), s + 1)])
            live.append((inp, out))
        else:
            inp, out = live.popleft()
            if s == p - 1:
                torch.autograd.backward(out)
            else:
                grad = torch.empty_like(out)
                batch_isend_irecv([P2POp(irecv, grad, s + 1)])[0].wait()
                torch.autograd.backward(out, grad)
            if s > 0:
                pending += batch_isend_irecv([P2POp(isend, inp.grad.contiguous(), s - 1)])
    for work in pending:
        work.wait()
    return total if s == p - 1 else None
