"""New connections to the store before they authenticate: all in one thread, bounded.

A stranger can hold neither a thread, nor much memory, nor a place that the job's clients need:

- the thread that accepts also runs every handshake (non-blocking sockets under one selector),
  so a silent connection costs a file descriptor and a few bytes, never a thread;
- at most ``max_pending`` connections are unauthenticated at once, apart from the job's
  authenticated ones; one more makes the *oldest* pending connection go. A real client
  authenticates within one round trip, so only ``max_pending`` new connections arriving during
  that round trip could push it out (it then retries);
- each has ``timeout`` seconds for its hello and first frame, and that frame may announce at
  most ``first_frame_limit`` bytes (checked before they are read);
- refusals are logged at a bounded rate (:class:`accord.logs.Refusals`).

Only a connection whose first frame carries a valid MAC reaches ``on_authenticated``.
"""
from __future__ import annotations

import collections
import contextlib
import errno
import logging
import selectors
import socket
import struct
import time
from typing import Callable

from accord.errors import AuthenticationError
from accord.logs import Refusals
from accord.store import wire

log = logging.getLogger("accord.store")

# on_authenticated(channel, first payload, peer): the socket is blocking again by then
OnAuthenticated = Callable[[wire.Channel, bytes, str], None]

_HELLO, _LENGTH, _BODY = range(3)


class _Pending:
    """One connection between accept and its first authenticated frame."""

    __slots__ = ("sock", "peer", "deadline", "stage", "need", "buf", "nonce", "channel", "header")

    def __init__(self, sock: socket.socket, peer: str, deadline: float, nonce: bytes) -> None:
        self.sock, self.peer, self.deadline, self.nonce = sock, peer, deadline, nonce
        self.stage, self.need, self.buf = _HELLO, wire.HELLO_SIZE, bytearray()
        self.channel: wire.Channel | None = None
        self.header = b""


