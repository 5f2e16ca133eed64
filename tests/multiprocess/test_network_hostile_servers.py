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


# --- strangers up to the descriptor limit -------------------------------------------------------

def _limited_server(cluster, limit: int):
    """One server process of ``cluster``'s job whose open-file limit is ``limit``, hard and soft."""
    import subprocess

    from accord import config
    from accord.kvstore.cluster import server_environment
    from accord.worker_contract import server_command

    env = server_environment({**config.snapshot(), **cluster.job_env(), "ACCORD_NUM_SERVERS": "1"}, 1)

    def lower_the_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    return subprocess.Popen(server_command(), env=env, stdin=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=lower_the_limit)


@pytest.mark.skipif(not os.path.exists("/proc/self/limits"), reason="needs Linux's /proc")
def test_silent_connections_beyond_the_descriptor_limit_never_keep_workers_out():
    import signal
    import socket
    import time

    from accord.kvstore.cluster import LocalCluster
    from accord.kvstore.connection import ServerConnections, pick_endpoint
    from accord.kvstore.directory import SERVER_KEY
    from accord.store.connection import StoreConnection

    with LocalCluster(0, 1) as cluster:
        proc = _limited_server(cluster, _LOW)
        strangers: list[socket.socket] = []
        try:
            with StoreConnection("127.0.0.1", cluster.store.port, cluster.secret, timeout=20) as conn:
                conn.wait([SERVER_KEY.format(index=0)], timeout=20)
                advertised = conn.get(SERVER_KEY.format(index=0)).decode()
            assert _soft_open_files(proc.pid) == _LOW
            host, port = advertised.split("|")[0][len("tcp://"):].rsplit(":", 1)
            for _ in range(2 * _LOW):  # twice the server's descriptors, all silent
                strangers.append(socket.create_connection((host, int(port)), timeout=10))
            time.sleep(0.5)
            tcp_only = "|".join(p for p in advertised.split("|") if not p.startswith("ipc://"))
            assert pick_endpoint(advertised).startswith("ipc://")
            for endpoint in (advertised, tcp_only):  # a worker on this host (Unix socket), and on TCP
                conns = ServerConnections([endpoint], cluster.secret, rank=0, num_workers=1, timeout=20)
                try:
                    ((header, _),) = conns.wait([conns.request(0, "ping", {})[0]], "ping")
                    assert header["ok"]
                finally:
                    conns.close()
            assert proc.poll() is None, f"the server exited with {proc.returncode}"
        finally:
            for s in strangers:
                s.close()
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(20)
    assert code == 0  # a clean stop, never an abort (SIGABRT: -6)
