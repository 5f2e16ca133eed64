"""What a parameter server keeps per key: the stored value (a buffer zero-copy replies may
still read), the state of its dist_sync round, and the keys of each store type."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from accord.kvstore import optimizers as opt
from accord.kvstore.protocol import PayloadSeal


class Buf:
    """An array that zero-copy replies may still be reading; they get a copy of what they have
    not sent yet before it is written.

    Every write goes through :meth:`writable`, which also drops the array's payload seal (the
    Poly1305 tag that every pull of this unchanged value reuses; see :mod:`protocol`).
    """

    __slots__ = ("array", "trackers", "seal")

    def __init__(self, array: np.ndarray) -> None:
        self.array = array
        self.trackers: list[Any] = []
        self.seal = PayloadSeal()

    def writable(self) -> np.ndarray:
        self.seal.clear()
        for tracker in self.trackers:
            tracker.release()  # the answer keeps the old bytes, its MAC's, in a copy if unsent
        self.trackers.clear()
        return self.array

    def sent(self, tracker: Any) -> None:
        self.trackers = [t for t in self.trackers if not t.done]
        self.trackers.append(tracker)


@dataclass
class Entry:
    """One key's stored value and its dist_sync round: the pushes merged so far, who pushed,
    and the acks, pulls and next-round requests waiting for the round to end (or, once a push
    of the round was refused, why the round ends without a value)."""

    stored: Buf
    param_only: bool
    merged: Buf | None = None
    first: np.ndarray | None = None  # the round's first push, as received, until the second
    contributors: set[int] = field(default_factory=set)
    acks: list[tuple[Any, dict]] = field(default_factory=list)
    pulls: list[tuple[Any, dict]] = field(default_factory=list)
    backlog: list[tuple[Any, dict, list]] = field(default_factory=list)
    op: str = "sum"
    failed: str | None = None  # why this round cannot complete (a push of it was refused)

    @property
    def size(self) -> int:
        return int(self.stored.array.size)


@dataclass
class Space:
    """The keys of one store type (sync or async), its optimizer, and waiting barriers."""

    sync: bool
    entries: dict[str, Entry] = field(default_factory=dict)
    updater: opt.Updater | None = None
    barriers: dict[int, list[tuple[Any, dict]]] = field(default_factory=lambda: defaultdict(list))
