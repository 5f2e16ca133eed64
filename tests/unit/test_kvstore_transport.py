"""The parameter servers' connections (accord.kvstore.transport, server.admission, server.network):
the secret never travels, strangers are bounded in number, bytes and time, every count is
checked before anything is buffered and the header MAC before payload memory, an unfinished
message is dropped, every refusal reaches the worker with its reason, and a slow reader never
makes the server wait.

The servers run in this process behind their real sockets (loopback); every test takes a few
seconds at most."""
from __future__ import annotations

import os
import socket
import struct
import threading
import time
from typing import Iterator

import numpy as np
import pytest

from accord.errors import AuthenticationError
from accord.kvstore import protocol, transport
from accord.kvstore.connection import ServerConnections, ServerError
from accord.kvstore.directory import Advertised
from accord.kvstore.server.network import ParameterServer

pytestmark = pytest.mark.timeout(60)

SECRET = os.urandom(32)
SYNC = {"ns": 1, "sync": True, "key": "s:w#0"}


@pytest.fixture
def serve():
    """serve(**ParameterServer kwargs) -> (server, endpoint); started in a thread, stopped after."""
    running: list[tuple[ParameterServer, threading.Thread]] = []

    def start(start_now: bool = True, **kw) -> tuple[ParameterServer, str]:
        kw.setdefault("num_workers", 1)
        server = ParameterServer(SECRET, **kw)
        endpoint = server.bind("127.0.0.1", ipc=True)
        thread = threading.Thread(target=server.serve, name="accord-test-transport", daemon=True)
        running.append((server, thread))
        if start_now:
            thread.start()
        return server, endpoint

    yield start
    for server, thread in running:
        server.request_stop()
        if thread.is_alive():
            thread.join(10)
        server.close()


def _tcp(endpoint: str) -> str:
    return endpoint.split("|")[0]


def _tcp_only(endpoint: str) -> str:
    """The advertised value without its Unix socket: a worker on another host."""
    parts = endpoint.split("|")
    return "|".join([parts[0], *(p for p in parts[1:] if not p.startswith("ipc://"))])


def _host_port(endpoint: str) -> tuple[str, int]:
    host, port = _tcp(endpoint)[len("tcp://"):].rsplit(":", 1)
    return host, int(port)


def _ping(endpoint: str, secret: bytes = SECRET, timeout: float = 10) -> dict:
    conns = ServerConnections([endpoint], secret, rank=0, num_workers=1, timeout=timeout)
    try:
        ((header, _),) = conns.wait([conns.request(0, "ping", {})[0]], "ping")
        return header
    finally:
        conns.close()


