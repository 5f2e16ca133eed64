"""A real parameter-server process and strangers' connections: ZeroMQ holds each one (a file
descriptor) until its handshake passes or times out, so the server raises its own soft limit on
open files, and about a thousand silent connections cannot keep the job's workers out."""
from __future__ import annotations

import os
import resource

import pytest

pytestmark = pytest.mark.timeout(60)

_LOW = 256


def _soft_open_files(pid: int) -> int:
    with open(f"/proc/{pid}/limits") as fh:
        for line in fh:
            if line.startswith("Max open files"):
                return int(line.split()[3])
    raise AssertionError(f"no 'Max open files' line in /proc/{pid}/limits")


@pytest.mark.skipif(not os.path.exists("/proc/self/limits"), reason="needs Linux's /proc")
def test_a_server_process_raises_its_open_file_limit_to_the_hard_limit():
    from accord.kvstore.cluster import LocalCluster

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= _LOW:
        pytest.skip(f"the hard limit on open files ({hard}) leaves nothing to raise")
    resource.setrlimit(resource.RLIMIT_NOFILE, (_LOW, hard))  # the server inherits it
    try:
        cluster = LocalCluster(1, 1)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    with cluster:  # waits until the server registered, which it does after raising the limit
        expected = 1 << 20 if hard == resource.RLIM_INFINITY else min(hard, 1 << 20)
        assert _soft_open_files(cluster.servers[0].pid) == expected
