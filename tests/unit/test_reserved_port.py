"""The launcher's held MASTER_PORT: no one else can take it, rank 0's TCPStore still can."""
import errno
import socket
from datetime import timedelta

import pytest
import torch.distributed as dist

from accord.run.processes.job_store import ReservedPort


def _plain_bind(port: int) -> int:
    """0 when a socket without SO_REUSEADDR binds ``port``, else the errno."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as exc:
            return exc.errno
    return 0


@pytest.mark.timeout(30)
def test_a_held_port_is_refused_to_others_and_free_once_released():
    held = ReservedPort(host="127.0.0.1")
    assert held.port > 0
    assert _plain_bind(held.port) == errno.EADDRINUSE
    held.release()
    held.release()  # idempotent
    assert _plain_bind(held.port) == 0


@pytest.mark.timeout(30)
@pytest.mark.parametrize("libuv", [True, False])
def test_torchs_store_binds_and_serves_on_a_held_port(libuv):
    held = ReservedPort()
    try:
        server = dist.TCPStore("127.0.0.1", held.port, 1, True, timeout=timedelta(seconds=10), use_libuv=libuv)
        client = dist.TCPStore("127.0.0.1", held.port, 1, False, timeout=timedelta(seconds=10), use_libuv=libuv)
        server.set("k", "v")
        assert client.get("k") == b"v"
        del client, server
    finally:
        held.release()
