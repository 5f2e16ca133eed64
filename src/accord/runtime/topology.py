"""Who is where: rank, size, local and cross coordinates, derived from per-rank host names
(the rule is :mod:`accord.placement`'s)."""
from __future__ import annotations

from dataclasses import dataclass

from accord.placement import coordinates, local_ranks


@dataclass(frozen=True)
class Topology:
    """This process's place in the job.

    ``local`` = ranks on the same host; ``cross`` = ranks with the same local_rank on other
    hosts (Horovod's definitions). ``hostnames[r]`` is rank r's host.
    """

    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    hostnames: tuple[str, ...]

    @property
    def homogeneous(self) -> bool:
        """True when every host runs the same number of ranks."""
        counts = {h: self.hostnames.count(h) for h in set(self.hostnames)}
        return len(set(counts.values())) <= 1

    def local_ranks(self) -> list[int]:
        """Global ranks on this rank's host, in rank order."""
        me = self.hostnames[self.rank]
        return [r for r, h in enumerate(self.hostnames) if h == me]

    def cross_ranks(self) -> list[int]:
        """Global ranks that share this rank's local_rank, one per host, in host order."""
        return [r for r, lr in enumerate(local_ranks(self.hostnames)) if lr == self.local_rank]


def local_rank_of(hostnames: tuple[str, ...] | list[str], rank: int) -> int:
    """Index of ``rank`` among the ranks on its host."""
    return local_ranks(hostnames[:rank + 1])[rank]


def topology_from_hostnames(rank: int, hostnames: list[str] | tuple[str, ...]) -> Topology:
    """Derive every coordinate from the list of host names, one per rank (:mod:`accord.placement`)."""
    hosts = tuple(hostnames)
    where = coordinates(hosts)[rank]
    return Topology(
        rank=rank,
        size=where.size,
        local_rank=where.local_rank,
        local_size=where.local_size,
        cross_rank=where.cross_rank,
        cross_size=where.cross_size,
        hostnames=hosts,
    )
