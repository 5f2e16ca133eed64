"""Ranks on this machine posing as several hosts (ACCORD_HOSTNAME and the topology variables), for
the one-machine benchmarks of the hierarchical paths; the simulated cluster (cluster_common.py)
is the real thing."""
from __future__ import annotations


def pose_as_hosts(rank: int, ranks_per_host: int = 2, hosts: int = 2, hierarchical: bool = True) -> None:
    """Before ``session.init()``: this rank says it is local rank ``rank % ranks_per_host`` of host
    ``rank // ranks_per_host`` (``host0``, ``host1``, ...); ``hierarchical`` forces the
    hierarchical allreduce (ACCORD_HIERARCHICAL_ALLREDUCE=1)."""
    from accord import config

    host = rank // ranks_per_host
    variables = {"ACCORD_HOSTNAME": f"host{host}", "ACCORD_LOCAL_RANK": str(rank % ranks_per_host),
                 "ACCORD_LOCAL_SIZE": str(ranks_per_host), "ACCORD_CROSS_RANK": str(host),
                 "ACCORD_CROSS_SIZE": str(hosts)}
    if hierarchical:
        variables["ACCORD_HIERARCHICAL_ALLREDUCE"] = "1"
    config.set_variables(variables)
