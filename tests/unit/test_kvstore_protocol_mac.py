"""Payload authentication of parameter-server messages: one-time Poly1305 keys, checked before
anything is used; the tags recomputed here from the documented formula with hmac/cryptography."""
import hashlib
import hmac
import socket
import struct
import sys
import threading
from contextlib import contextmanager

import numpy as np
import pytest
from cryptography.hazmat.primitives.poly1305 import Poly1305

from accord.errors import AuthenticationError, ConfigError
from accord.kvstore import protocol, transport
from accord.kvstore.server.network import ParameterServer

pytestmark = pytest.mark.timeout(30)

SECRET = bytes(range(32))
W = protocol.TO_SERVER


def _seal(header, payloads, secret=SECRET, direction=W):
    return protocol.seal(secret, direction, header, payloads)


def _split(tags):
    """(nonce, payload tag, header tag)"""
    return tags[:16], tags[16:32], tags[32:]


@contextmanager
def _serving(seen):
    """A server in a thread whose core records what it is handed; yields (server, channel())."""
    server = ParameterServer(SECRET, num_workers=1)
    server.core.handle = lambda peer, header, payloads: seen.append((header, payloads))
    endpoint = server.bind("127.0.0.1")
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()

    def channel():
        return transport.Channel(endpoint.split("|")[0], SECRET, server.token)

    try:
        yield server, channel
    finally:
        server.request_stop()
        thread.join(5)
        server.close()


def _until(condition, timeout=10.0):
    import time

    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def test_tags_follow_the_documented_construction():
    a, b = np.arange(5, dtype=np.float32), b"\x01\x02\x03"
    frames = _seal({"op": "push", "sid": "s", "seq": 7}, [a, b])
    nonce, ptag, htag = _split(frames[0])
    key = hmac.new(SECRET, b"accord-kvstore-v2" + b"payload-key" + W + nonce, hashlib.sha256).digest()
    body = struct.pack("!Q", 2) + struct.pack("!Q", a.nbytes) + a.tobytes() + struct.pack("!Q", len(b)) + b
    assert ptag == Poly1305.generate_tag(key, body)
    header = frames[1]
    msg = (b"accord-kvstore-v2" + W + b"P" + nonce + ptag + struct.pack("!Q", len(header)) + header
           + struct.pack("!Q", 2) + struct.pack("!2Q", a.nbytes, len(b)))
    assert htag == hmac.new(SECRET, msg, hashlib.sha256).digest()
    # header-only mode: no payload tag, mode "L"
    frames = protocol.seal(SECRET, W, {"op": "pull"}, [b], payload_mac=False)
    nonce, htag = frames[0][:16], frames[0][16:]
    msg = (b"accord-kvstore-v2" + W + b"L" + nonce + struct.pack("!Q", len(frames[1])) + frames[1]
           + struct.pack("!Q", 1) + struct.pack("!Q", len(b)))
    assert htag == hmac.new(SECRET, msg, hashlib.sha256).digest()


def test_a_tampered_payload_byte_is_refused_before_anything_is_used():
    payload = np.linspace(0, 1, 1000, dtype=np.float32)
    frames = _seal({"op": "push", "sid": "s", "seq": 1}, [payload])
    for where in (0, 1999, payload.nbytes - 1):
        raw = bytearray(payload.tobytes())
        raw[where] ^= 0x01
        with pytest.raises(AuthenticationError, match="payload"):
            protocol.open_message(SECRET, W, [frames[0], frames[1], bytes(raw)])
    # the payload tag is checked before the header is parsed: a validly tagged header that is not
    # an object would be a ProtocolError, but the tampered payload is refused first
    odd = _seal([1, 2], [payload])
    with pytest.raises(AuthenticationError):
        protocol.open_message(SECRET, W, [odd[0], odd[1], payload[::-1].copy()])
    # and a server never hands the request to its core: it refuses it and closes the connection
    seen = []
    with _serving(seen) as (server, channel):
        frames = _seal({"op": "push", "sid": "s", "seq": 1, "to": server.token}, [payload])
        raw = bytearray(payload.tobytes())
        raw[5] ^= 0x80
        with channel() as bad:
            bad.send([frames[0], frames[1], bytes(raw)])
            with pytest.raises(transport.Refused, match="payload bytes do not match their MAC"):
                bad.recv(10)
        assert seen == [] and server.refusal_count == 1
        with channel() as good:
            good.send(frames)
            assert _until(lambda: len(seen) == 1) and seen[0][0]["seq"] == 1
        np.testing.assert_array_equal(np.frombuffer(seen[0][1][0], np.float32), payload)


