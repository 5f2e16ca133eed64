"""The parameter servers' connections: how a worker and a server prove to each other that they
hold the job secret, and how messages travel between them (TCP, or a Unix socket on one host).

**Handshake.** Neither side ever sends the secret, nor anything a listener could reuse::

    server -> worker   MAGIC | server nonce                              (24 bytes, on accept)
    worker -> server   MAGIC | worker nonce | worker proof               (56 bytes)
    server -> worker   server proof, or a refusal, then the server closes (32 bytes)

    worker proof = HMAC-SHA256(secret, DOMAIN | "worker-proof" | token | server nonce | worker nonce)
    server proof = HMAC-SHA256(secret, DOMAIN | "server-proof" | token | worker nonce | server nonce)

Nonces are 16 random bytes drawn for each connection and ``token`` is the random token of the one
server process (:mod:`accord.kvstore.directory`), so a proof recorded off the wire is refused on
every later connection and by every other server, and the worker knows it reached that server
before it sends a request. Until its proof is checked a connection is 56 bytes of buffer on the
server, which reads nothing more from it (:mod:`accord.kvstore.server.admission`).

**Messages** (either way, after the handshake) carry the frames of :func:`accord.kvstore.protocol.seal`
(``[tags, header, *payloads]``) as::

    u32 len(tags) | u32 len(header) | u32 n | tags | header | n x u64 len(payload) | payloads

The receiver checks the three counts against its limits (:data:`~accord.kvstore.protocol.MAX_HEADER`,
:data:`~accord.kvstore.protocol.MAX_PAYLOADS`, the frame limit for each payload length) before it
buffers anything, and the header tag (which covers the header, the payload lengths and the
payload tag) before it allocates a byte for the payloads: without the secret, a peer on an
authenticated connection (one that injects bytes into it, say) can make the receiver hold one
head (at most 64 bytes + 64 KiB + 8 bytes per announced payload) before the connection is closed.
A message with ``len(tags) == 0`` is a refusal: its header is a reason in UTF-8 (at most
:data:`MAX_REFUSAL` bytes), unauthenticated, and the sender closes the connection after it, so
that the other side fails at once with the reason instead of waiting for an answer.

Torch-free: workers and servers both use it; numpy only for payload buffers (never zeroed).
"""
from __future__ import annotations

import collections
import errno
import hmac
import os
import select
import socket
import struct
import time
from typing import Any, Callable, Sequence

import numpy as np

from accord.errors import AuthenticationError
from accord.kvstore import protocol

__all__ = ["Channel", "Closed", "Inbox", "NONCE_BYTES", "Outbox", "Refused", "Tracker", "WireError",
           "connect_socket", "hello_bytes", "server_proof", "worker_proof"]

MAGIC = b"ACKV\x00\x00\x01\n"  # accord kvstore wire, version 1
NONCE_BYTES = 16
PROOF_BYTES = 32
HELLO_BYTES = len(MAGIC) + NONCE_BYTES
OPENING_BYTES = HELLO_BYTES + PROOF_BYTES  # what a worker sends: its hello and its proof
# In place of the server's proof: the worker's proof was wrong / the server has no room.
REFUSED_SECRET = b"ACKV refused: another secret\n".ljust(PROOF_BYTES, b"\0")
REFUSED_BUSY = b"ACKV refused: no room\n".ljust(PROOF_BYTES, b"\0")
MAX_REFUSAL = 4096
_PREFIX = struct.Struct("!III")
_DOMAIN = protocol.DOMAIN + b"-wire1"
_SMALL = 64 * 1024  # messages up to this size are sent as one copied buffer
_DIRECT = 256 * 1024  # payload bytes still to come from which a read goes straight into the payload
_SCRATCH = 256 * 1024


class WireError(protocol.ProtocolError):
    """The peer broke the framing (a count over a limit): the connection must be closed."""


class Closed(ConnectionError):
    """The peer closed the connection (or it broke)."""


