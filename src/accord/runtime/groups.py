"""Process sets: named subsets of the job's ranks (pure bookkeeping, no communication).

Id 0 is the global set (every rank) and cannot be removed. Ids of removed sets are not reused,
so a stale id never silently names a different set. Every rank must make the same add/remove
calls in the same order (as with Horovod's process sets) so that ids agree across ranks.
"""
from __future__ import annotations

from typing import Iterable, Sequence

from accord.errors import with_hint
from accord.runtime.topology import Topology, local_rank_of

GLOBAL_ID = 0


class ProcessSetTable:
    """Rank lists by id. Example::

        table = ProcessSetTable(4)
        even = table.add([0, 2])     # -> 1
        table.get(even)              # -> (0, 2)
    """

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(with_hint(f"job size must be >= 1, got {size}", "pass the world size"))
        self.size = size
        self._sets: dict[int, tuple[int, ...]] = {GLOBAL_ID: tuple(range(size))}
        self._next_id = 1

    def add(self, ranks: Iterable[int]) -> int:
        """Register a set of ranks; return its new id.

        Raises:
            ValueError: ranks empty, not sorted and unique, not ints, out of [0, size), or the
                same as an existing set.
        """
        ranks = tuple(ranks)
        self._check(ranks)
        for set_id, existing in self._sets.items():
            if existing == ranks:
                raise ValueError(
                    with_hint(
                        f"process set {list(ranks)} is already registered as id {set_id}",
                        f"reuse id {set_id}, or remove it first",
                    )
                )
        set_id = self._next_id
        self._next_id += 1
        self._sets[set_id] = ranks
        return set_id

    def remove(self, set_id: int) -> None:
        """Forget a set. Raises ValueError for id 0 or an unknown id."""
        if set_id == GLOBAL_ID:
            raise ValueError(with_hint("the global process set (id 0) cannot be removed",
                                       "remove only sets you added"))
        if set_id not in self._sets:
            raise ValueError(self._unknown(set_id))
        del self._sets[set_id]

    def get(self, set_id: int) -> tuple[int, ...]:
        """The sorted global ranks of a set. Raises ValueError for an unknown id."""
        try:
            return self._sets[set_id]
        except KeyError:
            raise ValueError(self._unknown(set_id)) from None

    def ids(self) -> list[int]:
        """Every registered id, ascending (0 first)."""
        return sorted(self._sets)

    def find(self, ranks: Sequence[int]) -> int | None:
        """The id of the set with exactly these ranks, or None."""
        wanted = tuple(ranks)
        return next((i for i, r in self._sets.items() if r == wanted), None)

    def __contains__(self, set_id: object) -> bool:
        return set_id in self._sets

    def __len__(self) -> int:
        return len(self._sets)

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
            raise ValueError(
                with_hint(
                    f"invalid process set {list(ranks)}: {problem}",
                    f"pass sorted, unique global ranks between 0 and {self.size - 1}, "
                    "e.g. sorted(set(ranks))",
                )
            )

    def _unknown(self, set_id: object) -> str:
        return with_hint(f"no process set with id {set_id!r}; known ids: {self.ids()}",
                         "use an id returned by add() that has not been removed")


def local_sets(topology: Topology) -> list[list[int]]:
    """One rank list per host (ranks on the same host), ordered by each host's lowest rank."""
    hosts: dict[str, list[int]] = {}
    for rank, host in enumerate(topology.hostnames):
        hosts.setdefault(host, []).append(rank)
    return list(hosts.values())


def cross_sets(topology: Topology) -> list[list[int]]:
    """One rank list per local rank: the ranks sharing that local_rank across hosts."""
    by_local: dict[int, list[int]] = {}
    for rank in range(topology.size):
        by_local.setdefault(local_rank_of(topology.hostnames, rank), []).append(rank)
    return [by_local[i] for i in sorted(by_local)]


def local_ranks(topology: Topology) -> list[int]:
    """This rank's local set (the ranks on its host)."""
    return topology.local_ranks()


def cross_ranks(topology: Topology) -> list[int]:
    """This rank's cross set (ranks with its local_rank, one per host)."""
    return topology.cross_ranks()
