"""The elastic driver's reads and writes of the job's store: the ``accord/elastic/*`` keys of
:mod:`accord.worker_contract` that the workers' re-formation (:mod:`accord.torch.elastic.reform`)
and admission (:mod:`accord.runtime.admission`) read and write on their side.

The store runs in the launcher's process, so the one failure expected here is the store going
away while the job shuts down: the client then raises :class:`~accord.errors.RendezvousError`
and closes its connection. That alone is absorbed (reads answer as before any re-formation,
writes are warned about: nothing re-forms any more). A store that answers with an error while
the connection works, and any other exception, is a bug and propagates.
"""
from __future__ import annotations

import json
from typing import Any, Callable, TypeVar

from accord.errors import RendezvousError
from accord.worker_contract import (
    ELASTIC_DEAD_KEY,
    ELASTIC_LATEST_KEY,
    ELASTIC_LAUNCH_KEY,
    ELASTIC_LAUNCHED_KEY,
    ELASTIC_LEAVING_KEY,
    ELASTIC_MEMBERS_KEY,
    ELASTIC_UPDATE_KEY,
    ELASTIC_UPDATES_KEY,
)

T = TypeVar("T")


class ElasticStore:
    """The driver's side of the elastic keys.

    Args:
        store: a connection to the job's store (``set``/``add``/``get``/``check``/``closed``,
            :class:`~accord.store.connection.StoreConnection`).
        say: prints one launcher line (the warnings of writes lost to a store gone away).

    Every method raises RendezvousError when the store refused a request while its connection
    still works (a bug), and lets any other exception through.
    """

    def __init__(self, store: Any, say: Callable[[str], None]) -> None:
        self._store = store
        self._say = say

    # --- writes ---------------------------------------------------------------------------------
    def launched(self, member_id: int) -> None:
        """Record a worker added to the running job, before it can ask to join: a re-formation
        waits a little for the workers launched but not yet registered."""
        def write() -> None:
            n = int(self._store.add(ELASTIC_LAUNCHED_KEY, 1))
            self._store.set(ELASTIC_LAUNCH_KEY.format(n=n), str(member_id))
        self._unless_gone(write, None, f"the launch of worker {member_id}")

    def dead(self, member_id: int) -> None:
        """Mark a worker's process as ended (or never started): re-formations stop waiting for it."""
        self._set(ELASTIC_DEAD_KEY.format(member=member_id))

    def leaving(self, member_id: int) -> None:
        """Mark a worker as removed by the launcher: it leaves at the next re-formation."""
        self._set(ELASTIC_LEAVING_KEY.format(member=member_id))

    def announce(self, kind: str) -> None:
        """Tell the running workers that hosts changed, ``kind`` "added" or "removed" (they look
        at their next commit)."""
        def write() -> None:
            n = int(self._store.add(ELASTIC_UPDATES_KEY, 1))
            self._store.set(ELASTIC_UPDATE_KEY.format(n=n), kind)
        self._unless_gone(write, None, "the host change")

    def _set(self, key: str) -> None:
        self._unless_gone(lambda: self._store.set(key, "1"), None, key)

    # --- reads ----------------------------------------------------------------------------------
    def latest_members(self) -> list[int] | None:
        """The member ids of the last re-formation, in rank order; None before the first (or
        once the store is gone)."""
        def read() -> list[int] | None:
            if not self._store.check([ELASTIC_LATEST_KEY]):
                return None
            epoch = int(self._store.add(ELASTIC_LATEST_KEY, 0))
            if epoch < 1:  # the leader creates the counter, then raises it to its epoch
                return None
            record = json.loads(self._store.get(ELASTIC_MEMBERS_KEY.format(epoch=epoch), timeout=5.0))
            return [int(m) for m in record["members"]]
        return self._unless_gone(read, None)

    def admitted(self, member_id: int) -> bool:
        """True when the last re-formation took this member in."""
        members = self.latest_members()
        return members is not None and member_id in members

    def reformations(self) -> int:
        """How often the workers have re-formed so far (the count they publish; 0 before the
        first re-formation, or once the store is gone)."""
        # add(0) would create the key, which tells joiners a re-formation was published
        return self._unless_gone(lambda: int(self._store.add(ELASTIC_LATEST_KEY, 0))
                                 if self._store.check([ELASTIC_LATEST_KEY]) else 0, 0)

    # --- the one expected failure ---------------------------------------------------------------
    def _unless_gone(self, call: Callable[[], T], gone: T, writing: str | None = None) -> T:
        """``call()``, or ``gone`` when the store went away meanwhile (the client raised
        RendezvousError and closed its connection); ``writing`` names what a lost write was."""
        try:
            return call()
        except RendezvousError as exc:
            if not self._store.closed:  # the store answered with an error: a bug
                raise
            if writing is not None:
                self._say(f"warning: could not write {writing} to the job's store: {exc}")
            return gone
