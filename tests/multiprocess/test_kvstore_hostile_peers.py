"""Parameter servers against hostile peers: a huge frame from a peer without the
secret does not raise the server's memory, nor does a worker's handshake recorded off the wire
and replayed, frames recorded for one server are refused by another (a replayed ``stop``
included), and a worker takes an advertised Unix socket only from a private directory of its
own user."""
from __future__ import annotations

import os
import pwd
import selectors
import shutil
import socket
import struct
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from accord.kvstore import protocol, transport
from accord.kvstore.connection import ServerConnections, pick_endpoint
from accord.kvstore.directory import SERVER_KEY, Advertised
from accord.store.connection import StoreConnection

pytestmark = pytest.mark.timeout(90)


def _cluster(num_servers, num_workers, **kw):
    from accord.kvstore.cluster import LocalCluster

    return LocalCluster(num_servers, num_workers, **kw)


def _advertised(cl) -> list[str]:
    with StoreConnection("127.0.0.1", cl.store.port, cl.secret, timeout=10) as conn:
        return [conn.get(SERVER_KEY.format(index=i)).decode() for i in range(cl.num_servers)]


def _tcp(advertised: str) -> str:
    return advertised.split("|")[0]


def _peak_rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError("no VmHWM in /proc/<pid>/status")


def _ask(conns: ServerConnections, server: int, op: str, fields: dict, payloads=()) -> tuple[dict, list]:
    (answer,) = conns.wait([conns.request(server, op, fields, payloads)[0]], op)
    return answer


# --- item 1: memory is bounded before the MAC is checked ----------------------------------------

_ZMTP = b"\xff" + bytes(8) + b"\x7f" + bytes([3, 0]) + b"PLAIN".ljust(20, b"\0") + bytes(32)


class _Tap:
    """Records the bytes a worker's connection sends, as a peer reading the wire would."""

    def __init__(self, monkeypatch):
        self.sent: list[bytes] = []
        real = socket.socket.send

        def send(sock, data, *args):
            n = real(sock, data, *args)
            self.sent.append(bytes(memoryview(data)[:n]))
            return n

        monkeypatch.setattr(socket.socket, "send", send)


def test_a_300_mib_frame_without_the_secret_leaves_the_servers_memory_and_values_alone(monkeypatch):
    with _cluster(1, 1) as cl:
        (advertised,) = _advertised(cl)
        tap = _Tap(monkeypatch)
        conns = ServerConnections([advertised], cl.secret, rank=0, num_workers=1, timeout=20)
        space = {"ns": 1, "sync": True}
        try:
            start = np.arange(1000, dtype=np.float32)
            _ask(conns, 0, "init", {**space, "key": "w#0", "dtype": "<f4", "n": 1000}, [start])
            monkeypatch.undo()
            opening = next(d for d in tap.sent if len(d) == transport.OPENING_BYTES)
            _ask(conns, 0, "push", {**space, "key": "w#0", "dtype": "<f4"}, [np.ones(1000, np.float32)])
            before = _peak_rss_kib(cl.servers[0].pid)
            big = 300 << 20
            # Peers without the secret, on TCP like a remote host: a ZeroMQ handshake announcing
            # a 300 MiB frame; accord's hello and then a message announcing 300 MiB; the
            # opening a worker sent, recorded off the wire and replayed, then 300 MiB.
            for first in (_ZMTP + b"\x06" + struct.pack("!Q", big) + b"\x05HELLO",
                          transport.hello_bytes(os.urandom(16)) + struct.pack("!IIQ", 64, 100, big),
                          opening + struct.pack("!III", 64, 100, 1) + bytes(164) + struct.pack("!Q", big)):
                outcome = _attack(_tcp(advertised), first, big)
                assert outcome["closed"], outcome  # by the server, long before 300 MiB went in
            grown_mib = (_peak_rss_kib(cl.servers[0].pid) - before) / 1024
            assert grown_mib < 16, f"the server's peak RSS grew by {grown_mib:.0f} MiB"
            # The job goes on, its values untouched: the sync round's value, then another round.
            header, payloads = _ask(conns, 0, "pull", {**space, "key": "w#0"})
            np.testing.assert_array_equal(np.frombuffer(payloads[0], np.float32), np.ones(1000))
            _ask(conns, 0, "push", {**space, "key": "w#0", "dtype": "<f4"}, [np.full(1000, 3, np.float32)])
            header, payloads = _ask(conns, 0, "pull", {**space, "key": "w#0"})
            np.testing.assert_array_equal(np.frombuffer(payloads[0], np.float32), np.full(1000, 3))
            assert cl.servers[0].poll() is None
        finally:
            conns.close()


def _attack(endpoint: str, first: bytes, total: int, within: float = 8.0) -> dict:
    """Write ``first`` and then zeros, up to ``total`` bytes, as fast as the server takes them;
    returns how far it got and whether the server closed the connection."""
    host, port = endpoint[len("tcp://"):].rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=5)
    sock.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE)
    filler, sent, closed = bytes(1 << 20), 0, False
    deadline = time.monotonic() + within
    try:
        while time.monotonic() < deadline and not closed:
            for _, events in sel.select(0.1):
                try:
                    if events & selectors.EVENT_READ and not sock.recv(65536):
                        closed = True
                    elif events & selectors.EVENT_WRITE and sent < total:
                        data = first[sent:] if sent < len(first) else filler[:total - sent]
                        sent += sock.send(data)
                except OSError:
                    closed = True
    finally:
        sel.close()
        sock.close()
    return {"closed": closed, "sent_mib": round(sent / 2**20, 1)}