class Refused(AuthenticationError):
    """The peer sent a refusal and closed the connection; ``reason`` says why (unauthenticated)
    and ``kind`` what was refused: ``"mac"`` (a message's MAC, or the proof: another secret or
    another ACCORD_KVSTORE_PAYLOAD_MAC), ``"limit"`` (a count or size over a limit), or ``""``."""

    KINDS = ("mac", "limit")

    def __init__(self, reason: str, kind: str = "") -> None:
        super().__init__(reason)
        self.reason, self.kind = reason, kind

    @classmethod
    def parse(cls, text: str) -> "Refused":
        kind, _, rest = text.partition(": ")
        return cls(rest, kind) if kind in cls.KINDS and rest else cls(text)


def hello_bytes(nonce: bytes) -> bytes:
    """A side's hello: the magic and its nonce."""
    return MAGIC + nonce


def worker_proof(secret: bytes, token: str, server_nonce: bytes, worker_nonce: bytes) -> bytes:
    """What a worker sends to prove it holds ``secret`` to the server with ``token``."""
    return hmac.digest(secret, _DOMAIN + b"worker-proof" + token.encode() + server_nonce + worker_nonce,
                       "sha256")


def server_proof(secret: bytes, token: str, server_nonce: bytes, worker_nonce: bytes) -> bytes:
    """What the server with ``token`` answers to prove it holds ``secret`` too."""
    return hmac.digest(secret, _DOMAIN + b"server-proof" + token.encode() + worker_nonce + server_nonce,
                       "sha256")


def refusal_bytes(kind: str, reason: str) -> bytes:
    """The bytes of a refusal message (see the module docstring): ``kind`` is one of
    :attr:`Refused.KINDS`, ``reason`` what the peer is told."""
    text = f"{kind}: {reason}".encode("utf-8", "replace")[:MAX_REFUSAL]
    return _PREFIX.pack(0, len(text), 0) + text


def _view(frame: Any) -> memoryview:
    view = memoryview(frame)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


# --- sending ---------------------------------------------------------------------------------------

class _Item:
    """One message being sent: its buffers and how far they are written."""

    __slots__ = ("views", "index", "offset", "left", "dropped")

    def __init__(self, views: list[memoryview]) -> None:
        self.views, self.index, self.offset = views, 0, 0
        self.left = sum(v.nbytes for v in views)
        self.dropped = False


class Tracker:
    """Whether a queued message still reads its payloads' memory (the caller's arrays)."""

    __slots__ = ("_item",)

    def __init__(self, item: _Item) -> None:
        self._item = item

    @property
    def done(self) -> bool:
        """True once the message is written to the socket, or will never be (connection gone)."""
        return self._item.left == 0 or self._item.dropped

    def release(self) -> None:
        """Copy what is still unsent, so that the caller may change its arrays now: a slow
        reader then costs a copy, never a wait."""
        item = self._item
        if not self.done:
            rest = item.views[item.index:]
            rest[0] = rest[0][item.offset:]
            item.views, item.index, item.offset = [memoryview(bytes(v)) for v in rest], 0, 0