def test_payloads_swapped_between_two_valid_messages_are_refused():
    x, y = np.full(8, 1.0, np.float32), np.full(8, 2.0, np.float32)  # same lengths
    one = _seal({"op": "push", "sid": "s", "seq": 1}, [x])
    two = _seal({"op": "push", "sid": "s", "seq": 2}, [y])
    assert protocol.open_message(SECRET, W, one)[0]["seq"] == 1
    assert protocol.open_message(SECRET, W, two)[0]["seq"] == 2
    with pytest.raises(AuthenticationError, match="payload"):
        protocol.open_message(SECRET, W, [one[0], one[1], y])
    with pytest.raises(AuthenticationError, match="payload"):
        protocol.open_message(SECRET, W, [two[0], two[1], x])
    # nor can one message's nonce and payload tag be grafted onto the other's header
    with pytest.raises(AuthenticationError, match="header"):
        protocol.open_message(SECRET, W, [one[0][:32] + two[0][32:], two[1], x])


def test_reordered_truncated_or_extended_payload_frames_are_refused():
    a, b = np.zeros(4, np.float32), np.ones(4, np.float32)
    frames = _seal({"op": "set_states", "sid": "s", "seq": 3}, [a, b])
    with pytest.raises(AuthenticationError, match="payload"):
        protocol.open_message(SECRET, W, [frames[0], frames[1], b, a])
    with pytest.raises(AuthenticationError):
        protocol.open_message(SECRET, W, frames[:3])
    with pytest.raises(AuthenticationError):
        protocol.open_message(SECRET, W, [*frames, b""])
    # bytes moved across the boundary between two payloads (total unchanged)
    joined = a.tobytes() + b.tobytes()
    with pytest.raises(AuthenticationError):
        protocol.open_message(SECRET, W, [frames[0], frames[1], joined[:12], joined[12:]])


def test_wrong_secret_wrong_direction_and_garbage_tags_are_refused():
    frames = _seal({"op": "pull", "sid": "s", "seq": 1}, [b"abc"])
    with pytest.raises(AuthenticationError, match="HINT"):
        protocol.open_message(b"\xff" * 32, W, frames)
    with pytest.raises(AuthenticationError):
        protocol.open_message(SECRET, protocol.TO_WORKER, frames)
    forged = protocol.seal(b"\xff" * 32, W, {"op": "pull", "sid": "s", "seq": 1}, [b"abc"])
    with pytest.raises(AuthenticationError):
        protocol.open_message(SECRET, W, forged)
    for tags in (b"", b"\0" * 64, frames[0][:63], frames[0] + b"\0"):
        with pytest.raises(AuthenticationError):
            protocol.open_message(SECRET, W, [tags, *frames[1:]])


def test_a_replayed_message_is_still_dropped_by_the_server():
    seen = []
    with _serving(seen) as (server, channel):
        first = _seal({"op": "ping", "sid": "ab", "seq": 1, "to": server.token}, [b"x"])
        second = _seal({"op": "ping", "sid": "ab", "seq": 2, "to": server.token}, [b"x"])
        with channel() as one, channel() as two:
            for link, frames in ((one, first), (two, first), (one, second), (two, first), (one, second)):
                link.send(frames)  # valid tags, old seqs, on either connection
            assert _until(lambda: server._dropped.count == 3)
        assert [header["seq"] for header, _ in seen] == [1, 2]
        assert server.refusal_count == 0  # authentic, so dropped as replays, not refused


def test_one_time_keys_differ_between_messages_with_identical_payloads():
    payload = np.ones(64, np.float32)
    header = {"op": "push", "sid": "s", "seq": 1}
    tags = {_seal(header, [payload])[0] for _ in range(20)}  # even the same header twice
    tags |= {_seal({**header, "seq": 2}, [payload])[0] for _ in range(5)}
    assert len(tags) == 25
    nonces, ptags, htags = zip(*(_split(t) for t in tags))
    assert len(set(nonces)) == len(set(htags)) == len(set(ptags)) == 25
    keys = {hmac.new(SECRET, b"accord-kvstore-v2payload-key" + W + n, hashlib.sha256).digest()
            for n in nonces}
    assert len(keys) == 25


def test_a_payload_seal_is_reused_only_for_the_same_unchanged_payloads():
    S = protocol.TO_WORKER
    value = np.arange(32, dtype=np.float32)
    saved = protocol.PayloadSeal()
    one = protocol.seal(SECRET, S, {"sid": "a", "seq": 1}, [value], saved)
    two = protocol.seal(SECRET, S, {"sid": "b", "seq": 9}, [value], saved)
    assert _split(one[0])[:2] == _split(two[0])[:2] == (saved.nonce, saved.tag)  # Poly1305 once
    assert _split(one[0])[2] != _split(two[0])[2]  # each answer has its own header tag
    for frames in (one, two):
        assert protocol.open_message(SECRET, S, frames)[1][0] is value
    # the seal is only good for those bytes: changed bytes under a reused seal are refused
    value[0] = 99
    with pytest.raises(AuthenticationError, match="payload"):
        protocol.open_message(SECRET, S, protocol.seal(SECRET, S, {"seq": 3}, [value], saved))
    saved.clear()  # what a sender does before changing the bytes: a new nonce, a new key
    three = protocol.seal(SECRET, S, {"seq": 4}, [value], saved)
    assert _split(three[0])[0] != _split(one[0])[0]
    assert protocol.open_message(SECRET, S, three)[0] == {"seq": 4}
    # another direction or other lengths never take the saved seal
    four = protocol.seal(SECRET, W, {"seq": 5}, [value], saved)
    five = protocol.seal(SECRET, W, {"seq": 6}, [value[:8]], saved)
    assert len({_split(f[0])[0] for f in (three, four, five)}) == 3
    assert protocol.open_message(SECRET, W, five)[0] == {"seq": 6}


