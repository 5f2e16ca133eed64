"""Authenticated framing: payload codec, MAC checks, replay/reorder/reflection, size limits."""
from __future__ import annotations

import hashlib
import hmac
import socket
import struct
import threading

import pytest

from accord.errors import AuthenticationError
from accord.store import wire

pytestmark = pytest.mark.timeout(10)

SECRET = b"s" * 32
CN, SN = b"c" * 16, b"n" * 16
_OPEN: list[socket.socket] = []


def _socketpair() -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair()
    _OPEN.extend((a, b))
    return a, b


@pytest.fixture(autouse=True)
def _close_sockets():
    yield
    while _OPEN:
        _OPEN.pop().close()


def _pair(secret_a: bytes = SECRET, secret_b: bytes = SECRET, max_frame: int = 1024):
    a, b = _socketpair()
    a.settimeout(5)
    b.settimeout(5)
    client = wire.Channel(a, secret_a, CN, SN, is_server=False, max_frame=max_frame)
    server = wire.Channel(b, secret_b, CN, SN, is_server=True, max_frame=max_frame)
    return client, server


def _raw_frame(peer: socket.socket) -> bytes:
    """Read one whole frame's raw bytes from the socket."""
    header = peer.recv(4, socket.MSG_WAITALL)
    (size,) = struct.unpack("!I", header)
    return header + peer.recv(wire.TAG_SIZE + size, socket.MSG_WAITALL)


def test_codec_round_trip_every_type():
    values = [None, True, False, 0, -1, 2**63 - 1, -(2**63), 1.5, float("-inf"), "", "héllo ✓",
              b"", b"\x00\xff" * 10, [], [1, [b"x", ["deep", None]]], (3, 4)]
    decoded = wire.decode(wire.encode(values))
    assert decoded[:-1] == values[:-1]
    assert decoded[-1] == [3, 4]  # tuples come back as lists


def test_codec_rejects_unknown_types():
    with pytest.raises(TypeError, match="set"):
        wire.encode([{1, 2}])


@pytest.mark.parametrize(
    "payload",
    [
        b"",  # no count
        b"\x00\x00\x00\x01",  # one value announced, none present
        b"\x00\x00\x00\x01\x03\x00",  # truncated int
        b"\x00\x00\x00\x01\x09",  # unknown tag
        b"\x00\x00\x00\x01\x06\xff\xff\xff\xff",  # 4 GiB bytes value announced
        b"\x00\x00\x00\x01\x05\x00\x00\x00\x02\xff\xfe",  # invalid UTF-8
        b"\x7f\xff\xff\xff",  # two billion values announced in four bytes
        wire.encode([1]) + b"x",  # trailing byte
    ],
)
def test_decode_rejects_malformed_payloads(payload):
    with pytest.raises(wire.FrameError):
        wire.decode(payload)


def test_decode_rejects_deep_nesting():
    nested = b"\x00\x00\x00\x01\x07" * 20 + b"\x00\x00\x00\x00"
    with pytest.raises(wire.FrameError, match="nested"):
        wire.decode(nested)


def test_frames_round_trip_both_directions_in_order():
    client, server = _pair()
    for i in range(3):
        client.send(f"req{i}".encode())
    assert [server.recv() for _ in range(3)] == [b"req0", b"req1", b"req2"]
    server.send(b"")
    server.send(b"answer")
    assert client.recv() == b"" and client.recv() == b"answer"
    client.close()
    assert server.recv() is None  # clean close at a frame boundary
    server.close()


def test_tag_is_hmac_sha256_over_context_direction_counter_length_payload():
    a, b = _socketpair()
    client = wire.Channel(a, SECRET, CN, SN, is_server=False)
    client.send(b"hello")
    raw = b.recv(1024)
    length = struct.pack("!I", 5)
    expected = hmac.new(SECRET, b"accord-wire-v1" + CN + SN + b"C" + struct.pack("!Q", 0) + length
                        + b"hello", hashlib.sha256).digest()
    assert raw == length + expected + b"hello"
    a.close()
    b.close()


def test_wrong_secret_is_refused():
    client, server = _pair(secret_b=b"t" * 32)
    client.send(b"x")
    with pytest.raises(AuthenticationError, match="wrong MAC") as info:
        server.recv()
    assert "HINT:" in str(info.value)


