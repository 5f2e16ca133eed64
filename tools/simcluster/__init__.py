"""Simulated multi-host clusters on one Linux machine, for tests and benchmarks.

See :mod:`.cluster` and docs/simulated-cluster.md.
"""
from .cluster import Cluster, Host, Listener, missing_prerequisites, terminate
from .naming import leftovers, reap_stale

__all__ = ["Cluster", "Host", "Listener", "leftovers", "missing_prerequisites", "reap_stale", "terminate"]
