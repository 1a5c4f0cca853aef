"""Is a job getting somewhere? Each rank's heartbeat, and the launcher's reading of them.

"Slow is not wrong": a launch that runs out of time while its ranks still
advance is the machine's problem, and one whose ranks all stopped advancing
while some wait in a collective is a hang, to be named at once, at the
learner's line. Both need the same evidence, and a busy CPU is not it (a
spinning loop is busy). Progress here is what only an advancing program does:

* a *tick*: an optimizer step (``register_optimizer_step_post_hook``, global),
  a backward pass (``Tensor.backward`` and ``torch.autograd.backward``), or a gradient of a DDP
  model accumulated (:class:`distlab.runtime.waits.DDPWatch`);
* a *new place*: a stack of the main thread, sampled every :data:`INTERVAL`
  seconds, that this rank has not been in before (start-up, a first epoch;
  a loop soon runs out of new places).

Rank side, :func:`start` runs a daemon thread that writes
``heartbeat-<rank>.json`` in the job's folder: the counts, the stack's
innermost learner frame, and what it waits in (a ``torch.distributed``
collective, a ``recv``, a ``barrier``, a ``.wait()``, or one that DDP, FSDP or a pipeline schedule
issued: :mod:`distlab.runtime.waits`). Launcher side,
:class:`Watch` reads them and tells when each rank last advanced.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from .waits import DDPWatch, describe, is_runtime, watch_ddp

INTERVAL = 0.5  # seconds between two samples of a rank's stack


# What torchrun tells each rank; a job that sets them again points its ranks at a rendezvous nobody
# hosts (the tutorials' os.environ["MASTER_PORT"] = "12355"), so the launcher names the change.
TORCHRUN_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")
_TORCHRUN_ENV: dict[str, str | None] = {}
_SET_AT: dict[str, str] = {}  # where the job's own code last set each of them ("file.py:12")
_PEERS: list[bool] = []  # the runtime waits for the other ranks on the main thread, in C++ (a store's wait)
_RAISED: list[str] = []  # the last error of the job's code that its runner caught on this rank, said


def note_raised(said: str) -> None:
    """An error of the job's code that the runner on this rank caught and went on from (``"combine raised
    RuntimeError: ... (ex11.py:95)"``): the other ranks may wait for this one in a collective it then never
    reached, and a hang's report says what came before (:meth:`Watch.report`). Kept until :func:`clear_raised`."""
    _RAISED[:] = [said]


def clear_raised() -> None:
    """A new job file begins on this rank: an earlier file's error explains none of its waits."""
    _RAISED.clear()


@contextlib.contextmanager
def waiting_for_peers():
    """For the block, the main thread waits for the other ranks in C++ (``TCPStore.wait``): no frame of the
    stack shows it, so the beat says it (``waits_for_peers``), and the report does not call the rank 'outside
    your code'. A flag, not words: the launcher writes the sentence (a beat is the rank's, read as data)."""
    _PEERS.append(True)
    try:
        yield
    finally:
        _PEERS.pop()


def _watch_environ() -> None:
    """Note the line of the job's code (not a library's, not the runtime's) that sets one of torchrun's variables
    through ``os.environ``, for :func:`env_note`."""
    setitem = os._Environ.__setitem__

    def noted(self, key, value):
        if key in TORCHRUN_VARS:
            frame = sys._getframe(1)
            while frame is not None and is_runtime(frame.f_code.co_filename):
                frame = frame.f_back
            if frame is not None:
                _SET_AT[key] = f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno}"
        setitem(self, key, value)

    os._Environ.__setitem__ = noted


@contextlib.contextmanager
def torchrun_vars(**values: str):
    """For the block, ``values`` are what torchrun's variables hold, not a change of the job's: a launcher
    that moves the rendezvous itself (the grader's own store for each learner file) sets ``MASTER_PORT`` in
    the block, and a hang there must not be reported as the learner's change."""
    before = {k: _TORCHRUN_ENV[k] for k in values if k in _TORCHRUN_ENV}
    _TORCHRUN_ENV.update(values)
    try:
        yield
    finally:
        for k in values:
            _TORCHRUN_ENV.pop(k, None)
        _TORCHRUN_ENV.update(before)


def changed_torchrun_vars() -> dict[str, list]:
    """``{name: [torchrun's value, the value now]}`` for each of torchrun's variables the job changed, and the
    line of the job's code that set it, where one did (``[was, now, "file.py:12"]``)."""
    return {k: [v, os.environ.get(k), *([_SET_AT[k]] if k in _SET_AT else [])] for k, v in _TORCHRUN_ENV.items()
            if os.environ.get(k) != v}


class _Rank:
    """The rank-side counters and the sampler thread."""

    def __init__(self, path: Path):
        self.path, self.ticks, self.places, self.seen = path, 0, 0, set()
        self.main = threading.main_thread().ident
        self.ddp = DDPWatch(self.tick)

    def tick(self, *_args, **_kwargs) -> None:
        self.ticks += 1  # one thread adds at a time in practice; a lost increment only delays a beat

    def sample(self) -> None:
        frame = sys._current_frames().get(self.main)
        frames = []
        while frame is not None:
            frames.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
            frame = frame.f_back
        frames.reverse()
        signature = hash(tuple(frames))
        if signature not in self.seen and len(self.seen) < 100_000:
            self.seen.add(signature)
            self.places += 1
        beat = {"ticks": self.ticks, "places": self.places, **describe(frames, self.ddp.all_in()),
                "waits_for_peers": bool(_PEERS), "env_changed": changed_torchrun_vars(),
                "raised": _RAISED[0] if _RAISED else None}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(beat))
        tmp.replace(self.path)

    def run(self) -> None:
        while True:
            try:
                self.sample()
            except OSError:
                return  # the job's folder is gone: the job is over
            time.sleep(INTERVAL)  # the sampling period, not a wait for an event


