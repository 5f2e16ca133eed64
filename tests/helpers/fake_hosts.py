"""Ranks that believe they run on several hosts (for local/cross scopes on one machine)."""
from __future__ import annotations


def fake_host_env(rank: int, hosts: list[str]) -> dict[str, str]:
    """The worker variables of ``rank`` when rank i runs on ``hosts[i]``."""
    from accord.runtime.topology import topology_from_hostnames

    t = topology_from_hostnames(rank, hosts)
    return {"ACCORD_HOSTNAME": hosts[rank], "ACCORD_LOCAL_RANK": str(t.local_rank),
            "ACCORD_LOCAL_SIZE": str(t.local_size), "ACCORD_CROSS_RANK": str(t.cross_rank),
            "ACCORD_CROSS_SIZE": str(t.cross_size)}
