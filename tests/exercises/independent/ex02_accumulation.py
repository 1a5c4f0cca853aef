"""Exercise 2, written independently of the reference: one flat loop over the micro-batches (the
window's end found by index arithmetic, not ``windows()``), ``no_sync()`` entered through an
``ExitStack``, every window's token count all-reduced at once in one vector before the first
backward, the loss ``F.cross_entropy(..., reduction="sum") * world / N``, and the window's loss kept as a tensor.
Graded by tests/exercises/test_ex02_accumulation.py."""
from __future__ import annotations

from contextlib import ExitStack
from typing import Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel


def windows(num_micro_batches: int, accumulation_steps: int) -> list[range]:
    """The micro-batch indices of each optimizer step (given, not graded)."""
    return [range(s, min(s + accumulation_steps, num_micro_batches))
            for s in range(0, num_micro_batches, accumulation_steps)]


def train_accumulated(model: DistributedDataParallel, optimizer: torch.optim.Optimizer,
                      micro_batches: Sequence[tuple[torch.Tensor, torch.Tensor]], *,
                      accumulation_steps: int) -> list[float]:
    """One optimizer step per window of ``accumulation_steps`` micro-batches; each window's mean loss."""
    count, losses, running = len(micro_batches), [], None
    world = dist.get_world_size()
    starts = range(0, count, accumulation_steps)
    # Every window's labels that are not padding (-100), summed over the ranks in one all_reduce.
    tokens = torch.tensor([sum(int((micro_batches[j][1] != -100).sum()) for j in range(s, min(s + accumulation_steps,
                                                                                                count)))
                           for s in starts], dtype=torch.float64, device=micro_batches[0][1].device)
    dist.all_reduce(tokens, op=dist.ReduceOp.SUM)
    for i, (x, y) in enumerate(micro_batches):
        first = i - i % accumulation_steps
        last = min(first + accumulation_steps, count) - 1
        window_tokens = float(tokens[first // accumulation_steps])
        with ExitStack() as stack:
            if i != last:
                stack.enter_context(model.no_sync())  # the all-reduce waits for the window's last backward
            logits = model(x)
            summed = F.cross_entropy(logits.flatten(0, -2), y.flatten(), reduction="sum")  # -100 ignored
            (summed * (world / window_tokens)).backward()  # DDP's average divides by world again
        loss = summed.detach() / window_tokens
        running = loss if running is None else running + loss
        if i == last:
            optimizer.step()
            optimizer.zero_grad()
            losses.append(float(running))
            running = None
    return losses