class Outbox:
    """The messages queued on one connection, written as the socket takes them (non-blocking)."""

    def __init__(self) -> None:
        self._items: collections.deque[_Item] = collections.deque()

    def __bool__(self) -> bool:
        return bool(self._items)

    @property
    def queued_bytes(self) -> int:
        """Bytes queued and not yet written."""
        return sum(item.left for item in self._items)

    def add(self, frames: Sequence[Any], track: bool = False, copy: bool = False) -> Tracker | None:
        """Queue the frames of one message (``[tags, header, *payloads]``). Payloads are copied
        when they are small (64 KiB in all) or with ``copy``; otherwise the queue reads the
        caller's memory until the message is written, which the caller must leave unchanged
        until then (``track`` returns a :class:`Tracker` that says when)."""
        tags, header, payloads = bytes(frames[0]), bytes(frames[1]), [_view(p) for p in frames[2:]]
        lengths = [p.nbytes for p in payloads]
        head = _PREFIX.pack(len(tags), len(header), len(payloads)) + tags + header + \
            struct.pack(f"!{len(lengths)}Q", *lengths)
        if copy or sum(lengths) <= _SMALL:
            views = [memoryview(b"".join([head, *payloads]))]
        else:
            views = [memoryview(head), *(p for p in payloads if p.nbytes)]
        item = _Item(views)
        self._items.append(item)
        return Tracker(item) if track else None

    def add_raw(self, data: bytes) -> None:
        """Queue bytes as they are (a refusal)."""
        self._items.append(_Item([memoryview(data)]))

    def flush(self, sock: socket.socket) -> bool:
        """Write as much as ``sock`` takes now; True when nothing is left.

        Raises:
            OSError: the connection broke.
        """
        items = self._items
        while items:
            item = items[0]
            bufs = item.views[item.index:item.index + 64]
            if item.offset:
                bufs[0] = bufs[0][item.offset:]
            try:
                sent = sock.send(bufs[0]) if len(bufs) == 1 else sock.sendmsg(bufs)
            except (BlockingIOError, InterruptedError):
                return False
            item.left -= sent
            while sent:
                rest = item.views[item.index].nbytes - item.offset
                if sent < rest:
                    item.offset += sent
                    break
                sent -= rest
                item.index, item.offset = item.index + 1, 0
            if item.left:
                return False  # the socket is full
            items.popleft()
        return True

    def drop(self) -> None:
        """The connection is gone: every queued message is abandoned (its tracker is done)."""
        for item in self._items:
            item.dropped = True
        self._items.clear()


# --- receiving -------------------------------------------------------------------------------------

_PREFIX_STAGE, _HEAD, _PAYLOAD, _REFUSAL = range(4)

# check_head(tags, header, payload lengths) -> what the message's consumer needs to open it;
# raises (AuthenticationError, ProtocolError) to refuse the message before its payloads arrive.
CheckHead = Callable[[bytes, bytes, list], Any]


