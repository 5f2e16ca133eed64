"""How requests are named: the key that matches one rank's request with its peers'.

Given names are used as they are; unnamed requests are numbered ``<op>.noname.<n>`` with one
counter per process set, so they match only if every member makes its unnamed calls in the same
order (as in Horovod), and ranks outside a set calling fewer collectives do not shift the numbers
of later global ones. Names in a non-global set carry ``@ps<id>``: like Horovod's per-set
controllers, two sets may use the same name at once. A group's requests are ``<base>_<i>of<n>``.

A group also has a *key*: the name one request under its base would have. Ranks that pass
different numbers of tensors under one name get different request names, so the negotiation
compares group sizes under the key instead (:mod:`accord.engine.negotiation.negotiate`). That comparison is
exact because one rank never has two sizes of a key in flight (:class:`GroupsInFlight`).
"""
from __future__ import annotations

import threading
from typing import Sequence

from accord.errors import InvalidArgumentError, with_hint


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
        return self.keyed_group(op, name, count, set_id)[1]

    def keyed_group(self, op: str, name: str | None, count: int, set_id: int) -> tuple[str, list[str]]:
        """The group's key and the names of its ``count`` requests (see the module docstring)."""
        base = self._base(op, name, set_id)
        scope = "" if set_id == 0 else f"@ps{set_id}"
        return base + scope, [f"{base}_{i + 1}of{count}{scope}" for i in range(count)]


Group = tuple[str, int]  # (key, number of tensors) of a grouped call


class GroupsInFlight:
    """The group keys a controller has in flight, refusing a second size under one key.

    A rank with a group of 2 under ``g`` in flight that submits a group of 3 (or one tensor
    named ``g``) would, if a peer did the opposite, wait on that peer forever. With at most one
    size per key in flight, a size that differs between ranks is a certain mismatch, which the
    negotiation reports on every rank. The caller holds the controller's lock.
    """

    def __init__(self) -> None:
        self._held: dict[str, list[int]] = {}  # key -> [size, requests of it in flight]

    def __bool__(self) -> bool:
        """True while a group is in flight (a single request needs no check otherwise)."""
        return bool(self._held)

    def check(self, name: str, group: Group | None, single_in_flight: bool, op: str, rank: int) -> None:
        """Raise InvalidArgumentError if a request named ``name`` of ``group`` (None: not
        grouped) would put a second size under a key; ``single_in_flight``: a single request
        named after the group's key is in flight."""
        key, size = group if group is not None else (name, 0)
        held = self._held.get(key)
        if (held is None or held[0] == size) and not (group is not None and single_in_flight):
            return
        other = "one tensor" if held is None else f"a group of {held[0]}"
        mine = "one tensor" if group is None else f"a group of {size}"
        raise InvalidArgumentError(with_hint(
            f"{op} {key!r}: {other} under this name is in flight on rank {rank}, so {mine} "
            "cannot be submitted under it",
            "synchronize the first call before reusing its name, or use distinct names"))

    def add(self, groups: Sequence[Group | None]) -> None:
        """Count the requests of these groups as in flight."""
        for group in groups:
            if group is not None:
                held = self._held.setdefault(group[0], [group[1], 0])
                held[1] += 1

    def release(self, group: Group) -> None:
        """One request of ``group`` completed."""
        held = self._held.get(group[0])
        if held is not None:
            held[1] -= 1
            if held[1] <= 0:
                del self._held[group[0]]
