"""Small data sets that ship with a package or are generated: nothing is downloaded.

The course trains on scikit-learn's bundled handwritten digits (8x8 images,
10 classes, 1,797 samples; the file is inside the sklearn wheel).
"""
from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset, TensorDataset

DIGITS_SIZE = 1792  # 1,797 rounded down to a multiple of 256 (2^8 * 7): W = 1, 2, 4, 7, 8 divide it; 3, 5, 6 do not


@functools.lru_cache(maxsize=1)
def _digits_array() -> np.ndarray:
    # The same file sklearn.datasets.load_digits reads, found without importing
    # sklearn: that import costs about a second of CPU in every rank of every launch.
    spec = importlib.util.find_spec("sklearn")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("scikit-learn is not installed: it ships the digits data set")
    return np.loadtxt(Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz", delimiter=",")


def digits(n: int = DIGITS_SIZE) -> TensorDataset:
    """The first ``n`` sklearn digits as ``(x, y)``: x float32 (64 pixels scaled to [0, 1]), y int64."""
    table = _digits_array()[:n]
    x = torch.tensor(table[:, :64], dtype=torch.float32) / 16.0
    y = torch.tensor(table[:, 64], dtype=torch.long)
    return TensorDataset(x, y)


def synthetic_classification(n: int, features: int, classes: int, seed: int = 0) -> TensorDataset:
    """A learnable classification set: labels from a fixed random linear teacher."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    teacher = torch.randn(features, classes, generator=g)
    return TensorDataset(x, (x @ teacher).argmax(dim=1))


class RecordingDataset(Dataset):
    """Wraps a data set and records, in order, every index this process read.

    The grader hands this to a learner's training loop: the log shows which
    samples each rank saw and in what order, without trusting anything the
    learner's code reports about itself.
    """

    def __init__(self, inner: Dataset):
        self.inner = inner
        self.accessed: list[int] = []

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]

    def __getitem__(self, index: int):
        self.accessed.append(int(index))
        return self.inner[index]


def seeded_batch(n: int, features: int, classes: int = 10, *, seed: int = 0,
                 device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, y)``: ``n`` standard-normal rows of ``features`` and ``n`` labels in ``[0, classes)``,
    drawn in that order from one ``torch.Generator`` seeded with ``seed``, then moved to ``device``.

    The same ``(n, features, classes, seed)`` gives the same tensors bit for bit on every machine
    (the CPU generator draws them, whatever the device): a rank seeds with its rank to train on
    samples of its own, ranks that must share a batch (tensor parallelism) pass the same seed.
    Unlike :func:`synthetic_classification` the labels are noise: for measuring a step, not learning.
    """
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    y = torch.randint(0, classes, (n,), generator=g)
    return (x, y) if device is None else (x.to(device), y.to(device))
