"""Where each rank of a job sits, from the ranks' host names: the one rank-coordinate rule.

Horovod's definitions: ``local`` = the ranks on the same host, in rank order; ``cross`` = the
ranks with the same local rank (one per host), in rank order. The launcher assigns slots and
plans elastic re-formations with this rule, and every worker's ``init()`` derives its topology
with it from the host names the ranks exchanged, so the coordinates a launcher writes into a
worker's environment are the ones that worker computes. Pure: no processes, no network.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Coordinates:
    """One rank's place in a job."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    host_index: int  # the index of its host in the order hosts first appear (torchrun's GROUP_RANK)


def local_ranks(hostnames: Sequence[str]) -> list[int]:
    """Each rank's index among the ranks on its host, for the job whose rank r runs on ``hostnames[r]``."""
    seen: dict[str, int] = {}
    ranks = []
    for name in hostnames:
        ranks.append(seen.get(name, 0))
        seen[name] = ranks[-1] + 1
    return ranks


def coordinates(hostnames: Sequence[str]) -> list[Coordinates]:
    """Every rank's coordinates in the job whose rank r runs on ``hostnames[r]``.

    The ranks of one host need not be contiguous (a re-formed elastic job keeps its survivors'
    order and puts the workers that join last).

    Example: ``["a", "b", "a"]`` -> rank 2 is local rank 1 of 2 on host 0 ("a"), cross rank 0 of 1.
    """
    names = list(hostnames)
    locals_ = local_ranks(names)
    host_size: dict[str, int] = {}
    for name in names:
        host_size[name] = host_size.get(name, 0) + 1
    host_order = {name: index for index, name in enumerate(host_size)}
    cross: dict[int, list[int]] = {}  # local rank -> the ranks that have it, in rank order
    for rank, local_rank in enumerate(locals_):
        cross.setdefault(local_rank, []).append(rank)
    cross_rank = {rank: index for peers in cross.values() for index, rank in enumerate(peers)}
    return [Coordinates(rank=rank, size=len(names), local_rank=locals_[rank], local_size=host_size[name],
                        cross_rank=cross_rank[rank], cross_size=len(cross[locals_[rank]]),
                        host_index=host_order[name])
            for rank, name in enumerate(names)]
