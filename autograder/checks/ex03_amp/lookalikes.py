"""Rank side of exercise 3's look-alikes: the learner's calls of functions that look like the contract's and do
something else (:class:`~.observations.LookAlikes`), so that the feedback names the call, not only its effect.
"""
from __future__ import annotations

from pathlib import Path

import torch

from ...rank import Replace
from ...rank.spies import learner_line


class LookAlikeSpy(Replace):
    """The learner's calls of :class:`LookAlikes`' functions, each with its first line (they still run)."""

    TARGETS = [(torch.nn.utils, "clip_grad_value_", "clip_grad_value_"),
               (torch.nn.utils.clip_grad, "clip_grad_value_", "clip_grad_value_"),
               (torch.cuda.amp, "autocast", "torch.cuda.amp.autocast")]

    def __init__(self, learner):
        self.path, self.calls = Path(learner.__file__).resolve(), {}
        super().__init__({(owner, name): self._make(label) for owner, name, label in self.TARGETS
                          if getattr(owner, name, None) is not None})

    def _make(self, label: str):
        def make(real):
            def spy(*args, **kwargs):
                if label not in self.calls and (found := learner_line(self.path)):
                    self.calls[label] = f"{Path(found[0]).name}:{found[1]}"
                return real(*args, **kwargs)
            return spy
        return make