# --- item 2: no replay across servers ------------------------------------------------------------

class _Recorder:
    """Keeps every list of frames the worker side seals, by the op in its header."""

    def __init__(self, monkeypatch):
        self.frames: list[tuple[str, list[bytes]]] = []
        real = protocol.seal

        def recording_seal(secret, direction, header, payloads=(), *args, **kw):
            frames = real(secret, direction, header, payloads, *args, **kw)
            if direction == protocol.TO_SERVER:
                self.frames.append((header["op"], [bytes(memoryview(f)) for f in frames]))
            return frames

        monkeypatch.setattr(protocol, "seal", recording_seal)

    def last(self, op: str) -> list[bytes]:
        return [frames for name, frames in self.frames if name == op][-1]


def _replay(endpoint: str, frames: list[bytes], token: str, secret: bytes,
            wait_s: float = 1.5) -> list[bytes] | None:
    """Send recorded frames on an authenticated connection, as a peer that writes into a
    worker's connection would; the answer, or None when none came."""
    with transport.Channel(endpoint, secret, token) as channel:
        channel.send(frames)
        return channel.recv(wait_s)


def test_frames_recorded_for_one_server_are_refused_by_another(monkeypatch, tmp_path):
    log_path = tmp_path / "servers.log"
    recorder = _Recorder(monkeypatch)
    with open(log_path, "wb") as log, _cluster(2, 1, stderr=log) as cl:
        endpoints = _advertised(cl)
        conns = ServerConnections(endpoints, cl.secret, rank=0, num_workers=1, timeout=20)
        try:
            assert _ask(conns, 1, "ping", {})[0]["server"] == 1
            assert _ask(conns, 0, "ping", {})[0]["server"] == 0  # recorded, for server 0
            for_server_0 = recorder.last("ping")
            tokens = [Advertised.parse(e).to for e in endpoints]
            # Replayed to server 0 itself: a replay (its seq was seen) is dropped too.
            assert _replay(_tcp(endpoints[0]), for_server_0, tokens[0], cl.secret) is None
            # Sent to server 1, which never saw this session's later sequence numbers.
            assert _replay(_tcp(endpoints[1]), for_server_0, tokens[1], cl.secret) is None
            # A stop meant for server 0 stops server 0 only; replayed to server 1 it is refused.
            _ask(conns, 0, "stop", {"ns": -1, "sync": True})
            stop_for_0 = recorder.last("stop")
            deadline = time.monotonic() + 10  # server indexes come from a store counter
            while all(p.poll() is None for p in cl.servers) and time.monotonic() < deadline:
                time.sleep(0.02)
            (server_1,) = [p for p in cl.servers if p.poll() is None]
            assert _replay(_tcp(endpoints[1]), stop_for_0, tokens[1], cl.secret) is None
            time.sleep(0.5)
            assert server_1.poll() is None, "server 1 obeyed a stop recorded for server 0"
            assert _ask(conns, 1, "ping", {})[0]["server"] == 1  # and keeps serving its worker
        finally:
            conns.close()
    text = log_path.read_text()
    assert "server 1 refused a message addressed to another server" in text, text


# --- item 9: an advertised Unix socket only from a private directory of this user ---------------

def _socket_in(directory: str) -> str:
    path = os.path.join(directory, "server.sock")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(path)
    sock.close()
    return path


@pytest.fixture
def short_path():
    """A folder with a short path: a Unix socket's path must stay under 108 bytes, which
    pytest's nested tmp_path (longer still under pytest-xdist) can exceed."""
    path = tempfile.mkdtemp(prefix="hp-")
    try:
        yield Path(path)
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_a_worker_takes_an_advertised_unix_socket_only_from_a_private_directory_it_owns(short_path):
    tmp_path = short_path
    tcp = "tcp://127.0.0.1:5555"
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    os.chmod(private, 0o700)
    path = _socket_in(str(private))
    assert pick_endpoint(f"{tcp}|ipc://{path}") == f"ipc://{path}"
    os.chmod(private, 0o755)  # others may enter (and so may have placed the socket)
    assert pick_endpoint(f"{tcp}|ipc://{path}") == tcp
    os.chmod(private, 0o700)
    if os.geteuid() == 0:  # another user's private directory
        os.chown(private, pwd.getpwnam("nobody").pw_uid, -1)
        assert pick_endpoint(f"{tcp}|ipc://{path}") == tcp
        os.chown(private, os.geteuid(), -1)
    # A symlinked directory is not taken either (the check is on the directory itself).
    link = tmp_path / "link"
    link.symlink_to(private, target_is_directory=True)
    assert pick_endpoint(f"{tcp}|ipc://{link}/server.sock") == tcp
