"""Rank lists derived from the topology: the ranks of each host, and of each local rank across
hosts (the groups a hierarchical allreduce and a host-local SyncBatchNorm use). Process sets
themselves are kept by :class:`accord.engine.sets.ProcessSetRegistry`."""
from __future__ import annotations

from accord.placement import local_ranks as host_local_ranks
from accord.runtime.topology import Topology


def local_sets(topology: Topology) -> list[list[int]]:
    """One rank list per host (ranks on the same host), ordered by each host's lowest rank."""
    hosts: dict[str, list[int]] = {}
    for rank, host in enumerate(topology.hostnames):
        hosts.setdefault(host, []).append(rank)
    return list(hosts.values())


def cross_sets(topology: Topology) -> list[list[int]]:
    """One rank list per local rank: the ranks sharing that local_rank across hosts."""
    by_local: dict[int, list[int]] = {}
    for rank, local_rank in enumerate(host_local_ranks(topology.hostnames)):
        by_local.setdefault(local_rank, []).append(rank)
    return [by_local[i] for i in sorted(by_local)]


def local_ranks(topology: Topology) -> list[int]:
    """This rank's local set (the ranks on its host)."""
    return topology.local_ranks()


def cross_ranks(topology: Topology) -> list[int]:
    """This rank's cross set (ranks with its local_rank, one per host)."""
    return topology.cross_ranks()
