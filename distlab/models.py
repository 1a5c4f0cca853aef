"""The small models the course trains: fast on a laptop CPU, real enough to teach on."""
from __future__ import annotations

import torch
from torch import nn


class MLP(nn.Module):
    """``in -> hidden -> ... -> out`` with ReLU; ``depth`` hidden layers."""

    def __init__(self, in_features: int = 64, hidden: int = 128, out_features: int = 10, depth: int = 2):
        super().__init__()
        layers: list[nn.Module] = []
        width = in_features
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        layers.append(nn.Linear(width, out_features))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def make_mlp(seed: int, **kwargs) -> MLP:
    """An :class:`MLP` whose initial weights depend only on ``seed``."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return MLP(**kwargs)


def sgd_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, lr: float):
    """A closure that runs one SGD step of ``model`` (plain, DDP or FSDP) on the cross-entropy of
    ``(x, y)``: the step the timing and counting jobs repeat."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)

    def step() -> None:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    return step


def cpu_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """A detached CPU copy of ``model``'s state dict (``module.`` prefixes of DDP removed)."""
    inner = getattr(model, "module", model)
    return {k: v.detach().to("cpu", copy=True) for k, v in inner.state_dict().items()}
