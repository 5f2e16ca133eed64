"""The job's rendezvous store: an authenticated key-value server and its torch-free client.

:class:`StoreServer` keeps ``str -> bytes`` pairs in memory and serves them over
:mod:`accord.store.wire` (every frame carries an HMAC-SHA256 with the per-job secret, checked
before anything is decoded). One daemon thread accepts and runs every handshake
(:mod:`accord.store.handshake`: bounded, no thread per stranger); each connection that has sent
an authentic first frame gets a thread of its own, so a client blocked in ``get``/``wait`` holds
up nobody else. Counters made by ``add`` are stored as
ASCII decimals, like torch's TCPStore, so ``get`` of a counter returns ``b"3"``.

:class:`StoreConnection` is the client end (one socket, not thread-safe); the launcher uses it
directly, and :class:`accord.runtime.store_client.StoreClient` pools them for torch.

Security: a connection whose hello or MAC is wrong is closed and logged (at a bounded rate) on
the ``accord.store`` logger; malformed or oversized frames close only that connection; every
authenticated request gets an answer, an error one when it is malformed. The server binds
loopback unless the caller asks for another address.
"""
from __future__ import annotations

import enum
import itertools
import logging
import math
import socket
import struct
import threading
import time
from typing import Any, Callable, Sequence

from accord.errors import AuthenticationError, RendezvousError, with_hint
from accord.logs import Refusals
from accord.store import wire
from accord.store.handshake import HandshakePool

log = logging.getLogger("accord.store")

_INT64 = (-(1 << 63), (1 << 63) - 1)

# Largest frame accepted before a connection has authenticated itself.
_FIRST_FRAME_LIMIT = 64 * 1024


class Op(enum.IntEnum):
    """Request codes of the store protocol."""

    PING = 0
    SET = 1
    GET = 2
    ADD = 3
    COMPARE_SET = 4
    WAIT = 5
    CHECK = 6
    DELETE = 7
    NUM_KEYS = 8
    MULTI_GET = 9
    MULTI_SET = 10
    APPEND = 11


class Status(enum.IntEnum):
    """First value of every response."""

    OK = 0
    TIMEOUT = 1
    ERROR = 2