def _until(condition, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return bool(condition())


def _stalled_opening(host: str, port: int) -> socket.socket:
    """A connection that sends accord's hello and half a proof, then nothing."""
    sock = socket.create_connection((host, port), timeout=5)
    sock.sendall(transport.hello_bytes(os.urandom(16)) + bytes(10))
    return sock


@pytest.fixture
def tap(monkeypatch) -> Iterator[list[bytes]]:
    """Every byte string this process sends on a socket, as a peer on the wire sees them."""
    sent: list[bytes] = []
    real_send, real_sendmsg = socket.socket.send, socket.socket.sendmsg

    def send(sock, data, *args):
        n = real_send(sock, data, *args)
        sent.append(bytes(memoryview(data)[:n]))
        return n

    def sendmsg(sock, buffers, *args):
        buffers = list(buffers)
        n = real_sendmsg(sock, buffers, *args)
        sent.append(b"".join(bytes(b) for b in buffers)[:n])
        return n

    monkeypatch.setattr(socket.socket, "send", send)
    monkeypatch.setattr(socket.socket, "sendmsg", sendmsg)
    yield sent


# --- the handshake -------------------------------------------------------------------------------

def test_the_secret_never_travels_and_a_recorded_handshake_is_refused(serve, tap, monkeypatch):
    server, endpoint = serve()
    assert _ping(_tcp_only(endpoint))["ok"]
    monkeypatch.undo()
    wire = b"".join(tap)
    for form in (SECRET, SECRET.hex().encode(), SECRET.hex().upper().encode()):
        assert form not in wire
    (opening,) = [d for d in tap if len(d) == transport.OPENING_BYTES and d.startswith(transport.MAGIC)]
    # Replayed on a new connection, the worker's opening answers another nonce: refused.
    host, port = _host_port(endpoint)
    with socket.create_connection((host, port), timeout=5) as sock:
        assert sock.recv(transport.HELLO_BYTES)[:len(transport.MAGIC)] == transport.MAGIC
        sock.sendall(opening)
        assert sock.recv(64) == transport.REFUSED_SECRET
        assert sock.recv(64) == b""  # and closed
    assert _until(lambda: server.refusal_count == 1) and server.connection_count == 0


def test_a_worker_refuses_a_server_that_cannot_prove_it_holds_the_secret(serve):
    server, endpoint = serve()
    impostor = ParameterServer(os.urandom(32), num_workers=1)  # another job's server ...
    impostor.token = server.token  # ... claiming to be this one
    fake = impostor.bind("127.0.0.1")
    thread = threading.Thread(target=impostor.serve, daemon=True)
    thread.start()
    try:
        conns = ServerConnections([_tcp(fake) + "|to=" + server.token], SECRET, rank=0, num_workers=1,
                                  timeout=10)
        try:
            with pytest.raises(AuthenticationError, match=r"(?s)refused our proof of the job secret.*HINT"):
                conns.wait([conns.request(0, "ping", {})[0]], "ping")
                conns.wait([conns.request(0, "ping", {})[0]], "ping")
        finally:
            conns.close()
    finally:
        impostor.request_stop()
        thread.join(5)
        impostor.close()


# --- strangers: bounded in number, bytes and time ------------------------------------------------

def test_strangers_never_hold_more_than_the_pending_cap_and_workers_still_get_in(serve):
    server, endpoint = serve(max_pending=8, handshake_timeout=2.0)
    host, port = _host_port(endpoint)
    strangers = [_stalled_opening(host, port) for _ in range(40)]
    try:
        assert _until(lambda: server._admission.evicted >= 32)
        assert server.pending_count <= 8 and server._admission.most_waiting <= 8
        assert _ping(_tcp_only(endpoint))["ok"] and _ping(endpoint)["ok"]  # TCP and the Unix socket
        # the eight left are dropped once their time is up (2 s here; 10 s allowed on a busy machine)
        assert _until(lambda: server.pending_count == 0, timeout=10.0)
    finally:
        for s in strangers:
            s.close()
    assert server.connection_count == 0


def test_a_stranger_that_is_not_accord_is_closed_after_its_first_bytes(serve):
    server, endpoint = serve()
    host, port = _host_port(endpoint)
    zmtp = b"\xff" + bytes(8) + b"\x7f" + bytes([3, 0]) + b"PLAIN".ljust(20, b"\0") + bytes(32)
    with socket.create_connection((host, port), timeout=5) as sock:
        sock.sendall(zmtp + b"\x06" + struct.pack("!Q", 16 << 20) + b"\x05HELLO" + bytes(1 << 16))
        sock.settimeout(5)
        got = b""
        try:
            while chunk := sock.recv(4096):
                got += chunk
        except ConnectionResetError:
            pass
    assert got[:len(transport.MAGIC)] == transport.MAGIC  # the hello, then the close
    assert _until(lambda: server.pending_count == 0) and server.refusal_count >= 1


def test_a_worker_pushed_out_by_a_stranger_during_its_handshake_connects_again(serve):
    server, endpoint = serve(start_now=False, max_pending=1)
    host, port = _host_port(endpoint)
    strangers: list[socket.socket] = []
    # the worker connects first (it waits in the listener's backlog), then a stranger, then the
    # server runs: it accepts the worker, then the stranger, which pushes the worker (the
    # oldest) out; the worker connects again (and pushes the stranger out)
    serving = threading.Thread(target=server.serve, daemon=True)
    threading.Timer(0.3, lambda: strangers.append(_stalled_opening(host, port))).start()
    threading.Timer(0.8, serving.start).start()
    conns = ServerConnections([_tcp_only(endpoint)], SECRET, rank=0, num_workers=1, timeout=10)
    try:
        ((header, _),) = conns.wait([conns.request(0, "ping", {})[0]], "ping")
        assert header["ok"] and server._admission.evicted >= 1 and conns._links[0].attempts == 2
    finally:
        conns.close()
        for s in strangers:
            s.close()
        server.request_stop()
        serving.join(10)


# --- messages: counts first, the header MAC before payload memory ------------------------------

def _channel(server: ParameterServer, endpoint: str) -> transport.Channel:
    return transport.Channel(_tcp(endpoint), SECRET, server.token)


@pytest.mark.parametrize("prefix,expected", [
    ((64, 70_000, 0), "a 70000-byte header and 0 payloads (limits: 64, 65536, 65536)"),
    ((64, 10, 70_000), "10-byte header and 70000 payloads"),
], ids=["header", "payload-count"])
def test_counts_over_a_limit_are_refused_before_anything_is_buffered(serve, prefix, expected):
    server, endpoint = serve()
    with _channel(server, endpoint) as channel:
        channel.send_raw(struct.pack("!III", *prefix))
        with pytest.raises(transport.Refused) as info:
            channel.recv(10)
    assert info.value.kind == "limit" and expected in info.value.reason


def test_a_payload_over_the_frame_limit_is_refused_and_the_worker_told_at_once(serve):
    server, endpoint = serve(max_frame=protocol.frame_limit(1024))
    # the worker does not know the limit (a server that did not advertise it): the server says
    advertised = "|".join(p for p in _tcp_only(endpoint).split("|") if not p.startswith("max="))
    conns = ServerConnections([advertised], SECRET, rank=0, num_workers=1, timeout=30)
    try:
        # told: the 30 s timeout would say "no answer ... within" instead
        with pytest.raises(ServerError, match=r"(?s)refused one of our messages and closed the connection: "
                                              r"a message announced a 4000000-byte payload, over the frame "
                                              r"limit of 81920 bytes.*HINT"):
            conns.wait([conns.request(0, "push", {**SYNC, "dtype": "<f4"}, [np.ones(10**6, np.float32)])[0]])
    finally:
        conns.close()
    assert _ping(endpoint)["ok"]


def test_a_head_with_a_wrong_mac_is_refused_before_its_payloads_arrive(serve):
    server, endpoint = serve()
    header = b'{"op":"push"}'
    with _channel(server, endpoint) as channel:
        # 16 MiB announced, none sent: the refusal comes without waiting for them
        channel.send_raw(struct.pack("!III", 64, len(header), 1) + os.urandom(64) + header
                         + struct.pack("!Q", 16 << 20))
        with pytest.raises(transport.Refused) as info:
            channel.recv(10)
    assert info.value.kind == "mac" and "wrong MAC" in info.value.reason
    assert _until(lambda: server.connection_count == 0)


def test_an_unfinished_message_is_dropped_after_the_message_timeout(serve):
    server, endpoint = serve(message_timeout=1.0)
    payload = np.ones(1 << 20, np.float32)  # 4 MiB
    frames = protocol.seal(SECRET, protocol.TO_SERVER, {"op": "push", "to": server.token}, [payload])
    out = transport.Outbox()
    out.add(frames)
    wire = b"".join(bytes(v) for v in out._items[0].views)
    with _channel(server, endpoint) as channel:
        channel.send_raw(wire[:1 << 20])  # the head and a quarter of the payload, then nothing
        assert _until(lambda: server.connection_count == 1 and server._conns and
                      next(iter(server._conns.values())).inbox.held_bytes > 0)
        with pytest.raises(transport.Closed):  # closed by the server within 10 s (1 s here)
            channel.recv(10)
    assert server.connection_count == 0 and server.refusal_count == 1


def test_a_malformed_but_authentic_message_fails_the_workers_pending_requests_at_once(serve):
    server, endpoint = serve()
    conns = ServerConnections([_tcp_only(endpoint)], SECRET, rank=0, num_workers=1, timeout=30)
    try:
        seq, _ = conns.request(0, "ping", {})
        conns.wait([seq])
        waiting = conns.request(0, "barrier", {"ns": 1, "sync": True, "gen": 1})[0]  # one worker: answered
        conns.wait([waiting])
        # a request the server cannot read, as a worker of another version might send
        nonce = os.urandom(16)
        ptag = protocol._payload_tag(SECRET, protocol.TO_SERVER, nonce, [])
        text = b"[" * 40 + b"]" * 40
        link = conns._links[0]
        link.outbox.add([nonce + ptag + protocol._header_tag(SECRET, protocol.TO_SERVER, True, nonce, ptag,
                                                              text, []), text])
        pending = conns.request(0, "barrier", {"ns": 1, "sync": True, "gen": 2})[0]
        # at once: the 30 s timeout would say "no answer ... within" instead
        with pytest.raises(ServerError, match="a malformed message: .*nests lists or objects"):
            conns.wait([pending])
    finally:
        conns.close()


# --- answers: a slow reader costs a copy, never a wait ------------------------------------------

def test_a_reader_that_does_not_read_never_stalls_the_server_and_gets_the_value_it_asked_for(serve):
    server, endpoint = serve()
    n = 4 << 20  # 16 MiB: more than the socket buffers hold
    worker = ServerConnections([_tcp_only(endpoint)], SECRET, rank=0, num_workers=1, timeout=20)
    try:
        first = np.full(n, 1.0, np.float32)
        worker.wait([worker.request(0, "init", {**SYNC, "dtype": "<f4", "n": n}, [first])[0]])
        with _channel(server, endpoint) as slow:  # asks for the value, then reads nothing
            slow.send(protocol.seal(SECRET, protocol.TO_SERVER,
                                    {"op": "pull", **SYNC, "rank": 0, "nw": 1, "sid": "slow", "seq": 1,
                                     "to": server.token}))
            assert _until(lambda: any(c.outbox for c in server._conns.values()))
            # each round writes the buffers the slow answer reads; a server that waited for the
            # slow reader would leave these unanswered, and the worker's wait fail at its 20 s
            for value in (2.0, 3.0, 4.0):
                seq, _ = worker.request(0, "push", {**SYNC, "dtype": "<f4"}, [np.full(n, value, np.float32)])
                worker.wait([seq])
            frames = slow.recv(20)
        header, payloads = protocol.open_message(SECRET, protocol.TO_WORKER, frames)  # its MAC holds
        np.testing.assert_array_equal(np.frombuffer(payloads[0], np.float32), first)  # the value then
        ((_, latest),) = worker.wait([worker.request(0, "pull", SYNC)[0]])
        assert np.frombuffer(latest[0], np.float32)[0] == 4.0
    finally:
        worker.close()


# --- framing -------------------------------------------------------------------------------------

def test_messages_of_every_size_survive_the_framing_in_order():
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    rng = np.random.default_rng(3)
    sizes = [0, 1, 7, 64 << 10, (64 << 10) + 1, 256 << 10, (256 << 10) + 3, 3 << 20]
    sent = []
    out = transport.Outbox()
    for i, size in enumerate(sizes):
        payloads = [rng.integers(0, 255, size, dtype=np.uint8), b"", rng.integers(0, 255, 5, dtype=np.uint8)]
        frames = protocol.seal(SECRET, protocol.TO_SERVER, {"seq": i}, payloads)
        sent.append(payloads)
        out.add(frames)

    def check_head(tags, header, lengths):
        return protocol.check_head(SECRET, protocol.TO_SERVER, tags, header, lengths)

    inbox = transport.Inbox(check_head, max_frame=protocol.frame_limit())
    got = []
    try:
        while len(got) < len(sizes):
            out.flush(a)
            try:
                got.extend(inbox.receive_once(b))
            except BlockingIOError:
                pass
    finally:
        a.close()
        b.close()
    for i, (head, payloads) in enumerate(got):
        header, payloads = protocol.open_body(SECRET, protocol.TO_SERVER, head, payloads)
        assert header["seq"] == i
        assert [bytes(p) for p in payloads] == [bytes(memoryview(p)) for p in sent[i]]
    assert not inbox.mid_message and inbox.held_bytes == 0


def test_a_refusal_parses_its_kind_and_reason():
    assert (transport.Refused.parse("limit: too big").kind, transport.Refused.parse("limit: too big").reason) \
        == ("limit", "too big")
    assert transport.Refused.parse("odd text").kind == "" and transport.Refused.parse("odd text").reason == "odd text"
    raw = transport.refusal_bytes("mac", "x" * 10_000)
    assert len(raw) == 12 + transport.MAX_REFUSAL
    assert Advertised.parse("tcp://h:1|to=ab").max_frame is None
