"""The rendezvous store: operations, authentication, hostile input, concurrency, timeouts, and
the torch.distributed.Store client."""
from __future__ import annotations

import logging
import os
import socket
import struct
import threading
import time
from datetime import timedelta

import pytest
from helpers.stacks import wait_until, waiting_in

from accord.errors import RendezvousError
from accord.store import wire
from accord.store.connection import StoreConnection
from accord.store.server import StoreServer

pytestmark = pytest.mark.timeout(30)

SECRET = os.urandom(32)


@pytest.fixture
def server():
    with StoreServer(secret=SECRET) as srv:
        yield srv


@pytest.fixture
def conn(server):
    with StoreConnection("127.0.0.1", server.port, SECRET, timeout=5) as c:
        yield c


def _run_threads(targets: list, name: str) -> None:
    threads = [threading.Thread(target=t, name=f"accord-test-{name}-{i}") for i, t in enumerate(targets)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
        assert not t.is_alive()


def test_operations_follow_torch_store_semantics(conn):
    conn.set("a", b"1")
    conn.set("s", "text")
    assert conn.get("a") == b"1" and conn.get("s") == b"text"
    assert conn.add("n", 5) == 5 and conn.add("n", -2) == 3
    assert conn.get("n") == b"3"  # counters are ASCII decimals, like TCPStore
    # compare_set: missing key + empty expected creates; mismatch returns the current value.
    assert conn.compare_set("c", b"", b"v1") == b"v1"
    assert conn.compare_set("c", b"other", b"v2") == b"v1"
    assert conn.compare_set("c", b"v1", b"v2") == b"v2"
    assert conn.compare_set("missing", b"x", b"y") == b"x" and not conn.check(["missing"])
    assert conn.check(["a", "n"]) and not conn.check(["a", "zz"])
    conn.wait(["a", "n"], timeout=1)
    assert conn.num_keys() == 4
    assert conn.delete("a") is True and conn.delete("a") is False
    conn.multi_set(["p", "q"], [b"1", "2"])
    assert conn.multi_get(["p", "q", "c"]) == [b"1", b"2", b"v2"]
    conn.append("p", b"23")
    conn.append("new", b"x")
    assert conn.get("p") == b"123" and conn.get("new") == b"x"
    conn.set("p2", b"abc")
    with pytest.raises(RendezvousError, match="not a counter"):
        conn.add("p2", 1)
    conn.ping()


def test_get_blocks_until_another_client_sets(server, conn):
    found_waiting = []

    def later() -> None:
        # set the key only once the server is blocked on the get (its connection's thread
        # waits on the store's condition), so the get cannot have found the key already there
        found_waiting.append(wait_until(lambda: waiting_in("_wait_for"), timeout=30))
        with StoreConnection("127.0.0.1", server.port, SECRET, timeout=30) as other:
            other.set("late", b"here")

    thread = threading.Thread(target=later, name="accord-test-setter")
    thread.start()
    assert conn.get("late", timeout=60) == b"here"
    thread.join()
    assert found_waiting == [True], "the get never blocked in the server"


def test_get_and_wait_timeouts_raise_rendezvous_error_with_hint(conn):
    with pytest.raises(RendezvousError, match="'never'") as info:
        conn.get("never", timeout=0.3)
    assert "timed out after 0.3s waiting for 1 key(s)" in str(info.value)  # the get's own timeout ended it
    assert "HINT:" in str(info.value)
    with StoreConnection("127.0.0.1", conn.port, SECRET, timeout=5) as c2:
        c2.set("k1", b"")
        with pytest.raises(RendezvousError, match="'k2', 'k3'") as info:
            c2.wait(["k1", "k2", "k3"], timeout=0.2)
        assert "2 key(s)" in str(info.value) and "HINT:" in str(info.value)


def test_wrong_secret_is_refused_and_logged(server, caplog):
    caplog.set_level(logging.WARNING, logger="accord.store")
    with pytest.raises(RendezvousError, match="wrong secret") as info:
        StoreConnection("127.0.0.1", server.port, b"wrong-secret" * 3, timeout=2)
    assert "HINT:" in str(info.value)
    # A raw frame with a wrong MAC carrying a SET: refused before it is decoded.
    sock, nonces = _raw_client(server.port)
    forged = wire.Channel(sock, b"wrong-secret" * 3, nonces[:16], nonces[16:], is_server=False)
    forged.send(wire.encode([1, "x", b"1"]))
    assert sock.recv(100) == b""
    sock.close()
    _wait_for_log(caplog, "wrong MAC")
    assert any("refused connection" in r.getMessage() for r in caplog.records)
    # The key was never written, and honest clients are served as before.
    with StoreConnection("127.0.0.1", server.port, SECRET, timeout=2) as good:
        assert not good.check(["x"])


def _wait_for_log(caplog, text: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if any(text in r.getMessage() for r in caplog.records):
            return
        time.sleep(0.02)
    raise AssertionError(f"no log record containing {text!r}: {[r.getMessage() for r in caplog.records]}")


def _raw_client(port: int) -> tuple[socket.socket, bytes]:
    """A socket that has done the hello exchange; returns it and the server's nonce."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    nonce = wire.new_nonce()
    sock.sendall(wire.hello(nonce))
    server_nonce = wire.read_hello(sock)
    return sock, nonce + server_nonce


def test_malformed_and_oversized_frames_do_not_hurt_the_server(server, caplog):
    caplog.set_level(logging.WARNING, logger="accord.store")
    with StoreConnection("127.0.0.1", server.port, SECRET, timeout=5) as witness:
        witness.set("alive", b"1")
        # Not our protocol at all.
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(100)[:4] == wire.MAGIC  # the server's hello, then it hangs up
        sock.close()
        _wait_for_log(caplog, "not speaking accord's wire protocol")
        # A frame header announcing 4 GiB: refused at once, nothing allocated or read.
        sock, _ = _raw_client(server.port)
        sock.sendall(struct.pack("!I", 0xFFFFFFFF))
        assert sock.recv(100) == b""  # connection closed without waiting for the body
        sock.close()
        _wait_for_log(caplog, "exceeds the limit")
        # Before authenticating, even 1 MiB (well under the 64 MiB limit) is too much.
        sock, _ = _raw_client(server.port)
        sock.sendall(struct.pack("!I", 1 << 20))
        assert sock.recv(100) == b""
        sock.close()
        _wait_for_log(caplog, "limit of 65536 bytes")
        # Random bytes as a frame: wrong MAC.
        sock, _ = _raw_client(server.port)
        sock.sendall(struct.pack("!I", 8) + os.urandom(40))
        assert sock.recv(100) == b""
        sock.close()
        # Half a frame, then the client vanishes.
        sock, _ = _raw_client(server.port)
        sock.sendall(struct.pack("!I", 100) + b"partial")
        sock.close()
        # An authenticated but malformed request is answered with an error, and the
        # connection stays usable.
        sock, nonces = _raw_client(server.port)
        channel = wire.Channel(sock, SECRET, nonces[:16], nonces[16:], is_server=False)
        channel.send(b"\x00\x00\x00\x05garbage")
        status, message = wire.decode(channel.recv())
        assert status == 2 and "malformed" in message
        channel.send(wire.encode([99]))
        status, message = wire.decode(channel.recv())
        assert status == 2 and "unknown store operation" in message
        channel.send(wire.encode([1, "typed", 123]))  # SET with an int value
        status, message = wire.decode(channel.recv())
        assert status == 2 and "bytes" in message
        channel.send(wire.encode([0]))
        assert wire.decode(channel.recv()) == [0]
        channel.close()
        # Through all of it the server kept serving.
        assert witness.get("alive") == b"1"
        assert witness.add("after", 1) == 1


def test_silent_clients_are_dropped_after_the_handshake_timeout(caplog):
    caplog.set_level(logging.WARNING, logger="accord.store")
    with StoreServer(secret=SECRET, handshake_timeout=0.3) as srv:
        silent = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
        hello_only, _ = _raw_client(srv.port)  # a hello, then never a frame
        with StoreConnection("127.0.0.1", srv.port, SECRET, timeout=2) as c:
            c.set("k", b"v")  # served while the silent ones are pending
            time.sleep(0.5)
            c.set("k", b"w")  # an authenticated client may idle longer than the timeout
            assert c.get("k") == b"w"
        assert silent.recv(100)[:4] == wire.MAGIC  # the server's hello
        # then reset after the timeout (a reset, which an honest client retries)
        with pytest.raises(ConnectionResetError):
            silent.recv(100)
        with pytest.raises(ConnectionResetError):
            hello_only.recv(100)
        silent.close()
        hello_only.close()
        _wait_for_log(caplog, "no authenticated request")


def test_a_client_kept_past_the_handshake_timeout_connects_again(monkeypatch):
    # A loaded machine can keep an honest client from sending its first request in time: the
    # server resets that connection, and the client tries again within its own deadline.
    from accord.store import connection

    real, stalls = connection._connect, []

    def slow_first(*args, **kwargs):
        channel = real(*args, **kwargs)
        if not stalls:
            stalls.append(1)
            time.sleep(0.8)  # past the server's 0.3 s, between the hello and the first request
        return channel

    monkeypatch.setattr(connection, "_connect", slow_first)
    with StoreServer(secret=SECRET, handshake_timeout=0.3) as srv:
        with StoreConnection("127.0.0.1", srv.port, SECRET, timeout=5) as c:
            c.set("k", b"v")
            assert c.get("k") == b"v"
    assert stalls == [1]


def test_a_wrong_secret_is_refused_at_once_not_retried(monkeypatch):
    from accord.store import connection

    real, attempts = connection._connect, []

    def counted(*args, **kwargs):
        attempts.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(connection, "_connect", counted)
    with StoreServer(secret=SECRET, handshake_timeout=5) as srv:
        with pytest.raises(RendezvousError, match="wrong secret"):
            StoreConnection("127.0.0.1", srv.port, b"x" * len(SECRET), timeout=30)
    assert attempts == [1]  # refused on the first answer, not retried until the deadline


def test_connections_beyond_the_limit_are_refused(caplog):
    caplog.set_level(logging.WARNING, logger="accord.store")
    with StoreServer(secret=SECRET, max_connections=2) as srv:
        with StoreConnection("127.0.0.1", srv.port, SECRET, timeout=2) as a, \
                StoreConnection("127.0.0.1", srv.port, SECRET, timeout=2):
            with pytest.raises(RendezvousError):
                StoreConnection("127.0.0.1", srv.port, SECRET, timeout=0.5, connect_timeout=0.5)
            _wait_for_log(caplog, "already 2 open")
            a.ping()


def test_eight_concurrent_clients_add_and_get(server):
    clients, rounds = 8, 50
    returned: list[list[int]] = [[] for _ in range(clients)]
    seen: list[list[bytes]] = [[] for _ in range(clients)]

    def work(i: int) -> None:
        with StoreConnection("127.0.0.1", server.port, SECRET, timeout=10) as c:
            for _ in range(rounds):
                returned[i].append(c.add("counter", 1))
            c.set(f"done/{i}", str(i))
            # Blocking gets of every other client's key: they arrive in any order.
            seen[i] = [c.get(f"done/{j}", timeout=10) for j in range(clients)]

    _run_threads([lambda i=i: work(i) for i in range(clients)], "client")
    every = sorted(v for values in returned for v in values)
    assert every == list(range(1, clients * rounds + 1))  # each add was atomic
    for i in range(clients):
        assert returned[i] == sorted(returned[i])
        assert seen[i] == [str(j).encode() for j in range(clients)]
    with StoreConnection("127.0.0.1", server.port, SECRET, timeout=2) as c:
        assert c.get("counter") == str(clients * rounds).encode()


def test_close_wakes_blocked_clients_and_is_idempotent():
    srv = StoreServer(secret=SECRET).start()
    conn = StoreConnection("127.0.0.1", srv.port, SECRET, timeout=120)
    errors: list[Exception] = []

    def blocked() -> None:
        try:
            conn.get("never", timeout=120)
        except RendezvousError as exc:
            errors.append(exc)

    thread = threading.Thread(target=blocked, name="accord-test-blocked")
    thread.start()
    assert wait_until(lambda: waiting_in("_wait_for"), timeout=30), "the get never blocked in the server"
    srv.close()
    srv.close()
    thread.join(40)  # woken by the close, not by its 120 s timeout (a third of it)
    assert not thread.is_alive(), "the blocked get was not woken by close()"
    assert len(errors) == 1 and "HINT:" in str(errors[0])
    assert "the store is shutting down" in str(errors[0]), errors[0]
    assert not [t for t in threading.enumerate() if t.name.startswith("accord-store")]
    with pytest.raises(RendezvousError, match="closed"):
        conn.ping()
    conn.close()


def test_a_client_woken_by_close_finds_nothing_listening_on_the_port():
    """A peer that waits for the server to go and connects again at once (rank 0 hosts the next
    bootstrap's store on the same port) must not reach the closing server."""
    srv = StoreServer(secret=SECRET).start()
    port = srv.port
    conn = StoreConnection("127.0.0.1", port, SECRET, timeout=120)
    reconnects: list[BaseException | None] = []

    def blocked() -> None:
        with pytest.raises(RendezvousError):
            conn.get("never", timeout=120)
        try:  # woken by the close: connect again at once, as the next bootstrap does
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
            reconnects.append(None)
        except OSError as exc:
            reconnects.append(exc)

    thread = threading.Thread(target=blocked, name="accord-test-woken")
    thread.start()
    assert wait_until(lambda: waiting_in("_wait_for"), timeout=30), "the get never blocked in the server"
    stop_accepting = srv._pool.close

    def slow_stop() -> None:  # room for a woken client to reach a listener that is still open
        time.sleep(0.5)
        stop_accepting()

    srv._pool.close = slow_stop
    srv.close()
    thread.join(40)
    conn.close()
    assert len(reconnects) == 1 and isinstance(reconnects[0], ConnectionRefusedError), reconnects


def test_a_handshake_cut_short_by_close_is_reset_so_the_client_retries():
    """A connection still authenticating when the server closes gets a reset (StoreConnection
    connects again), never the orderly close that means "wrong secret"."""
    srv = StoreServer(secret=SECRET).start()
    sock, _ = _raw_client(srv.port)  # hello exchanged, no authenticated frame yet
    try:
        assert wait_until(lambda: srv._pool.pending_count == 1, timeout=10)
        srv.close()
        with pytest.raises(ConnectionResetError):
            if sock.recv(1) == b"":
                raise AssertionError("the server closed the pending connection in order, not with a reset")
    finally:
        sock.close()


def test_port_in_use_and_missing_secret_are_clear_errors(server):
    with pytest.raises(RendezvousError, match="port 0") as info:
        StoreServer(port=server.port, secret=SECRET).start()
    assert "HINT:" in str(info.value)
    with pytest.raises(ValueError, match="secret"):
        StoreServer()


def test_unreachable_store_fails_within_the_timeout():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound but not listening: connections are refused
        with pytest.raises(RendezvousError, match="could not connect") as info:
            StoreConnection("127.0.0.1", port, SECRET, timeout=0.5)
        assert "HINT:" in str(info.value)


def test_store_client_is_a_torch_store_and_thread_safe(server):
    import torch
    import torch.distributed as dist

    from accord.runtime.store_client import StoreClient

    client = StoreClient("127.0.0.1", server.port, SECRET, timeout=5)
    assert isinstance(client, dist.Store) and client.timeout == timedelta(seconds=5)
    prefixed = dist.PrefixStore("job", client)
    prefixed.set("k", "v")
    assert prefixed.get("k") == b"v" and client.get("job/k") == b"v"
    assert prefixed.add("n", 2) == 2
    assert prefixed.compare_set("k", "v", "w") == b"w"
    assert prefixed.check(["k"]) and not prefixed.check(["nope"])
    prefixed.multi_set(["m1", "m2"], ["1", "2"])
    assert prefixed.multi_get(["m1", "m2"]) == [b"1", b"2"]
    prefixed.append("m1", "x")
    assert client.get("job/m1") == b"1x"
    assert client.delete_key("job/m1") and client.num_keys() >= 3
    with pytest.raises(RendezvousError, match="HINT:"):
        prefixed.wait(["nope"], timedelta(seconds=0.2))
    # A thread blocked in get does not hold up another thread's set.
    got: list[bytes] = []
    thread = threading.Thread(target=lambda: got.append(client.get("later")), name="accord-test-get")
    thread.start()
    assert wait_until(lambda: waiting_in("_wait_for"), timeout=30)  # the get waits in the server
    client.set("later", b"ok")
    thread.join(30)
    assert got == [b"ok"]
    # c10d bootstraps through it.
    dist.init_process_group("gloo", store=dist.PrefixStore("pg", client), rank=0, world_size=1,
                            timeout=timedelta(seconds=10))
    try:
        t = torch.tensor([2.0])
        dist.all_reduce(t)
        assert t.item() == 2.0
    finally:
        dist.destroy_process_group()
    client.close()
    client.close()


def test_store_client_with_wrong_secret_fails_at_construction(server):
    from accord.runtime.store_client import StoreClient

    with pytest.raises(RendezvousError, match="wrong secret"):
        StoreClient("127.0.0.1", server.port, b"x" * 32, timeout=2)


def test_frame_limit_applies_to_requests_and_answers():
    with StoreServer(secret=SECRET, max_frame=1024) as srv:
        with StoreConnection("127.0.0.1", srv.port, SECRET, timeout=2) as c:
            c.set("a", b"x" * 600)
            c.set("b", b"y" * 600)
            with pytest.raises(RendezvousError, match="exceeds the frame limit of 1024"):
                c.multi_get(["a", "b"])  # each value fits, the answer would not
            assert c.get("a") == b"x" * 600  # the connection is still good
        with StoreConnection("127.0.0.1", srv.port, SECRET, timeout=2) as c:
            with pytest.raises(RendezvousError):
                c.set("big", b"z" * 2000)  # the server drops the oversized frame
        with StoreConnection("127.0.0.1", srv.port, SECRET, timeout=2) as c:
            assert not c.check(["big"]) and c.num_keys() == 2
