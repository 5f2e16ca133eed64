"""The job's rendezvous store: an authenticated key-value server.

:class:`StoreServer` serves a :class:`~accord.store.table.KeyTable` (``str -> bytes`` pairs in
memory, and the operations on them) over :mod:`accord.store.wire` (every frame carries an
HMAC-SHA256 with the per-job secret, checked before anything is decoded). One daemon thread
accepts and runs every handshake (:mod:`accord.store.handshake`: bounded, no thread per
stranger); each connection that has sent an authentic first frame gets a thread of its own, so
a client blocked in ``get``/``wait`` holds up nobody else. This module is that serving: the
listener, the connections and their threads, and the answer to each request.

:class:`accord.store.connection.StoreConnection` is the client end (one socket, not
thread-safe); the launcher uses it directly, and :class:`accord.runtime.store_client.StoreClient`
pools them for torch.

Security: a connection whose hello or MAC is wrong is closed and logged (at a bounded rate) on
the ``accord.store`` logger; malformed or oversized frames close only that connection; every
authenticated request gets an answer, an error one when it is malformed. The server binds
loopback unless the caller asks for another address.
"""
from __future__ import annotations

import itertools
import logging
import socket
import struct
import threading
import time
from typing import Any, Sequence

from accord.errors import AuthenticationError, RendezvousError, with_hint
from accord.logs import Refusals
from accord.store import wire
from accord.store.handshake import HandshakePool
from accord.store.opcodes import Status
from accord.store.table import KeyTable

log = logging.getLogger("accord.store")

# Largest frame accepted before a connection has authenticated itself.
_FIRST_FRAME_LIMIT = 64 * 1024


class StoreServer:
    """An in-memory key-value store served to authenticated clients.

    Args:
        host: address to bind (loopback by default; "0.0.0.0" only for multi-host jobs).
        port: port to bind; 0 lets the OS pick a free one (read it from ``.port``).
        secret: the per-job secret every client must prove it holds.
        max_frame: largest frame accepted, in bytes; bigger ones close the connection.
        handshake_timeout: seconds a new connection has to send its first authenticated frame.
        max_connections: authenticated connections beyond this many are refused (and logged).
        max_pending: most connections waiting to authenticate at once, among those that have
            sent nothing yet and again among those that have (one more drops the oldest of its
            kind: :mod:`accord.store.handshake`); they never count against ``max_connections``.

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
        self._table = KeyTable()
        self._closed = False
        self._listener: socket.socket | None = None
        self._accept_thread: threading.Thread | None = None
        self._conns: dict[int, tuple[socket.socket, threading.Thread]] = {}
        self._conn_ids = itertools.count()
        self._lock = threading.Lock()  # guards _conns and _closed

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
    def pending_count(self) -> int:
        """How many connections are waiting to authenticate right now (bounded by twice
        ``max_pending``: :mod:`accord.store.handshake`)."""
        return self._pool.pending_count if self._pool is not None else 0

    @property
    def connection_count(self) -> int:
        """How many authenticated client connections are open right now."""
        with self._lock:
            return len(self._conns)

    def has_keys(self, keys: Sequence[str]) -> bool:
        """True when every key exists (in-process check for the server's owner)."""
        return self._table.has_keys(keys)

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
        # As long a queue of connections not yet accepted as the system allows (net.core.somaxconn
        # caps it): a flood fills it between two rounds of accepts, and a client whose connection
        # finds it full waits for its SYN to be sent again (1 s, then 3 s, ...).
        listener.listen(65535)
        if hasattr(socket, "TCP_DEFER_ACCEPT"):
            # Linux hands a connection to accept() only once it has sent something (a client
            # sends its hello at once): a flood of silent connections stays in the kernel,
            # costing the accepting thread nothing, for up to the handshake timeout.
            listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT,
                                max(1, int(round(self._handshake_timeout))))
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
        with self._lock:
            if self._closed:
                return
            self._closed = True
        # Stop accepting before waking the blocked get/wait: a client woken by this close (a
        # peer waiting for the server to go, to host the next one on this port) may connect
        # again at once, and must find nothing listening rather than this closing server.
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
        self._table.close()  # wake blocked get/wait so their threads can finish
        with self._lock:
            conns = list(self._conns.values())
        # The reading side first: a thread the table just woke still sends its answer
        # ("shutting down"), then finds the end of the requests and closes. Both sides of what
        # is left after a second: a thread stuck sending to a client that does not read.
        for how, wait in ((socket.SHUT_RD, 1.0), (socket.SHUT_RDWR, 5.0)):
            for sock, thread in conns:
                if thread.is_alive():
                    try:
                        sock.shutdown(how)
                    except OSError:
                        pass
            deadline = time.monotonic() + wait
            for _, thread in conns:
                thread.join(max(0.0, deadline - time.monotonic()))

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
            handler = self._table.handler(op)
            if handler is None:
                return [Status.ERROR, f"unknown store operation {op!r}"]
            return handler(*args)
        except Exception as exc:  # noqa: BLE001 - no request, however malformed, ends the server
            log.warning("accord store got a malformed request from %s: %r", peer, exc)
            return [Status.ERROR, f"malformed request: {exc}"]