def test_tampered_payload_is_refused_before_decoding():
    a, b = _socketpair()
    client = wire.Channel(a, SECRET, CN, SN, is_server=False)
    client.send(wire.encode(["set", b"value"]))
    raw = bytearray(_raw_frame(b))
    raw[-1] ^= 1
    c, d = _socketpair()
    c.sendall(bytes(raw))
    server = wire.Channel(d, SECRET, CN, SN, is_server=True)
    with pytest.raises(AuthenticationError):
        server.recv()
    for s in (a, b, c, d):
        s.close()


def test_replay_reorder_reflection_and_cross_connection_are_refused():
    a, b = _socketpair()
    client = wire.Channel(a, SECRET, CN, SN, is_server=False)
    client.send(b"first")
    client.send(b"second")
    first, second = _raw_frame(b), _raw_frame(b)

    def fresh_server(nonce_s: bytes = SN) -> tuple[socket.socket, wire.Channel]:
        c, d = _socketpair()
        return c, wire.Channel(d, SECRET, CN, nonce_s, is_server=True)

    # Reordered: "second" arrives first.
    feed, server = fresh_server()
    feed.sendall(second)
    with pytest.raises(AuthenticationError):
        server.recv()
    # Replayed: "first" twice.
    feed, server = fresh_server()
    feed.sendall(first + first)
    assert server.recv() == b"first"
    with pytest.raises(AuthenticationError):
        server.recv()
    # Another connection (different server nonce).
    feed, server = fresh_server(b"m" * 16)
    feed.sendall(first)
    with pytest.raises(AuthenticationError):
        server.recv()
    # Reflected back to a client: the direction byte differs.
    c, d = _socketpair()
    other_client = wire.Channel(d, SECRET, CN, SN, is_server=False)
    c.sendall(first)
    with pytest.raises(AuthenticationError):
        other_client.recv()


def test_oversized_frame_is_refused_without_reading_it():
    a, b = _socketpair()
    b.settimeout(2)
    server = wire.Channel(b, SECRET, CN, SN, is_server=True, max_frame=1024)
    a.sendall(struct.pack("!I", 1025))  # only the header: a reader that waited would time out
    with pytest.raises(wire.FrameError, match="exceeds the limit"):
        server.recv()
    client = wire.Channel(a, SECRET, CN, SN, is_server=False, max_frame=1024)
    with pytest.raises(wire.FrameError, match="HINT:"):
        client.send(b"x" * 1025)
    a.close()
    b.close()


def test_truncated_frame_is_an_error_not_a_clean_close():
    a, b = _socketpair()
    server = wire.Channel(b, SECRET, CN, SN, is_server=True)
    a.sendall(struct.pack("!I", 10) + b"short")
    a.close()
    with pytest.raises(wire.FrameError, match="mid-frame"):
        server.recv()
    b.close()


def test_handshake_exchanges_nonces_and_rejects_strangers():
    a, b = _socketpair()
    result = {}

    def serve() -> None:
        result["server"] = wire.server_handshake(b, SECRET)

    thread = threading.Thread(target=serve, name="accord-test-handshake")
    thread.start()
    client = wire.client_handshake(a, SECRET)
    thread.join(5)
    server = result["server"]
    client.send(b"ping")
    assert server.recv() == b"ping"
    server.send(b"pong")
    assert client.recv() == b"pong"
    a.close()
    b.close()

    c, d = _socketpair()
    d.settimeout(5)
    c.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    with pytest.raises(wire.FrameError, match="not speaking"):
        wire.read_hello(d)
    c.close()
    d.close()


def test_empty_secret_is_rejected():
    a, b = _socketpair()
    with pytest.raises(ValueError):
        wire.Channel(a, b"", CN, SN, is_server=False)
    a.close()
    b.close()


def test_sealed_payloads_open_only_with_the_secret_and_purpose():
    from accord.store.secret import SEAL_BYTES, seal, unseal

    secret = bytes(range(32))
    data = b"\x80\x04pickled object"
    sealed = seal(secret, b"objects", data)
    assert len(sealed) == len(data) + SEAL_BYTES and sealed.endswith(data)
    assert unseal(secret, b"objects", sealed) == data
    flipped = bytearray(sealed)
    flipped[-1] ^= 1
    for bad_secret, purpose, blob in [(secret, b"objects", bytes(flipped)),  # altered data
                                      (b"x" * 32, b"objects", sealed),        # another job
                                      (secret, b"other use", sealed),        # another purpose
                                      (secret, b"objects", sealed[:10]),     # truncated
                                      (secret, b"objects", data)]:           # never sealed
        with pytest.raises(ValueError, match="HINT:"):
            unseal(bad_secret, purpose, blob)