def test_the_server_reuses_a_stored_values_seal_until_the_value_changes():
    from accord.kvstore.server.core import ServerCore

    sent = []

    def reply(peer, request, fields, payloads, reuse, buf):
        frames = protocol.seal(SECRET, protocol.TO_WORKER, {"seq": request["seq"], **fields}, payloads, reuse)
        header, got = protocol.open_message(SECRET, protocol.TO_WORKER, frames)  # as a worker would
        sent.append((request["op"], _split(frames[0])[0], np.frombuffer(got[0], np.float32).copy()
                     if got else None))

    core = ServerCore(2, 0, reply)

    def req(op, rank, seq, payloads=(), **fields):
        header = {"op": op, "rank": rank, "seq": seq, "ns": 1, "sync": True, "nw": 2,
                  "key": "i:0#0", "dtype": "<f4", **fields}
        core.handle(None, header, [memoryview(np.ascontiguousarray(p)).cast("B") for p in payloads])

    req("init", 0, 1, [np.zeros(4, np.float32)], n=4)
    req("pull", 0, 2)
    req("pull", 1, 1)
    assert sent[1][1] == sent[2][1]  # one nonce (one Poly1305 pass) for both pulls of a version
    for rnd in range(2):
        req("push", 0, 3 + 2 * rnd, [np.full(4, rnd + 1.0, np.float32)])
        req("push", 1, 2 + 2 * rnd, [np.full(4, 10.0, np.float32)])
        req("pull", 0, 4 + 2 * rnd)
        req("pull", 1, 3 + 2 * rnd)
        np.testing.assert_array_equal(sent[-1][2], np.full(4, rnd + 11.0, np.float32))
        np.testing.assert_array_equal(sent[-2][2], sent[-1][2])
        assert sent[-1][1] == sent[-2][1]
    pulls = [nonce for op, nonce, _ in sent if op == "pull"]
    assert len(set(pulls)) == 3  # a new seal for each new value


def test_zero_copy_frames_and_empty_payloads_verify():
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    try:
        big = np.random.default_rng(0).standard_normal(300_000).astype(np.float32)
        out = transport.Outbox()
        tracker = out.add(_seal({"op": "push", "seq": 1}, [big, b"", big[:1]]), track=True)
        inbox = transport.Inbox(lambda tags, header, lengths: protocol.check_head(SECRET, W, tags, header, lengths),
                                max_frame=protocol.frame_limit())
        got = []
        while not got:
            out.flush(a)
            try:
                got = inbox.receive_once(b)
            except BlockingIOError:
                pass
        assert tracker.done and not out
        (head, payloads), = got
        header, payloads = protocol.open_body(SECRET, W, head, payloads)
        np.testing.assert_array_equal(np.frombuffer(payloads[0], np.float32), big)
        assert bytes(payloads[1]) == b"" and header["seq"] == 1
    finally:
        a.close()
        b.close()


def test_missing_cryptography_is_a_clear_error(monkeypatch):
    from accord.kvstore.connection import ServerConnections

    monkeypatch.setattr(protocol, "_poly1305", [])
    monkeypatch.setitem(sys.modules, "cryptography.hazmat.primitives.poly1305", None)
    with pytest.raises(ConfigError, match=r"pip install 'accord\[ps\]'"):
        protocol.seal(SECRET, W, {"op": "ping"}, [b"x"])
    with pytest.raises(ConfigError, match="cryptography"):
        ServerConnections(["tcp://127.0.0.1:1"], SECRET, 0, 1, timeout=1.0)
    # headers alone need no extra package (ACCORD_KVSTORE_PAYLOAD_MAC=0)
    frames = protocol.seal(SECRET, W, {"op": "ping"}, [b"x"], payload_mac=False)
    assert protocol.open_message(SECRET, W, frames, payload_mac=False)[0] == {"op": "ping"}


def test_servers_keep_freed_message_buffers_on_glibc():
    # Process wide, so checked in a child process: glibc accepts both mallopt settings.
    import subprocess
    import sys

    code = "from accord.kvstore.server.memory import retain_freed_memory as r; print(r())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"
