"""Exercise 2's scenarios and data, which both sides share: the ranks train on them (``probes``), the
grading process rebuilds the same batches for its single-process reference (``reference``)."""
from __future__ import annotations

import functools

import torch

from distlab.data import digits

LR = 0.5
MODEL = dict(hidden=32)
# name -> (micro-batch sizes, identical on every rank; accumulation_steps)
SCENARIOS = {
    "equal": ([8] * 12, 4),
    "unequal": ([4, 12, 8, 10, 2, 6, 5, 7], 3),  # the last window short: 1/k, 1/2 and n_i/N all differ
    "short": ([8] * 10, 4),
    "tokens": ([2] * 4, 2),  # 2 padded sequences per micro-batch: TOKEN_LENGTHS gives each one's length
}
IGNORE_INDEX = -100  # the label of a padding token (cross_entropy's default ignore_index)
SEQ_LEN = 8
# rank -> micro-batch -> the lengths of its sequences (padded to SEQ_LEN). Token counts differ between the
# micro-batches of a window and between the ranks (window 0: 9+4 tokens on rank 0, 2+14 on rank 1), so the
# mean of micro-batch means, a rank's own count and a count that includes padding all give other gradients.
# Ranks 2 and 3 run at world size 4 only (``NODES``), where their counts differ again (window 0: 9+7 and 8+15).
TOKEN_LENGTHS = {0: [[7, 2], [3, 1], [8, 8], [5, 6]], 1: [[1, 1], [6, 8], [2, 3], [8, 4]],
                 2: [[4, 5], [6, 1], [1, 6], [7, 3]], 3: [[3, 5], [8, 7], [4, 2], [6, 1]]}
# world size -> the nodes its launch's ranks are told they run on (LOCAL_WORLD_SIZE = world / nodes); at 4 ranks
# the tokens scenario alone runs, the one whose answer depends on the world size.
NODES = {2: 1, 4: 2}


def windows(n: int, k: int) -> list[range]:
    return [range(s, min(s + k, n)) for s in range(0, n, k)]


@functools.lru_cache(maxsize=1)
def _digits() -> tuple[torch.Tensor, torch.Tensor]:
    return digits().tensors


def micro_batches(sizes: list[int], rank: int, world: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Rank ``rank``'s micro-batches: micro-step i takes consecutive digits, rank-major."""
    x_all, y_all = _digits()
    out, start = [], 0
    for n in sizes:
        lo = start + rank * n
        out.append((x_all[lo:lo + n], y_all[lo:lo + n]))
        start += world * n
    return out


def token_batches(rank: int, world: int = 2) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Rank ``rank``'s micro-batches (of ``world`` ranks) of padded sequences: x ``(B, SEQ_LEN, 64)``, y
    ``(B, SEQ_LEN)``, each
    token a digit (consecutive digits, rank-major as in :func:`micro_batches`), padding x=0, y=IGNORE_INDEX."""
    x_all, y_all = _digits()
    out, start = [], 0
    for i in range(len(TOKEN_LENGTHS[0])):
        x = torch.zeros(len(TOKEN_LENGTHS[rank][i]), SEQ_LEN, x_all.shape[1])
        y = torch.full((len(TOKEN_LENGTHS[rank][i]), SEQ_LEN), IGNORE_INDEX, dtype=y_all.dtype)
        lo = start + sum(sum(TOKEN_LENGTHS[r][i]) for r in range(rank))
        for b, n in enumerate(TOKEN_LENGTHS[rank][i]):
            x[b, :n], y[b, :n] = x_all[lo:lo + n], y_all[lo:lo + n]
            lo += n
        out.append((x, y))
        start += sum(sum(TOKEN_LENGTHS[r][i]) for r in range(world))
    return out
