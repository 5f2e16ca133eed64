"""The engine's view of process sets: members and one communicator per device kind."""
from __future__ import annotations

import threading
from typing import Mapping, Sequence

from accord.comm.backend import Communicator
from accord.errors import BackendError, with_hint


class ProcessSetRegistry:
    """Process set id -> (global ranks, {device type: communicator or None on non-members}).

    Id 0 is every rank. Thread-safe: user threads add/remove sets while the engine reads.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._members: dict[int, tuple[int, ...]] = {}
        self._comms: dict[int, dict[str, Communicator | None]] = {}

    def add(self, set_id: int, ranks: Sequence[int], comms: Mapping[str, Communicator | None]) -> None:
        """Register (or replace) set ``set_id``."""
        with self._lock:
            self._members[set_id] = tuple(ranks)
            self._comms[set_id] = dict(comms)

    def remove(self, set_id: int) -> list[Communicator]:
        """Forget set ``set_id`` (KeyError when unknown); return its communicators to close."""
        with self._lock:
            del self._members[set_id]
            return [c for c in self._comms.pop(set_id).values() if c is not None]

    def clear(self) -> None:
        """Forget every set and drop the communicators (at shutdown)."""
        with self._lock:
            self._members.clear()
            self._comms.clear()

    def ids(self) -> list[int]:
        """Registered set ids, ascending."""
        with self._lock:
            return sorted(self._members)

    def members(self, set_id: int) -> tuple[int, ...]:
        """Global ranks of set ``set_id`` (KeyError when unknown)."""
        return self._members[set_id]

    def communicator(self, set_id: int, device: str) -> Communicator | None:
        """This rank's communicator for the set on ``device`` (None when not a member).

        Raises:
            BackendError: no communicator for that device kind was created for the set.
        """
        comms = self._comms[set_id]
        if device not in comms:
            raise BackendError(with_hint(
                f"process set {set_id} has no communicator for {device!r} tensors "
                f"(it has: {', '.join(sorted(comms)) or 'none'})",
                "move the tensor to a device the job was initialized for (CUDA communicators are "
                "created at init only when torch.cuda.is_available())"))
        return comms[device]

    def set_communicator(self, set_id: int, device: str, comm: Communicator | None) -> None:
        """Attach a communicator for another device kind to an existing set."""
        with self._lock:
            self._comms[set_id][device] = comm
