"""The grader's spies: what the learner's code did, recorded inside a rank, never judged there.

Each spy that replaces a library function is a :class:`~.replace.Replace`, entered before the learner's
file is imported; the hooks observe modules and tensors the grader built.
"""
from __future__ import annotations

import torch

from .replace import Replace


class SaveSpy(Replace):
    """Records the path of every ``torch.save`` call on this rank (and still performs them).

    Enter it *before* importing the learner's module (see :class:`Replace`): ``from torch import
    save`` and ``torch.serialization.save`` are seen too.
    """

    def __init__(self):
        self.paths: list[str] = []
        super().__init__({(torch, "save"): self._spy, (torch.serialization, "save"): self._spy})

    def _spy(self, real):
        def save(obj, f, *args, **kwargs):
            self.paths.append(str(f))
            return real(obj, f, *args, **kwargs)
        return save


def grad_norm(params) -> float:
    """The total 2-norm of the ``.grad`` of ``params`` that have one (a DTensor's: this rank's shard); 0.0
    when none has."""
    norms = [getattr(p.grad, "_local_tensor", p.grad).detach().float().norm() for p in params if p.grad is not None]
    return torch.linalg.vector_norm(torch.stack(norms)).item() if norms else 0.0


def on_backward_start(model: torch.nn.Module, callback) -> torch.utils.hooks.RemovableHandle:
    """Call ``callback()`` each time a backward through ``model``'s output begins (before any ``.grad`` of
    that backward is written: what ``.grad`` holds then is what ``zero_grad`` should have cleared)."""
    def on_forward(mod, args, out) -> None:  # None: the output is not replaced
        if isinstance(out, torch.Tensor) and out.requires_grad:
            out.register_hook(lambda grad: callback())
    return model.register_forward_hook(on_forward)
