"""The learner's first call of each of some library functions, with its line: for a cause that names the call (a
look-alike of the contract's function, a GPU habit on the CPU), not only its effect. The calls still run."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from .replace import Replace
from .spies import learner_line


class FirstCalls(Replace):
    """``with FirstCalls(path, [(owner, name, label), ...]) as seen:``: ``seen.calls[label]`` is the learner's
    first line that called ``owner.name`` ("ex03_amp.py:71"), however the file imported it (:class:`Replace`)."""

    def __init__(self, path: str | Path, targets: Sequence[tuple[object, str, str]]):
        self.path, self.calls = Path(path).resolve(), {}
        super().__init__({(owner, name): self._make(label) for owner, name, label in targets
                          if getattr(owner, name, None) is not None})

    def _make(self, label: str):
        def make(real):
            def spy(*args, **kwargs):
                if label not in self.calls and (found := learner_line(self.path)):
                    self.calls[label] = f"{Path(found[0]).name}:{found[1]}"
                return real(*args, **kwargs)
            return spy
        return make
