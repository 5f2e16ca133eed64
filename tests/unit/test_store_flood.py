"""The rendezvous store under a flood of strangers: 200 silent sockets and a
garbage sender neither keep the job's clients out nor fill the log, nor cost a thread each."""
from __future__ import annotations

import collections
import contextlib
import logging
import multiprocessing
import os
import random
import socket
import struct
import threading
import time
from typing import Any

import pytest

from accord.errors import RendezvousError
from accord.store import wire
from accord.store.connection import StoreConnection
from accord.store.server import StoreServer

pytestmark = pytest.mark.timeout(60)

SECRET = os.urandom(32)


def _garbage_sender(port: int, stop: threading.Event, sent: list[int]) -> None:
    rng = random.Random(4)
    while not stop.is_set():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
                sock.sendall(rng.randbytes(rng.randint(1, 300)))
                sent[0] += 1
        except OSError:
            pass


def _job_client(port: int, rank: int, size: int, results: dict) -> None:
    try:
        with StoreConnection("127.0.0.1", port, SECRET, timeout=10, connect_timeout=10) as conn:
            conn.set(f"host/{rank}", f"h{rank}")
            conn.wait([f"host/{r}" for r in range(size)])
            arrived = conn.add("arrived", 1)
            results[rank] = (arrived, sorted(v.decode() for v in conn.multi_get(
                [f"host/{r}" for r in range(size)])))
    except Exception as exc:  # noqa: BLE001 - reported by the test
        results[rank] = exc


def test_silent_sockets_and_garbage_neither_block_clients_nor_flood_the_log(caplog):
    caplog.set_level(logging.WARNING, logger="accord.store")
    with StoreServer(secret=SECRET, max_connections=64) as server:
        threads_before = threading.active_count()
        silent = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(200)]
        stop, sent = threading.Event(), [0]
        garbage = threading.Thread(target=_garbage_sender, args=(server.port, stop, sent),
                                   name="accord-test-garbage")
        garbage.start()
        try:
            time.sleep(0.5)
            # a stranger holds no thread: 200 silent sockets add none
            assert threading.active_count() - threads_before <= 2  # the garbage sender only
            results: dict = {}
            clients = [threading.Thread(target=_job_client, args=(server.port, r, 4, results),
                                        name=f"accord-test-client-{r}") for r in range(4)]
            for t in clients:
                t.start()
            for t in clients:
                t.join(30)
            assert all(not isinstance(v, Exception) for v in results.values()), results
            assert sorted(a for a, _ in results.values()) == [1, 2, 3, 4]
            assert all(hosts == ["h0", "h1", "h2", "h3"] for _, hosts in results.values())
            while sent[0] < 300:  # enough garbage to show the log's bound
                time.sleep(0.05)
        finally:
            stop.set()
            garbage.join(10)
            for sock in silent:
                sock.close()
        refusals = [r for r in caplog.records if r.name == "accord.store" and r.levelno >= logging.WARNING]
        assert server.refusal_count >= 300
        assert len(refusals) <= 5 + server.refusal_count // 100, len(refusals)


def test_a_pending_handshake_is_bounded_and_the_oldest_makes_room():
    with StoreServer(secret=SECRET, max_pending=8, handshake_timeout=30) as server:
        silent = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(20)]
        for sock in silent:
            sock.sendall(wire.MAGIC[:1])  # a start of a hello: past the kernel, into the pool
        try:
            # the first 12 were dropped to make room, with a reset (a client retries on that)
            time.sleep(0.3)
            first = silent[0]
            first.settimeout(5)
            with pytest.raises(ConnectionResetError):
                while first.recv(100):  # the server's hello may come first
                    pass
            with StoreConnection("127.0.0.1", server.port, SECRET, timeout=5) as conn:
                conn.set("k", b"v")
                assert conn.get("k") == b"v"
            deadline = time.monotonic() + 5  # the client left; pending sockets never count
            while server.connection_count and time.monotonic() < deadline:
                time.sleep(0.02)
            assert server.connection_count == 0
        finally:
            for sock in silent:
                sock.close()