class Inbox:
    """Reads the messages of one connection, checking every count and the header tag before
    it buffers the next part (see the module docstring).

    Args:
        check_head: called with a message's tags, header and payload lengths once they are in;
            what it returns comes out with the message, what it raises ends the connection.
        max_frame: the largest payload accepted.
    """

    def __init__(self, check_head: CheckHead, max_frame: int) -> None:
        self._check_head = check_head
        self._max_frame = int(max_frame)
        self.last_read = time.monotonic()
        self._reset()

    def _reset(self) -> None:
        self._stage, self._need, self._buf = _PREFIX_STAGE, _PREFIX.size, bytearray()
        self._counts = (0, 0, 0)
        self._head: Any = None
        self._payloads: list[memoryview] = []
        self._lengths: list[int] = []
        self._filled = 0

    @property
    def mid_message(self) -> bool:
        """True while a message has started and is not complete."""
        return self._stage != _PREFIX_STAGE or bool(self._buf)

    @property
    def held_bytes(self) -> int:
        """Bytes this connection's unfinished message holds in memory now."""
        return len(self._buf) + sum(p.nbytes for p in self._payloads)

    def receive_once(self, sock: socket.socket) -> list[tuple[Any, list[memoryview]]]:
        """One read from ``sock``; returns the messages it completed, as ``(check_head's result,
        payloads)``.

        Raises:
            BlockingIOError: nothing to read now (non-blocking sockets).
            Closed: the peer closed or reset the connection.
            Refused: the peer sent a refusal.
            WireError, AuthenticationError, ProtocolError: the peer broke the protocol.
        """
        done: list[tuple[Any, list[memoryview]]] = []
        if self._stage == _PAYLOAD and self._lengths[len(self._payloads) - 1] - self._filled >= _DIRECT:
            view = self._payloads[-1][self._filled:]
            n = self._recv_into(sock, view)
            self._filled += n
            if self._filled == self._lengths[len(self._payloads) - 1]:
                self._next_payload(done)
            return done
        data = self._recv(sock)
        view, at = memoryview(data), 0
        while at < len(view):
            if self._stage == _PAYLOAD:
                target = self._payloads[-1]
                take = min(len(view) - at, target.nbytes - self._filled)
                target[self._filled:self._filled + take] = view[at:at + take]
                self._filled += take
                at += take
                if self._filled == target.nbytes:
                    self._next_payload(done)
                continue
            take = min(len(view) - at, self._need - len(self._buf))
            self._buf += view[at:at + take]
            at += take
            if len(self._buf) == self._need:
                self._stage_complete(done)
        return done

    def _recv(self, sock: socket.socket) -> bytes:
        try:
            data = sock.recv(_SCRATCH)
        except (ConnectionResetError, BrokenPipeError, TimeoutError) as exc:
            raise Closed(str(exc)) from None
        if not data:
            raise Closed("closed by the peer")
        self.last_read = time.monotonic()
        return data

    def _recv_into(self, sock: socket.socket, view: memoryview) -> int:
        try:
            n = sock.recv_into(view)
        except (ConnectionResetError, BrokenPipeError, TimeoutError) as exc:
            raise Closed(str(exc)) from None
        if not n:
            raise Closed("closed by the peer")
        self.last_read = time.monotonic()
        return n

    def _stage_complete(self, done: list) -> None:
        data, self._buf = bytes(self._buf), bytearray()
        if self._stage == _PREFIX_STAGE:
            tags_len, header_len, count = _PREFIX.unpack(data)
            if tags_len == 0:
                if header_len > MAX_REFUSAL:
                    raise WireError(f"a refusal of {header_len} bytes (at most {MAX_REFUSAL})")
                self._stage, self._need = _REFUSAL, header_len
                if header_len == 0:
                    raise Refused("")
                return
            if tags_len > 64 or header_len > protocol.MAX_HEADER or count > protocol.MAX_PAYLOADS:
                raise WireError(
                    f"a message announced {tags_len} tag bytes, a {header_len}-byte header and "
                    f"{count} payloads (limits: 64, {protocol.MAX_HEADER}, {protocol.MAX_PAYLOADS})")
            self._counts = (tags_len, header_len, count)
            self._stage, self._need = _HEAD, tags_len + header_len + 8 * count
        elif self._stage == _REFUSAL:
            raise Refused.parse(data.decode("utf-8", "replace"))
        else:
            tags_len, header_len, count = self._counts
            tags, header = data[:tags_len], data[tags_len:tags_len + header_len]
            lengths = list(struct.unpack(f"!{count}Q", data[tags_len + header_len:]))
            too_big = [n for n in lengths if n > self._max_frame]
            if too_big:
                raise WireError(f"a message announced a {too_big[0]}-byte payload, over the frame "
                                f"limit of {self._max_frame} bytes")
            self._head = self._check_head(tags, header, lengths)  # before any payload memory
            self._lengths = lengths
            self._payloads = []
            self._stage = _PAYLOAD
            self._next_payload(done)

    def _next_payload(self, done: list) -> None:
        """Start the next payload, or finish the message when every payload is in."""
        while len(self._payloads) < len(self._lengths):
            size = self._lengths[len(self._payloads)]
            self._payloads.append(memoryview(np.empty(size, np.uint8)).cast("B") if size
                                  else memoryview(b""))
            self._filled = 0
            if size:
                return
        done.append((self._head, self._payloads))
        self._reset()


# --- connecting ------------------------------------------------------------------------------------