class HandshakePool:
    """Accepts on ``listener`` and authenticates new connections (see the module docstring).

    Args:
        listener: a bound, listening socket (made non-blocking here).
        secret: the job secret.
        timeout: seconds a connection has for its hello and first frame.
        max_pending: most connections waiting to authenticate at once.
        first_frame_limit: largest first frame, in bytes.
        on_authenticated: takes each connection whose first frame is authentic.
        refusals: counts and logs refused connections.
    """

    def __init__(self, listener: socket.socket, secret: bytes, *, timeout: float, max_pending: int,
                 first_frame_limit: int, on_authenticated: OnAuthenticated, refusals: Refusals) -> None:
        self._listener = listener
        self._secret = secret
        self._timeout = timeout
        self._max_pending = max(1, max_pending)
        self._limit = first_frame_limit
        self._on_authenticated = on_authenticated
        self._refusals = refusals
        self._pending: collections.OrderedDict[socket.socket, _Pending] = collections.OrderedDict()
        self._selector = selectors.DefaultSelector()
        self._closed = False
        listener.setblocking(False)
        self._selector.register(listener, selectors.EVENT_READ)

    @property
    def pending_count(self) -> int:
        """Connections accepted that have not authenticated yet."""
        return len(self._pending)

    def close(self) -> None:
        """Make :meth:`run` return (from another thread); it closes what is pending."""
        self._closed = True

    def run(self) -> None:
        """Accept and handshake until :meth:`close` (or the listener is shut down)."""
        try:
            while not self._closed:
                now = time.monotonic()
                wait = min([p.deadline for p in self._pending.values()], default=now + 0.2) - now
                for key, _ in self._selector.select(max(0.0, min(wait, 0.2))):
                    if key.fileobj is self._listener:
                        if not self._accept():
                            return
                    elif key.fileobj in self._pending:
                        self._advance(self._pending[key.fileobj])
                self._expire(time.monotonic())
        finally:
            for pending in list(self._pending.values()):
                self._drop(pending)
            self._selector.close()

    # --- steps ---------------------------------------------------------------------------------

    def _accept(self) -> bool:
        """Accept what is waiting; False once the listener is closed."""
        for _ in range(64):
            try:
                sock, addr = self._listener.accept()
            except BlockingIOError:
                return True
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self._evict_oldest("out of file descriptors")  # make room; never stop
                    return True
                if exc.errno in (errno.ECONNABORTED, errno.EPROTO, errno.EINTR):
                    continue
                return False  # the listener was shut down by close()
            peer = f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) else str(addr)
            if len(self._pending) >= self._max_pending:
                self._evict_oldest(f"{self._max_pending} connections were already waiting")
            try:
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                nonce = wire.new_nonce()
                if sock.send(wire.hello(nonce)) != wire.HELLO_SIZE:  # a fresh socket takes 20 bytes
                    raise OSError("could not send the hello")
            except OSError:
                sock.close()
                continue
            pending = _Pending(sock, peer, time.monotonic() + self._timeout, nonce)
            self._pending[sock] = pending
            self._selector.register(sock, selectors.EVENT_READ)
        return True

    def _advance(self, p: _Pending) -> None:
        try:
            data = p.sock.recv(p.need - len(p.buf))
        except BlockingIOError:
            return
        except OSError as exc:
            log.debug("accord store: connection from %s ended before authenticating: %s", p.peer, exc)
            self._drop(p)
            return
        if not data:
            log.debug("accord store: connection from %s closed before authenticating", p.peer)
            self._drop(p)
            return
        p.buf += data
        if len(p.buf) < p.need:
            return
        try:
            self._complete_stage(p, bytes(p.buf))
        except (wire.FrameError, AuthenticationError) as exc:
            what = "refused" if isinstance(exc, AuthenticationError) else "dropped"
            self._refuse(p, f"accord store {what} connection from %s: %s", p.peer, exc)

    def _complete_stage(self, p: _Pending, data: bytes) -> None:
        p.buf = bytearray()
        if p.stage == _HELLO:
            if data[: len(wire.MAGIC)] != wire.MAGIC:
                raise wire.FrameError(f"peer is not speaking accord's wire protocol (got {data[:4]!r})")
            p.channel = wire.Channel(p.sock, self._secret, data[len(wire.MAGIC):], p.nonce,
                                     is_server=True, max_frame=self._limit)
            p.stage, p.need = _LENGTH, 4
        elif p.stage == _LENGTH:
            assert p.channel is not None
            p.header, p.need, p.stage = data, p.channel.body_size(data), _BODY
        else:
            assert p.channel is not None
            payload = p.channel.open_frame(p.header, data)  # the MAC, before anything is decoded
            self._forget(p)
            p.sock.setblocking(True)
            self._on_authenticated(p.channel, payload, p.peer)

    def _expire(self, now: float) -> None:
        for p in [p for p in self._pending.values() if p.deadline <= now]:
            self._refuse(p, "accord store dropped connection from %s: no authenticated request "
                            "within %.1fs", p.peer, self._timeout)

    def _evict_oldest(self, why: str) -> None:
        if self._pending:
            oldest = next(iter(self._pending.values()))
            # A reset, not an orderly close: the client tells "make room, try again" (a reset
            # during its first round trip) from a refusal of its secret (the connection ends).
            with contextlib.suppress(OSError):
                oldest.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self._refuse(oldest, "accord store dropped the oldest unauthenticated connection, from "
                                 "%s: %s", oldest.peer, why)

    def _refuse(self, p: _Pending, message: str, *args: object) -> None:
        self._refusals.log(message, *args)
        self._drop(p)

    def _forget(self, p: _Pending) -> None:
        if self._pending.pop(p.sock, None) is not None:
            self._selector.unregister(p.sock)

    def _drop(self, p: _Pending) -> None:
        self._forget(p)
        p.sock.close()