class _ResettingProxy:
    """In front of the store: resets the first connection once the client sends its first
    frame (after the hellos; the client's comes first, as the store's kernel waits for it), as
    a store pushing it out of a full handshake queue does, and relays every later one."""

    def __init__(self, target: int) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.target, self.resets = target, 0
        self.sockets: list[socket.socket] = []
        self.threads = [threading.Thread(target=self._serve, name="accord-test-proxy")]
        self.threads[0].start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            upstream = socket.create_connection(("127.0.0.1", self.target))
            self.sockets += [client, upstream]
            if self.resets == 0:
                upstream.sendall(client.recv(wire.HELLO_SIZE, socket.MSG_WAITALL))
                client.sendall(upstream.recv(wire.HELLO_SIZE, socket.MSG_WAITALL))
                client.recv(4096)  # its first frame: answered with a reset
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                client.close()
                upstream.close()
                self.resets += 1
                continue
            for src, dst in ((client, upstream), (upstream, client)):
                relay = threading.Thread(target=_relay, args=(src, dst), name="accord-test-relay")
                relay.start()
                self.threads.append(relay)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes accept(); close() alone does not
        self.listener.close()
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        for thread in self.threads:
            thread.join(10)


def _relay(src: socket.socket, dst: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := src.recv(65536):
            dst.sendall(data)


def test_a_client_pushed_out_before_its_first_answer_connects_again():
    with StoreServer(secret=SECRET) as server:
        proxy = _ResettingProxy(server.port)
        try:
            with StoreConnection("127.0.0.1", proxy.port, SECRET, timeout=5) as conn:
                conn.set("k", b"v")
                assert conn.get("k") == b"v"
        finally:
            proxy.close()
        assert proxy.resets == 1


@pytest.mark.timeout(60)  # under the 90 s connect timeout, which a client that retried would run into
def test_a_refused_secret_is_not_retried():
    with StoreServer(secret=SECRET) as server:
        with pytest.raises(RendezvousError, match="wrong secret"):
            StoreConnection("127.0.0.1", server.port, os.urandom(32), timeout=90)
        assert server.refusal_count == 1  # one attempt: not retried until the 90 s connect timeout


def _flood(port: int, stop: Any) -> None:
    """As many connections as this process can open, never a byte sent: the cheapest flood
    (the oldest closed beyond 800 held, so that it runs as long as the test wants)."""
    held: collections.deque = collections.deque()
    while not stop.is_set():
        with contextlib.suppress(OSError):
            sock = socket.socket()
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", port))
            held.append(sock)
        if len(held) > 800:
            held.popleft().close()


@pytest.mark.timeout(240)
def test_clients_connect_while_processes_flood_the_store_with_connections():
    """Four processes opening connections at full speed kept the store's queue of connections
    not yet accepted full and its handshake queue churning: a client's connection waited in
    the system's SYN retries or was pushed out, and most failed to connect within 10 s. Now
    silent connections stay in the kernel, the store reads what clients sent before it
    accepts more, and a client starts its connection again every second."""
    ctx = multiprocessing.get_context("fork")
    with StoreServer(secret=SECRET, max_pending=128) as server:
        stop = ctx.Event()
        flooders = [ctx.Process(target=_flood, args=(server.port, stop), daemon=True) for _ in range(4)]
        for p in flooders:
            p.start()
        try:
            time.sleep(1.0)  # the flood is at full speed
            # Each client connects and is served while the flood goes on; one the accept loop
            # starved would raise RendezvousError at its connect timeout (generous: a busy
            # machine must not fail this).
            for attempt in range(3):
                with StoreConnection("127.0.0.1", server.port, SECRET, timeout=60, connect_timeout=60) as conn:
                    conn.set(f"k{attempt}", b"v")
                    assert conn.get(f"k{attempt}") == b"v"
            assert server.pending_count <= 2 * 128  # memory stays bounded meanwhile
        finally:
            stop.set()
            for p in flooders:
                p.join(10)
                if p.is_alive():
                    p.kill()
                    p.join()
