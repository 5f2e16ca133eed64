"""Seeded random mutation of valid, authenticated requests: whatever a holder
of the secret sends, the rendezvous store and a parameter server answer, and keep serving.

Each server runs in this process behind its real socket; a few thousand cases each, a few
seconds in all. A failing case is reproducible from its seed and index (printed)."""
from __future__ import annotations

import json
import math
import os
import random
import socket
import threading
import time

import numpy as np
import pytest

from accord.kvstore import protocol, transport
from accord.kvstore.directory import Advertised
from accord.kvstore.server.network import ParameterServer
from accord.store import wire
from accord.store.opcodes import Op, Status
from accord.store.server import StoreServer

pytestmark = pytest.mark.timeout(60)

SEED = 17
SECRET = os.urandom(32)
WEIRD = [None, True, False, 0, -1, 1, 2, 3, 2 ** 31, 2 ** 63 - 1, -2 ** 63, 0.5, -0.0, math.nan,
         math.inf, -math.inf, 1e308, "", "x", "s:w#0", "<f4", "float32", "V8", "U3", "O", "f8,i4",
         [], [1], ["a", "b"], [[1]], b"", b"\x00" * 9]


def _weird(rng: random.Random, depth: int = 0):
    pick = rng.random()
    if pick < 0.8 or depth > 2:
        return rng.choice(WEIRD)
    if pick < 0.9:
        return [_weird(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return rng.randbytes(rng.randint(0, 40))


# --- the rendezvous store -----------------------------------------------------------------------

_BLOCKING = {Op.GET: 2, Op.WAIT: 2, Op.MULTI_GET: 2}  # op -> index of the timeout argument


def _store_valid(rng: random.Random) -> list:
    key = rng.choice(["a", "b", "counter", "missing"])
    op = rng.choice(list(Op))
    return {
        Op.PING: [op], Op.SET: [op, key, b"v"], Op.GET: [op, key, 0.001], Op.ADD: [op, "counter", 1],
        Op.COMPARE_SET: [op, key, b"", b"x"], Op.WAIT: [op, [key], 0.001], Op.CHECK: [op, [key]],
        Op.DELETE: [op, key], Op.NUM_KEYS: [op], Op.MULTI_GET: [op, ["a", key], 0.001],
        Op.MULTI_SET: [op, ["a", "b"], [b"1", b"2"]], Op.APPEND: [op, key, b"+"],
    }[op]


def _store_case(rng: random.Random) -> bytes:
    request = [int(v) if isinstance(v, Op) else v for v in _store_valid(rng)]
    for _ in range(rng.randint(1, 3)):
        kind = rng.random()
        if kind < 0.5 and len(request) > 1:
            request[rng.randrange(1, len(request))] = _weird(rng)
        elif kind < 0.6:
            request[0] = rng.choice([rng.randint(-3, 20), _weird(rng)])
        elif kind < 0.75:
            request.append(_weird(rng))
        elif kind < 0.85 and len(request) > 1:
            request.pop(rng.randrange(1, len(request)))
        elif kind < 0.9:
            request[rng.randrange(len(request))] = 2 ** 62  # counters overflowing 64 bits
    slot = _BLOCKING.get(request[0]) if isinstance(request[0], int) else None
    if slot is not None and slot < len(request):  # a wait may be refused, never long
        t = request[slot]
        if isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) \
                and not 0 <= t <= 0.01:
            request[slot] = 0.001
    data = wire.encode(request)
    if rng.random() < 0.15:  # raw damage to the encoded bytes (still authenticated)
        data = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            if data and rng.random() < 0.7:
                data[rng.randrange(len(data))] = rng.randrange(256)
            else:
                data = data[: rng.randrange(len(data) + 1)]
        data = bytes(data)
    return data


def test_fuzzed_store_requests_are_all_answered_and_the_store_keeps_serving():
    rng = random.Random(SEED)
    with StoreServer(secret=SECRET) as server:
        # every case's answer is awaited up to 30 s: a request that holds the server up (a
        # wait that ignores its 1 ms timeout, a hang) fails its case; slowness alone does not
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        channel = wire.client_handshake(sock, SECRET)
        try:
            for index in range(3000):
                payload = _store_case(rng)
                channel.send(payload)
                try:
                    answer = channel.recv()
                except (OSError, wire.FrameError) as exc:
                    pytest.fail(f"case {index} (seed {SEED}) {payload!r}: no answer ({exc!r})")
                assert answer is not None, f"case {index} (seed {SEED}) {payload!r}: connection closed"
                status = wire.decode(answer)[0]
                assert status in (Status.OK, Status.TIMEOUT, Status.ERROR), (index, payload)
            channel.send(wire.encode([int(Op.SET), "alive", b"1"]))
            assert wire.decode(channel.recv()) == [Status.OK]
        finally:
            channel.close()
        assert server.connection_count == 0 or server.connection_count == 1


# --- a parameter server -------------------------------------------------------------------------

_OPS = ["init", "push", "pull", "barrier", "set_optimizer", "get_states", "set_states", "ping"]


class _Worker:
    """A connection that seals requests like a worker (fresh seq each) and collects answers."""

    def __init__(self, server: ParameterServer, endpoint: str) -> None:
        self.channel = transport.Channel(endpoint.split("|")[0], SECRET, Advertised.parse(endpoint).to)
        self.seq = 0
        self.fields = {"sid": "fuzz", "nw": 2, "to": Advertised.parse(endpoint).to}

    def send(self, header: dict, payloads: list) -> int:
        self.seq += 1
        header = {**self.fields, "seq": self.seq, **header}
        self.channel.send(protocol.seal(SECRET, protocol.TO_SERVER, header, payloads))
        return self.seq

    def answer(self, seq: int, timeout: float = 30.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            frames = self.channel.recv(0.1)
            if frames is not None:
                header, _ = protocol.open_message(SECRET, protocol.TO_WORKER, frames)
                if header.get("seq") == seq:
                    return header
        raise AssertionError(f"no answer to request {seq} within {timeout}s: the server is down")

    def close(self) -> None:
        self.channel.close()


def _ps_valid(rng: random.Random) -> tuple[dict, list]:
    ns = rng.choice([1, 2])
    space = {"ns": ns, "sync": ns == 1}
    key = rng.choice(["s:a#0", "s:b#0", "i:3#0"])
    value = np.arange(8, dtype=np.float32)
    op = rng.choice(_OPS)
    header = {"op": op, **space, "key": key, "rank": rng.choice([0, 1])}
    payloads: list = []
    if op == "init":
        header.update(dtype="<f4", n=8, param_only=rng.random() < 0.3)
        payloads = [value]
    elif op == "push":
        header.update(dtype="<f4", rop=rng.choice(["sum", "max", "min"]))
        payloads = [value]
        if rng.random() < 0.2:
            header["comp"] = [0.5, 8]
            payloads = [np.zeros(1, np.uint32)]
    elif op == "barrier":
        header["gen"] = rng.randint(1, 3)
    elif op == "set_optimizer":
        header["optimizer"] = {"name": rng.choice(["sgd", "adam"]), "params": {"learning_rate": 0.1}}
    elif op == "set_states":
        header["entries"] = [{"key": key, "count": 1, "states": 1, "dtypes": ["<f4"]}]
        payloads = [value]
    return header, payloads


def _ps_case(rng: random.Random) -> tuple[dict, list]:
    header, payloads = _ps_valid(rng)
    for _ in range(rng.randint(1, 3)):
        kind = rng.random()
        names = [k for k in header if k != "op"]
        if kind < 0.45 and names:
            header[rng.choice(names)] = _weird(rng)
        elif kind < 0.55 and names:
            del header[rng.choice(names)]
        elif kind < 0.6:
            header["op"] = rng.choice(_OPS + [_weird(rng)])
        elif kind < 0.7:
            header[rng.choice(["entries", "comp", "optimizer", "gen", "n", "dtype"])] = _weird(rng)
        elif kind < 0.8:  # fewer or more payloads than the header implies
            payloads = [np.arange(rng.randint(0, 9), dtype=np.uint8) for _ in range(rng.randint(0, 3))]
        elif kind < 0.9 and header.get("op") == "set_states":
            header["entries"] = [{"key": "s:a#0", "count": rng.choice([0, 1, "x", None]),
                                  "dtypes": [rng.choice(["<f4", "<f8", "i1", _weird(rng)])
                                             for _ in range(rng.randint(0, 4))]}
                                 for _ in range(rng.randint(0, 3))]
        else:
            payloads = [rng.randbytes(rng.randint(0, 33))]
    return header, payloads


def test_fuzzed_parameter_server_requests_never_stop_the_server():
    rng = random.Random(SEED)
    server = ParameterServer(SECRET, num_workers=2, server_id=0)
    endpoint = server.bind("127.0.0.1")
    thread = threading.Thread(target=server.serve, name="accord-test-fuzz-ps", daemon=True)
    thread.start()
    worker = _Worker(server, endpoint)
    try:
        for index in range(3000):
            header, payloads = _ps_case(rng)
            if header.get("op") == "stop":
                continue
            try:
                json.dumps(header)
            except (TypeError, ValueError):
                continue
            worker.send(header, payloads)
            if index % 50 == 49:
                assert thread.is_alive(), f"the server thread died by case {index} (seed {SEED})"
                pong = worker.answer(worker.send({"op": "ping"}, []))
                assert pong["ok"] and pong["server"] == 0, (index, pong)  # answered within 30 s
        assert thread.is_alive()
        assert worker.answer(worker.send({"op": "ping"}, []))["ok"]
    finally:
        worker.close()
        server.request_stop()
        thread.join(10)
        server.close()
