"""Fixtures for tests on simulated hosts (tools/simcluster): one 2-host cluster per session.

``cluster`` is that shared cluster, checked before each test (every host up, cable plugged) and
after it (nothing but sshd left running on any host; a test that leaves processes fails).
``make_cluster(hosts, rate)`` builds a separate one for tests that need another shape. Tests
skip, with the reason, where namespaces or sshd cannot be had (not root, no openssh-server).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))

from helpers.cluster_jobs import check_idle  # noqa: E402
from simcluster import Cluster, missing_prerequisites  # noqa: E402

_REASON: list[str | None] = []


def _skip_reason() -> str | None:
    if not _REASON:
        _REASON.append(missing_prerequisites())
    return _REASON[0]


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.cluster)


@pytest.fixture(scope="session")
def cluster_session():
    reason = _skip_reason()
    if reason is not None:
        pytest.skip(f"simulated cluster not available: {reason}")
    cluster = Cluster(hosts=2, rate="10gbit").start()
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def cluster(cluster_session):
    """The session's 2-host cluster (h1, h2; 10 Gbit/s links), healthy at the start of the test."""
    for name in cluster_session.hosts:
        cluster_session.start_host(name)
    yield cluster_session
    check_idle(cluster_session)


@pytest.fixture
def make_cluster():
    """Build extra clusters: ``make_cluster(hosts=3, rate="1gbit")`` (``names=[...]``: hosts named
    so instead of h1, h2, ...; ``ssh_port``: sshd's port on every host); closed after the test."""
    reason = _skip_reason()
    if reason is not None:
        pytest.skip(f"simulated cluster not available: {reason}")
    made: list[Cluster] = []

    def make(hosts: int = 2, rate: str | None = None, names: list[str] | None = None,
             ssh_port: int = 22) -> Cluster:
        made.append(Cluster(hosts=0 if names else hosts, rate=rate, ssh_port=ssh_port).start())
        for name in names or ():
            made[-1].add_host(name)
        return made[-1]

    yield make
    try:
        for c in made:
            check_idle(c)
    finally:
        for c in made:
            c.close()


@pytest.fixture
def shared_dir(cluster, request):
    """A fresh folder every host sees (the cluster's shared home), named after the test."""
    path = Path(cluster.shared) / request.node.name.replace("[", "_").replace("]", "")
    path.mkdir(mode=0o777)
    os.chmod(path, 0o777)
    return path