class StoreServer:
    """An in-memory key-value store served to authenticated clients.

    Args:
        host: address to bind (loopback by default; "0.0.0.0" only for multi-host jobs).
        port: port to bind; 0 lets the OS pick a free one (read it from ``.port``).
        secret: the per-job secret every client must prove it holds.
        max_frame: largest frame accepted, in bytes; bigger ones close the connection.
        handshake_timeout: seconds a new connection has to send its first authenticated frame.
        max_connections: authenticated connections beyond this many are refused (and logged).
        max_pending: most connections waiting to authenticate at once (one more drops the
            oldest); they never count against ``max_connections``.

    Example::

        with StoreServer(secret=secret) as server:   # 127.0.0.1, a free port
            port = server.port
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        secret: bytes | None = None,
        *,
        max_frame: int = wire.DEFAULT_MAX_FRAME,
        handshake_timeout: float = 5.0,
        max_connections: int = 4096,
        max_pending: int = 128,
    ) -> None:
        if not secret:
            raise ValueError(with_hint("StoreServer needs a non-empty secret", "pass secret=os.urandom(32)"))
        self.host = host
        self._requested_port = port
        self._secret = bytes(secret)
        self._max_frame = max_frame
        self._handshake_timeout = handshake_timeout
        self._max_connections = max_connections
        self._max_pending = max_pending
        self._refusals = Refusals(log)
        self._pool: HandshakePool | None = None
        self._data: dict[str, bytes] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._listener: socket.socket | None = None
        self._accept_thread: threading.Thread | None = None
        self._conns: dict[int, tuple[socket.socket, threading.Thread]] = {}
        self._conn_ids = itertools.count()
        self._lock = threading.Lock()  # guards _conns
        self._ops: dict[int, Callable[..., list[Any]]] = {
            Op.PING: lambda: [Status.OK],
            Op.SET: self._set,
            Op.GET: self._get,
            Op.ADD: self._add,
            Op.COMPARE_SET: self._compare_set,
            Op.WAIT: self._wait,
            Op.CHECK: self._check,
            Op.DELETE: self._delete,
            Op.NUM_KEYS: self._num_keys,
            Op.MULTI_GET: self._multi_get,
            Op.MULTI_SET: self._multi_set,
            Op.APPEND: self._append,
        }

    # --- lifecycle ---------------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The bound port (the OS's choice when constructed with port 0), after start()."""
        if self._listener is None:
            return self._requested_port
        return self._listener.getsockname()[1]

    @property
    def refusal_count(self) -> int:
        """How many connections were refused or dropped before authenticating (or over the cap)."""
        return self._refusals.count

    @property
    def connection_count(self) -> int:
        """How many authenticated client connections are open right now."""
        with self._lock:
            return len(self._conns)

    def has_keys(self, keys: Sequence[str]) -> bool:
        """True when every key exists (in-process check for the server's owner)."""
        with self._cond:
            return all(k in self._data for k in keys)

    def start(self) -> "StoreServer":
        """Bind, listen and serve in background daemon threads. Returns self.

        Raises:
            RendezvousError: the address cannot be bound (port in use, unknown address).
        """
        if self._listener is not None:
            return self
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind((self.host, self._requested_port))
        except OSError as exc:
            listener.close()
            raise RendezvousError(
                with_hint(
                    f"the rendezvous store could not bind {self.host}:{self._requested_port}: {exc}",
                    "choose another port, or port 0 to let the OS pick a free one",
                )
            ) from None
        listener.listen(512)
        self._listener = listener
        self._pool = HandshakePool(listener, self._secret, timeout=self._handshake_timeout,
                                   max_pending=self._max_pending,
                                   first_frame_limit=min(self._max_frame, _FIRST_FRAME_LIMIT),
                                   on_authenticated=self._admit, refusals=self._refusals)
        self._accept_thread = threading.Thread(
            target=self._pool.run, name="accord-store-accept", daemon=True
        )
        self._accept_thread.start()
        log.debug("store serving on %s:%d", self.host, self.port)
        return self

    def close(self) -> None:
        """Stop serving, drop every connection and join every thread (idempotent)."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()  # wake blocked get/wait so their threads can finish
        if self._pool is not None:
            self._pool.close()
        if self._listener is not None:
            try:
                self._listener.shutdown(socket.SHUT_RDWR)  # wakes accept() on Linux
            except OSError:
                pass
            self._listener.close()
        if self._accept_thread is not None:
            self._accept_thread.join(5.0)
        with self._lock:
            conns = list(self._conns.values())
        for sock, _ in conns:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for _, thread in conns:
            thread.join(5.0)

    def __enter__(self) -> "StoreServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- connections -------------------------------------------------------------------------

    def _admit(self, channel: wire.Channel, first: bytes, peer: str) -> None:
        """Serve a connection that has authenticated (its first frame's MAC was right)."""
        with self._lock:
            if not self._closed and len(self._conns) < self._max_connections:
                conn_id = next(self._conn_ids)
                thread = threading.Thread(
                    target=self._serve, args=(conn_id, channel, first, peer),
                    name=f"accord-store-conn-{conn_id}", daemon=True,
                )
                self._conns[conn_id] = (channel.sock, thread)
                thread.start()
                return
            count = len(self._conns)
        if not self._closed:
            self._refusals.log("accord store refused a connection from %s: already %d open",
                               peer, count)
        channel.close()

    def _serve(self, conn_id: int, channel: wire.Channel, first: bytes, peer: str) -> None:
        sock = channel.sock
        try:
            sock.settimeout(None)
            channel.max_frame = self._max_frame
            payload: bytes | None = first
            while payload is not None and not self._closed:
                channel.send(self._respond(payload, peer))
                payload = channel.recv()  # MAC checked here, before decoding
        except AuthenticationError as exc:
            self._refusals.log("accord store refused connection from %s: %s", peer, exc)
        except wire.FrameError as exc:
            self._refusals.log("accord store dropped connection from %s: %s", peer, exc)
        except (OSError, ValueError) as exc:
            if not self._closed:
                log.debug("accord store connection from %s ended: %s", peer, exc)
        finally:
            sock.close()
            with self._lock:
                self._conns.pop(conn_id, None)

    def _respond(self, payload: bytes, peer: str) -> bytes:
        """The encoded answer to one authenticated request (an error answer when the request
        or its answer is unusable: nothing a key holder sends ends the connection)."""
        try:
            response = wire.encode(self._dispatch(payload, peer))
        except (TypeError, ValueError, struct.error) as exc:
            response = wire.encode([Status.ERROR, f"the answer cannot be encoded: {exc}"])
        if len(response) > self._max_frame:
            response = wire.encode([Status.ERROR, f"the answer ({len(response)} bytes) "
                                    f"exceeds the frame limit of {self._max_frame} bytes"])
        return response

    def _dispatch(self, payload: bytes, peer: str) -> list[Any]:
        # The frame is authenticated; a bad request from a key holder is a bug, answered with
        # an error rather than a dropped connection.
        try:
            request = wire.decode(payload)
            op, args = request[0], request[1:]
            handler = self._ops.get(op) if isinstance(op, int) else None
            if handler is None:
                return [Status.ERROR, f"unknown store operation {op!r}"]
            return handler(*args)
        except Exception as exc:  # noqa: BLE001 - no request, however malformed, ends the server
            log.warning("accord store got a malformed request from %s: %r", peer, exc)
            return [Status.ERROR, f"malformed request: {exc}"]

    # --- operations (each returns the response values) ----------------------------------------

    def _wait_for(self, keys: Sequence[str], timeout: Any) -> list[str]:
        """Block until every key exists; return those still missing at the deadline."""
        timeout = _timeout(timeout)
        deadline = None if timeout < 0 else time.monotonic() + timeout
        with self._cond:
            while True:
                missing = [k for k in keys if k not in self._data]
                if not missing or self._closed:
                    return missing
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return missing
                self._cond.wait(remaining)

    def _blocking_result(self, keys: Sequence[str], timeout: Any) -> list[Any] | None:
        missing = self._wait_for(keys, timeout)
        if not missing:
            return None
        if self._closed:
            return [Status.ERROR, "the store is shutting down"]
        return [Status.TIMEOUT, missing]

    def _set(self, key: str, value: bytes) -> list[Any]:
        with self._cond:
            self._data[_key(key)] = _value(value)
            self._cond.notify_all()
        return [Status.OK]

    def _get(self, key: str, timeout: float) -> list[Any]:
        failed = self._blocking_result([_key(key)], timeout)
        if failed:
            return failed
        with self._cond:
            return [Status.OK, self._data[key]]

    def _add(self, key: str, delta: int) -> list[Any]:
        if isinstance(delta, bool) or not isinstance(delta, int):
            raise TypeError(f"add takes an integer, got {type(delta).__name__}")
        with self._cond:
            current = self._data.get(_key(key), b"0")
            try:
                value = int(current) + delta
            except ValueError:
                return [Status.ERROR, f"key {key!r} holds {current[:32]!r}, not a counter"]
            if not _INT64[0] <= value <= _INT64[1]:  # counters are 64-bit, as torch's TCPStore
                return [Status.ERROR, f"adding {delta} to counter {key!r} ({int(current)}) "
                        "leaves the 64-bit range"]
            self._data[key] = str(value).encode()
            self._cond.notify_all()
        return [Status.OK, value]

    def _compare_set(self, key: str, expected: bytes, desired: bytes) -> list[Any]:
        # torch's TCPStore semantics: a missing key is created only when expected is empty.
        with self._cond:
            current = self._data.get(_key(key))
            if current is None:
                if _value(expected) == b"":
                    self._data[key] = _value(desired)
                    self._cond.notify_all()
                    return [Status.OK, desired]
                return [Status.OK, expected]
            if current == expected:
                self._data[key] = _value(desired)
                self._cond.notify_all()
            return [Status.OK, self._data[key]]

    def _wait(self, keys: list[str], timeout: float) -> list[Any]:
        return self._blocking_result([_key(k) for k in keys], timeout) or [Status.OK]

    def _check(self, keys: list[str]) -> list[Any]:
        with self._cond:
            return [Status.OK, all(_key(k) in self._data for k in keys)]

    def _delete(self, key: str) -> list[Any]:
        with self._cond:
            return [Status.OK, self._data.pop(_key(key), None) is not None]

    def _num_keys(self) -> list[Any]:
        with self._cond:
            return [Status.OK, len(self._data)]

    def _multi_get(self, keys: list[str], timeout: float) -> list[Any]:
        failed = self._blocking_result([_key(k) for k in keys], timeout)
        if failed:
            return failed
        with self._cond:
            return [Status.OK, [self._data[k] for k in keys]]

    def _multi_set(self, keys: list[str], values: list[bytes]) -> list[Any]:
        if len(keys) != len(values):
            raise ValueError(f"multi_set got {len(keys)} keys and {len(values)} values")
        with self._cond:
            for k, v in zip(keys, values):
                self._data[_key(k)] = _value(v)
            self._cond.notify_all()
        return [Status.OK]

    def _append(self, key: str, value: bytes) -> list[Any]:
        with self._cond:
            self._data[_key(key)] = self._data.get(key, b"") + _value(value)
            self._cond.notify_all()
        return [Status.OK]


def _timeout(value: Any) -> float:
    """A request's timeout in seconds: a finite number; negative waits forever."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"a timeout is a number of seconds, got {type(value).__name__}")
    if not math.isfinite(value):
        raise ValueError(f"a timeout must be a finite number of seconds, got {value!r} "
                         "(a negative one waits forever)")
    return -1.0 if value < 0 else min(float(value), threading.TIMEOUT_MAX / 2)


def _key(key: Any) -> str:
    if not isinstance(key, str):
        raise TypeError(f"store keys are strings, got {type(key).__name__}")
    return key


def _value(value: Any) -> bytes:
    if not isinstance(value, bytes):
        raise TypeError(f"store values are bytes, got {type(value).__name__}")
    return value
