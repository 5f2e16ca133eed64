"""Process sets: named subsets of the job's ranks, and one communicator per device kind for each.

This registry is the one owner of process sets. Id 0 is the global set (every rank) and cannot
be removed. Ids of removed sets are not reused, so a stale id never silently names a different
set. Every rank must make the same add/remove calls in the same order (as with Horovod's process
sets) so that ids agree across ranks; the frontends' set objects (``accord.torch.ProcessSet``)
are views that carry an id and ask here for members.
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Iterable, Mapping

from accord.comm.backend import Communicator
from accord.errors import BackendError, with_hint

log = logging.getLogger("accord.engine")

GLOBAL_ID = 0
# Ids of sets only their members register (torch.distributed groups) start here, far above the
# ids of sets every rank registers, so the two kinds never meet.
PRIVATE_IDS = 1 << 20


class ProcessSetRegistry:
    """Set id -> (sorted global ranks, {device type: communicator, or None on non-members}).

    Thread-safe: user threads add and remove sets while the engine thread reads. Example::

        sets = ProcessSetRegistry(4)
        even = sets.add([0, 2], comms)   # -> 1
        sets.members(even)               # -> (0, 2)
    """

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(with_hint(f"job size must be >= 1, got {size}", "pass the world size"))
        self.size = size
        self._lock = threading.Lock()
        self._members: dict[int, tuple[int, ...]] = {GLOBAL_ID: tuple(range(size))}
        self._comms: dict[int, dict[str, Communicator | None]] = {GLOBAL_ID: {}}
        self._next_id = 1
        self._private: set[int] = set()

    # --- bookkeeping (pure, no communication) ----------------------------------------------------

    def check_new(self, ranks: Iterable[int]) -> tuple[int, ...]:
        """Validate the ranks of a set about to be added; return them as a tuple.

        Raises:
            ValueError: ranks empty, not sorted and unique, not ints, out of [0, size), or the
                same as an existing set.
        """
        ranks = tuple(ranks)
        self._check(ranks)
        existing = self.find(ranks)
        if existing is not None:
            raise ValueError(with_hint(f"process set {list(ranks)} is already registered as id {existing}",
                                       f"reuse id {existing}, or remove it first"))
        return ranks

    @property
    def next_id(self) -> int:
        """The id :meth:`add` gives the next shared set (the same on every rank)."""
        return self._next_id

    def add(self, ranks: Iterable[int], comms: Mapping[str, Communicator | None]) -> int:
        """Register a set with its communicators; return its new id (see :meth:`check_new`)."""
        ranks = self.check_new(ranks)
        with self._lock:
            set_id = self._next_id
            self._next_id += 1
            self._members[set_id] = ranks
            self._comms[set_id] = dict(comms)
        return set_id

    def add_private(self, set_id: int, ranks: Iterable[int], comms: Mapping[str, Communicator | None]) -> None:
        """Register a set that only its members know (a torch.distributed group), under an id its
        members agreed on (at least :data:`PRIVATE_IDS`). Several may have the same ranks; they
        are not listed by :meth:`snapshot` nor found by :meth:`find` (Horovod's view of sets).

        Raises:
            ValueError: the ranks are invalid, or the id is taken or below :data:`PRIVATE_IDS`.
        """
        ranks = tuple(ranks)
        self._check(ranks)
        if set_id < PRIVATE_IDS or set_id in self._members:
            raise ValueError(with_hint(f"process set id {set_id} is taken or not a private id",
                                       f"private sets take fresh ids from {PRIVATE_IDS} on"))
        with self._lock:
            self._members[set_id] = ranks
            self._comms[set_id] = dict(comms)
            self._private.add(set_id)

    def remove(self, set_id: int) -> list[Communicator]:
        """Forget a set; return its communicators to close.

        Raises:
            ValueError: id 0 or an unknown id.
        """
        if set_id == GLOBAL_ID:
            raise ValueError(with_hint("the global process set (id 0) cannot be removed",
                                       "remove only sets you added"))
        if set_id not in self._members:
            raise ValueError(self._unknown(set_id))
        with self._lock:
            del self._members[set_id]
            self._private.discard(set_id)
            return [c for c in self._comms.pop(set_id).values() if c is not None]

    def close_all(self) -> None:
        """Close every communicator of every set (at shutdown, once the engine has stopped); a
        communicator that fails to close is logged and the others are still closed."""
        with self._lock:
            comms = [c for per_set in self._comms.values() for c in per_set.values() if c is not None]
        for comm in comms:
            close = getattr(comm, "close", None)
            if close is None:
                continue
            try:
                close()
            except Exception as exc:  # noqa: BLE001 (shutting down: report and go on)
                log.warning("closing a %s communicator failed: %s", type(comm).__name__, exc)

    def clear(self) -> None:
        """Drop every communicator and every set but the global one's ranks (at shutdown)."""
        with self._lock:
            self._members = {GLOBAL_ID: self._members[GLOBAL_ID]}
            self._comms = {GLOBAL_ID: {}}
            self._private.clear()

    def ids(self) -> list[int]:
        """Registered set ids, ascending (0 first)."""
        with self._lock:
            return sorted(self._members)

    def members(self, set_id: int) -> tuple[int, ...]:
        """Sorted global ranks of set ``set_id`` (KeyError when unknown: the engine's lookup)."""
        return self._members[set_id]

    def get(self, set_id: int) -> tuple[int, ...]:
        """Sorted global ranks of set ``set_id``. Raises ValueError (with a HINT) when unknown."""
        try:
            return self._members[set_id]
        except KeyError:
            raise ValueError(self._unknown(set_id)) from None

    def find(self, ranks: Iterable[int]) -> int | None:
        """The id of the set with exactly these (sorted) ranks, or None."""
        wanted = tuple(ranks)
        with self._lock:
            return next((i for i, r in self._members.items() if r == wanted and i not in self._private), None)

    def snapshot(self) -> dict[int, tuple[int, ...]]:
        """Every set registered on every rank: id -> global ranks (private sets are left out)."""
        with self._lock:
            return {i: r for i, r in self._members.items() if i not in self._private}

    def __contains__(self, set_id: object) -> bool:
        return set_id in self._members

    def __len__(self) -> int:
        return len(self._members)

    # --- communicators ---------------------------------------------------------------------------

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
        """Attach (or replace) the communicator of a registered set for one device kind."""
        with self._lock:
            self._comms[set_id][device] = comm

    # --- checks ------------------------------------------------------------------------------------

    def _check(self, ranks: tuple[int, ...]) -> None:
        problem = None
        if not ranks:
            problem = "it is empty"
        elif not all(isinstance(r, int) and not isinstance(r, bool) for r in ranks):
            problem = f"not every entry is an int ({[type(r).__name__ for r in ranks]})"
        elif list(ranks) != sorted(set(ranks)):
            problem = "ranks must be sorted and unique"
        elif ranks[0] < 0 or ranks[-1] >= self.size:
            problem = f"ranks must lie in [0, {self.size})"
        if problem:
            raise ValueError(with_hint(f"invalid process set {list(ranks)}: {problem}",
                                       f"pass sorted, unique global ranks between 0 and {self.size - 1}, "
                                       "e.g. sorted(set(ranks))"))

    def _unknown(self, set_id: object) -> str:
        return with_hint(f"no process set with id {set_id!r}; known ids: {self.ids()}",
                         "use an id returned by add() that has not been removed")


def sets_given_at_init(process_sets: Any) -> list[Any]:
    """The ``process_sets`` argument of a frontend's ``init()`` as a list: None and Horovod's
    ``"dynamic"`` (sets may always be added later here) mean none now.

    Raises:
        ValueError: a string other than "dynamic".
    """
    if isinstance(process_sets, str):
        if process_sets.lower() != "dynamic":
            raise ValueError(with_hint(f"process_sets={process_sets!r} is not understood",
                                       "pass None, 'dynamic' or a list of hvd.ProcessSet"))
        return []
    return list(process_sets or [])
