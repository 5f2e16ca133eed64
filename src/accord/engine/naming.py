"""How requests are named: the key that matches one rank's request with its peers'.

Given names are used as they are; unnamed requests are numbered ``<op>.noname.<n>`` with one
counter per process set, so they match only if every member makes its unnamed calls in the same
order (as in Horovod), and ranks outside a set calling fewer collectives do not shift the numbers
of later global ones. Names in a non-global set carry ``@ps<id>``: like Horovod's per-set
controllers, two sets may use the same name at once. A group's requests are ``<base>_<i>of<n>``.
"""
from __future__ import annotations

import threading


class RequestNamer:
    """Names for one session's requests (thread-safe). Example::

        names = RequestNamer()
        names.name("allreduce", None, 0)       # -> "allreduce.noname.1"
        names.group("allgather", "x", 2, 3)    # -> ["x_1of2@ps3", "x_2of2@ps3"]
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[int, int] = {}

    def _base(self, op: str, name: str | None, set_id: int) -> str:
        if name is not None:
            return name
        with self._lock:
            n = self._counts.get(set_id, 0) + 1
            self._counts[set_id] = n
        return f"{op}.noname.{n}"

    def name(self, op: str, name: str | None, set_id: int) -> str:
        """The name of one request of ``op`` in set ``set_id``."""
        base = self._base(op, name, set_id)
        return base if set_id == 0 else f"{base}@ps{set_id}"

    def group(self, op: str, name: str | None, count: int, set_id: int) -> list[str]:
        """The names of a group of ``count`` requests (one number for the whole group)."""
        base = self._base(op, name, set_id)
        scope = "" if set_id == 0 else f"@ps{set_id}"
        return [f"{base}_{i + 1}of{count}{scope}" for i in range(count)]