def start(outdir: str | os.PathLike, rank: int) -> None:
    """Start this rank's heartbeat (before the learner's code is imported)."""
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    _TORCHRUN_ENV.update({k: os.environ.get(k) for k in TORCHRUN_VARS})
    _watch_environ()
    beat = _Rank(Path(outdir) / f"heartbeat-{rank}.json")
    register_optimizer_step_post_hook(beat.tick)
    backward, tensor_backward = torch.autograd.backward, torch.Tensor.backward

    def counted_backward(*args, **kwargs):
        beat.tick()
        beat.ddp.backward_started()
        return backward(*args, **kwargs)

    def counted_tensor_backward(self, *args, **kwargs):
        beat.tick()
        beat.ddp.backward_started()
        return tensor_backward(self, *args, **kwargs)

    torch.autograd.backward, torch.Tensor.backward = counted_backward, counted_tensor_backward
    watch_ddp(beat.ddp)
    threading.Thread(target=beat.run, name="distlab-heartbeat", daemon=True).start()


@dataclass
class Watch:
    """The launcher's view of a job's heartbeats: when each rank last advanced (its own clock)."""

    outdir: Path
    nprocs: int
    beats: dict[int, dict] = field(default_factory=dict)
    advanced: dict[int, float] = field(default_factory=dict)
    _read_at: float = 0.0

    def poll(self, now: float) -> None:
        """Read the heartbeats (at most every :data:`INTERVAL` s)."""
        if now - self._read_at < INTERVAL:
            return
        self._read_at = now
        for rank in range(self.nprocs):
            try:  # written by the rank (the learner's process): read a bounded amount, as data
                with open(self.outdir / f"heartbeat-{rank}.json", "rb") as f:
                    beat = json.loads(f.read(65536))
                int(beat["ticks"]), int(beat["places"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
            old = self.beats.get(rank)
            if old is None or (beat["ticks"], beat["places"]) != (old["ticks"], old["places"]):
                self.advanced[rank] = now
            self.beats[rank] = beat

    def last_advance(self) -> float | None:
        return max(self.advanced.values()) if self.advanced else None

    def in_collective(self) -> bool:
        """Whether some rank's last beat waits in a collective (its own, a library's or the runtime's)."""
        return any(b.get("waits_in") for b in self.beats.values())

    def hung(self, now: float, after_s: float) -> bool:
        """Every rank reports, none advanced for ``after_s``, and one at least waits in a collective; or none
        advanced for twice that, and one at least waits for the others in the runtime (it left the job's code,
        and a rank still in it does not come: a sleep, a loop that never ends). Twice: a rank still working
        through a long stretch with no new place is slow, not stuck, and the others wait for it all the same."""
        if len(self.beats) < self.nprocs or any(now - t < after_s for t in self.advanced.values()):
            return False
        if self.in_collective():
            return True
        return (any(b.get("waits_for_peers") is True for b in self.beats.values())
                and all(now - t >= 2 * after_s for t in self.advanced.values()))

    def report(self, unfinished: list[int] | None = None) -> str:
        """``rank 0 waits in all_reduce at ex01_ddp.py:57; rank 1 is at ex01_ddp.py:112 in train (time.sleep(60))``;
        of the ``unfinished`` ranks only, where given (a rank that returned its result is nowhere)."""
        parts = [env_note(rank, b["env_changed"]) for rank, b in sorted(self.beats.items())
                 if isinstance(b.get("env_changed"), dict) and b["env_changed"]][:1]
        left: list[int] = []  # ranks out of the job's code (none raised first), said once, where the first stands
        at = 0
        for rank in sorted(self.beats):
            if unfinished is not None and rank not in unfinished:
                continue
            b = self.beats[rank]
            after = f", after its {b['raised']}" if isinstance(b.get("raised"), str) else ""
            if not b.get("at") and (b.get("waits_for_peers") is True or b.get("waits_in")):
                # no frame of the job's code on its stack: the runtime's (or the grader's) own wait for the others
                if after:
                    parts.append(f"rank {rank} had left your code{after}, and waited for the other ranks to finish")
                else:
                    at = at if left else len(parts)
                    left.append(rank)
                continue
            where = f" at {b['at']}" if b.get("at") else ""
            # the line, unless it names what the rank waits in ("dist.all_reduce(t)"); "loss.backward()" it does not
            code = f" ({b['code']})" if b.get("code") and str(b.get("waits_in")) not in b["code"] else ""
            within = f" in {b['function']}" if where and b.get("function") else ""
            parts.append((f"rank {rank} waits in {b['waits_in']}{where}{code}" if b.get("waits_in")
                          else f"rank {rank} is{where + within or ' outside your code'}{code}") + after)
        if left:
            who = f"rank {left[0]}" if len(left) == 1 else f"ranks {', '.join(map(str, left[:-1]))} and {left[-1]}"
            parts.insert(at, f"{who} had left your code and waited for the other ranks to finish")
        return "; ".join(parts)


def env_note(rank: int, changed: dict) -> str:
    """``rank 0 changed torchrun's MASTER_PORT (41234 -> 12355): ...``: the cause, when a job reset them."""
    what = ", ".join(f"{k} ({old} -> {new}{f', at {at[0]}' if at else ''})"
                     for k, (old, new, *at) in sorted(changed.items()))
    return (f"rank {rank} changed torchrun's {what}: torchrun already sets MASTER_ADDR, MASTER_PORT, RANK and "
            "WORLD_SIZE for every rank, and setting them again points the ranks at a rendezvous nobody hosts; "
            "remove those os.environ lines")