def connect_socket(endpoint: str) -> socket.socket:
    """A non-blocking socket with a connection to ``tcp://host:port`` or ``ipc:///path`` started.

    Raises:
        OSError: the address cannot be resolved, or the connection failed at once.
    """
    if endpoint.startswith("ipc://"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        address: Any = endpoint[len("ipc://"):]
    else:
        host, _, port = endpoint[len("tcp://"):].rpartition(":")
        family, kind, proto, _, address = socket.getaddrinfo(host.strip("[]"), int(port),
                                                             type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setblocking(False)
    try:
        err = sock.connect_ex(address)
    except OSError:
        sock.close()
        raise
    if err not in (0, errno.EINPROGRESS, errno.EAGAIN, errno.EWOULDBLOCK, errno.EALREADY):
        sock.close()
        raise OSError(err, os.strerror(err))
    return sock


class Channel:
    """A blocking, authenticated connection to one server, one message at a time (for tools and
    tests; workers use :class:`accord.kvstore.connection.ServerConnections`)."""

    def __init__(self, endpoint: str, secret: bytes, token: str, timeout: float = 10.0,
                 max_frame: int = protocol.frame_limit()) -> None:
        self._sock = connect_socket(endpoint)
        try:
            deadline = time.monotonic() + timeout
            hello = self._read(HELLO_BYTES, deadline)
            if hello[:len(MAGIC)] != MAGIC:
                raise Closed(f"{endpoint} is not a parameter server (it sent {hello[:8]!r})")
            nonce = os.urandom(NONCE_BYTES)
            self._send(hello_bytes(nonce) + worker_proof(secret, token, hello[len(MAGIC):], nonce), deadline)
            answer = self._read(PROOF_BYTES, deadline)
            if not hmac.compare_digest(answer, server_proof(secret, token, hello[len(MAGIC):], nonce)):
                raise Refused(answer.rstrip(b"\0").decode("ascii", "replace").strip())
        except BaseException:
            self._sock.close()
            raise
        self._inbox = Inbox(lambda tags, header, lengths: (tags, header), max_frame)
        self._ready: collections.deque = collections.deque()

    def _wait(self, readable: bool, deadline: float) -> None:
        left = deadline - time.monotonic()
        got = select.select([self._sock] if readable else [], [] if readable else [self._sock], [],
                            max(0.0, left))
        if not got[0] and not got[1]:
            raise TimeoutError("the parameter server did not answer in time")

    def _read(self, size: int, deadline: float) -> bytes:
        data = b""
        while len(data) < size:
            self._wait(True, deadline)
            try:
                chunk = self._sock.recv(size - len(data))
            except BlockingIOError:
                continue
            if not chunk:
                raise Closed("the parameter server closed the connection")
            data += chunk
        return data

    def _send(self, data: bytes, deadline: float) -> None:
        view = memoryview(data)
        while view.nbytes:
            self._wait(False, deadline)
            try:
                view = view[self._sock.send(view):]
            except BlockingIOError:
                continue

    def send(self, frames: Sequence[Any], timeout: float = 10.0) -> None:
        """Send one message (``[tags, header, *payloads]``)."""
        out = Outbox()
        out.add(frames)
        deadline = time.monotonic() + timeout
        while not out.flush(self._sock):
            self._wait(False, deadline)

    def send_raw(self, data: bytes, timeout: float = 10.0) -> None:
        """Send bytes as they are (tests of what a server does with broken framing)."""
        self._send(data, time.monotonic() + timeout)

    def recv(self, timeout: float = 10.0) -> list[bytes] | None:
        """The next message's frames ``[tags, header, *payloads]``, or None after ``timeout``.

        Raises:
            Closed: the server closed the connection. Refused: it sent a refusal.
        """
        deadline = time.monotonic() + timeout
        while not self._ready:
            try:
                self._wait(True, deadline)
            except TimeoutError:
                return None
            try:
                self._ready.extend(self._inbox.receive_once(self._sock))
            except BlockingIOError:
                continue
        (tags, header), payloads = self._ready.popleft()
        return [tags, header, *(bytes(p) for p in payloads)]

    def close(self) -> None:
        """Close the connection."""
        self._sock.close()

    def __enter__(self) -> "Channel":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
