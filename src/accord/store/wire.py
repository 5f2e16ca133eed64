"""Authenticated framing for accord's control connections (torch-free).

A connection starts with a hello in each direction: ``MAGIC`` + a 16-byte random nonce. Both
sides send theirs at once, so the handshake costs one round trip. After it, every message is a
frame::

    length (4 bytes, big endian) | tag (32 bytes) | payload (length bytes)

``tag = HMAC-SHA256(secret, DOMAIN | client_nonce | server_nonce | direction | counter | length
| payload)``. The nonces bind a frame to one connection (no replay across connections), the
counter (one per direction, starting at 0) to its place in it (no replay or reordering within
one), and the direction byte stops a frame being reflected back to its sender. The receiver
checks the length against its limit before it reads the payload (an oversized frame is refused
without allocating it) and compares the tag with :func:`hmac.compare_digest` before it decodes
a single byte of the payload.

Payloads are lists of values in a small tagged binary format (:func:`encode` /
:func:`decode`): None, bool, int (64-bit), float, str, bytes and nested lists. No pickle.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import socket
import struct
from typing import Any, Sequence

from accord.errors import AuthenticationError, RendezvousError, with_hint

MAGIC = b"ACW1"
NONCE_SIZE = 16
HELLO_SIZE = len(MAGIC) + NONCE_SIZE
TAG_SIZE = 32
DEFAULT_MAX_FRAME = 64 * 1024 * 1024
CLIENT_TO_SERVER = b"C"
SERVER_TO_CLIENT = b"S"
_DOMAIN = b"accord-wire-v1"
_LENGTH = struct.Struct("!I")
_COUNTER = struct.Struct("!Q")

# Value tags of the payload format.
_NONE, _FALSE, _TRUE, _INT, _FLOAT, _STR, _BYTES, _LIST = range(8)
_I64 = struct.Struct("!q")
_F64 = struct.Struct("!d")
_U32 = struct.Struct("!I")
_MAX_DEPTH = 8


class FrameError(RendezvousError):
    """A frame or payload is malformed, oversized, or the peer is not speaking this protocol."""


def encode(values: Sequence[Any]) -> bytes:
    """Encode a list of None/bool/int/float/str/bytes/list values into a payload."""
    out = bytearray()
    _encode_list(out, values, 0)
    return bytes(out)


def _encode_list(out: bytearray, values: Sequence[Any], depth: int) -> None:
    if depth > _MAX_DEPTH:
        raise ValueError(f"payload nests deeper than {_MAX_DEPTH} lists")
    out += _U32.pack(len(values))
    for value in values:
        if value is None:
            out.append(_NONE)
        elif value is True or value is False:
            out.append(_TRUE if value else _FALSE)
        elif isinstance(value, int):
            out.append(_INT)
            out += _I64.pack(value)
        elif isinstance(value, float):
            out.append(_FLOAT)
            out += _F64.pack(value)
        elif isinstance(value, str):
            data = value.encode("utf-8")
            out.append(_STR)
            out += _U32.pack(len(data)) + data
        elif isinstance(value, (bytes, bytearray, memoryview)):
            data = bytes(value)
            out.append(_BYTES)
            out += _U32.pack(len(data)) + data
        elif isinstance(value, (list, tuple)):
            out.append(_LIST)
            _encode_list(out, value, depth + 1)
        else:
            raise TypeError(f"cannot encode a {type(value).__name__} on the wire")


def decode(payload: bytes) -> list[Any]:
    """Decode a payload made by :func:`encode`.

    Raises:
        FrameError: the payload is truncated, has trailing bytes, an unknown tag or bad UTF-8.
    """
    try:
        values, end = _decode_list(memoryview(payload), 0, 0)
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise FrameError(f"malformed payload ({len(payload)} bytes): {exc}") from None
    if end != len(payload):
        raise FrameError(f"malformed payload: {len(payload) - end} trailing bytes")
    return values


def _decode_list(view: memoryview, pos: int, depth: int) -> tuple[list[Any], int]:
    if depth > _MAX_DEPTH:
        raise FrameError(f"malformed payload: lists nested deeper than {_MAX_DEPTH}")
    (count,) = _U32.unpack_from(view, pos)
    pos += 4
    if count > len(view) - pos:  # every value takes at least one byte: refuse absurd counts early
        raise FrameError(f"malformed payload: {count} values announced, {len(view) - pos} bytes left")
    values: list[Any] = []
    for _ in range(count):
        tag = view[pos]
        pos += 1
        if tag == _NONE:
            values.append(None)
        elif tag in (_FALSE, _TRUE):
            values.append(tag == _TRUE)
        elif tag == _INT:
            values.append(_I64.unpack_from(view, pos)[0])
            pos += 8
        elif tag == _FLOAT:
            values.append(_F64.unpack_from(view, pos)[0])
            pos += 8
        elif tag in (_STR, _BYTES):
            (size,) = _U32.unpack_from(view, pos)
            pos += 4
            if size > len(view) - pos:
                raise FrameError(f"malformed payload: a {size}-byte value overruns the frame")
            data = bytes(view[pos:pos + size])
            pos += size
            values.append(data.decode("utf-8") if tag == _STR else data)
        elif tag == _LIST:
            inner, pos = _decode_list(view, pos, depth + 1)
            values.append(inner)
        else:
            raise FrameError(f"malformed payload: unknown value tag {tag}")
    return values, pos


def _recv_exact(sock: socket.socket, size: int) -> bytes | None:
    """Read exactly ``size`` bytes; None on a clean end of stream before the first byte."""
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(min(size - len(chunks), 1 << 20))
        if not chunk:
            if not chunks:
                return None
            raise FrameError(f"connection closed mid-frame ({len(chunks)} of {size} bytes read)")
        chunks += chunk
    return bytes(chunks)


def new_nonce() -> bytes:
    """A fresh random connection nonce."""
    return os.urandom(NONCE_SIZE)


def hello(nonce: bytes) -> bytes:
    """The bytes a side sends first: the protocol magic and its nonce."""
    return MAGIC + nonce


def read_hello(sock: socket.socket) -> bytes:
    """Read the peer's hello and return its nonce.

    Raises:
        FrameError: the peer closed or sent something that is not an accord hello.
    """
    data = _recv_exact(sock, HELLO_SIZE)
    if data is None:
        raise FrameError("peer closed the connection before its hello")
    if data[: len(MAGIC)] != MAGIC:
        raise FrameError(f"peer is not speaking accord's wire protocol (got {data[:4]!r})")
    return data[len(MAGIC):]


class Channel:
    """One authenticated, ordered connection end. Not thread-safe: one user at a time."""

    def __init__(
        self,
        sock: socket.socket,
        secret: bytes,
        client_nonce: bytes,
        server_nonce: bytes,
        is_server: bool,
        max_frame: int = DEFAULT_MAX_FRAME,
    ) -> None:
        if not secret:
            raise ValueError("the job secret must not be empty")
        self.sock = sock
        self._secret = secret
        self._context = _DOMAIN + client_nonce + server_nonce
        self._send_dir = SERVER_TO_CLIENT if is_server else CLIENT_TO_SERVER
        self._recv_dir = CLIENT_TO_SERVER if is_server else SERVER_TO_CLIENT
        self._send_count = 0
        self._recv_count = 0
        self.max_frame = max_frame

    def _tag(self, direction: bytes, counter: int, length: bytes, payload: bytes) -> bytes:
        mac = hmac.new(self._secret, self._context, hashlib.sha256)
        mac.update(direction + _COUNTER.pack(counter) + length)
        mac.update(payload)
        return mac.digest()

    def send(self, payload: bytes) -> None:
        """Send one frame carrying ``payload``."""
        if len(payload) > self.max_frame:
            raise FrameError(
                with_hint(
                    f"refusing to send a {len(payload)}-byte frame (limit {self.max_frame} bytes)",
                    "store large data elsewhere (the data plane), not in control messages",
                )
            )
        length = _LENGTH.pack(len(payload))
        tag = self._tag(self._send_dir, self._send_count, length, payload)
        self._send_count += 1
        self.sock.sendall(length + tag + payload)

    def recv(self) -> bytes | None:
        """Receive one frame's payload, authenticated; None when the peer closed cleanly.

        Raises:
            FrameError: oversized or truncated frame (nothing beyond the header is read).
            AuthenticationError: the tag does not match (wrong secret, replay, reordering).
        """
        header = _recv_exact(self.sock, _LENGTH.size)
        if header is None:
            return None
        body = _recv_exact(self.sock, self.body_size(header))
        if body is None:
            raise FrameError("connection closed after a frame header")
        return self.open_frame(header, body)

    def body_size(self, header: bytes) -> int:
        """How many bytes follow a frame's 4-byte length ``header`` (tag and payload).

        Raises:
            FrameError: the announced payload exceeds ``max_frame`` (nothing more should be read).
        """
        (size,) = _LENGTH.unpack(header)
        if size > self.max_frame:
            raise FrameError(f"frame of {size} bytes exceeds the limit of {self.max_frame} bytes")
        return TAG_SIZE + size

    def open_frame(self, header: bytes, body: bytes) -> bytes:
        """The payload of the next frame, read elsewhere as ``header`` and ``body``, after its
        tag is checked (the counter advances only then).

        Raises:
            AuthenticationError: the tag does not match.
        """
        size = len(body) - TAG_SIZE
        tag, payload = body[:TAG_SIZE], body[TAG_SIZE:]
        expected = self._tag(self._recv_dir, self._recv_count, header, payload)
        if not hmac.compare_digest(tag, expected):
            raise AuthenticationError(
                with_hint(
                    f"frame {self._recv_count} ({size} bytes) carried a wrong MAC",
                    "every process of the job must use the same secret (ACCORD_JOB_SECRET or "
                    "ACCORD_SECRET_FILE); a stale or foreign process may be connecting",
                )
            )
        self._recv_count += 1
        return payload

    def close(self) -> None:
        """Close the socket (idempotent)."""
        try:
            self.sock.close()
        except OSError:
            pass


def _handshake(sock: socket.socket, secret: bytes, max_frame: int, is_server: bool) -> Channel:
    nonce = new_nonce()
    sock.sendall(hello(nonce))
    peer_nonce = read_hello(sock)
    client_nonce, server_nonce = (peer_nonce, nonce) if is_server else (nonce, peer_nonce)
    return Channel(sock, secret, client_nonce, server_nonce, is_server=is_server, max_frame=max_frame)


def client_handshake(
    sock: socket.socket, secret: bytes, max_frame: int = DEFAULT_MAX_FRAME
) -> Channel:
    """Exchange hellos on a connected socket from the client side; return the channel."""
    return _handshake(sock, secret, max_frame, is_server=False)


def server_handshake(
    sock: socket.socket, secret: bytes, max_frame: int = DEFAULT_MAX_FRAME
) -> Channel:
    """Exchange hellos on an accepted socket from the server side; return the channel."""
    return _handshake(sock, secret, max_frame, is_server=True)
