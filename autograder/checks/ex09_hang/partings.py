"""Where the ranks' collectives parted: the records the :class:`~.ledger.Ledger` writes, for both parts of
exercise 9 (``train`` and ``train_uneven``). Plain records, read on both sides of the seam."""
from __future__ import annotations

from dataclasses import dataclass, field

from ...rank.observation import Observation


@dataclass
class Fingerprint(Observation):
    """A collective as the ranks compare it before it runs (what ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` compares,
    with the step and the line)."""

    n: int                   # its number among the rank's collectives, from 1
    step: int | None         # the step the learner's loop was at (part 2: the index of the rank's last batch taken)
    kind: str                # the op
    shapes: list[list[int]]  # each tensor argument's shape
    at: str | None           # the learner's line that made it (None: outside the file)
    dtypes: list[str] = field(default_factory=list)  # each tensor argument's dtype ("float32"): gloo aborts the
    #                                                  process on a collective whose dtypes differ between ranks


@dataclass
class Parting(Observation):
    """Where a rank's collectives parted from a peer's: raised on the rank before its op ``mine`` ran."""

    rank: int                      # the rank that saw it
    mine: Fingerprint              # its op that had no match
    peer: int                      # the peer it compared with
    theirs: Fingerprint | None = None  # the peer's op of the same number, when it differs (None: none came)
    peer_done: int | None = None   # the peer returned from train after this many collectives (None: it did not)
