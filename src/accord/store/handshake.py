"""New connections to the store before they authenticate: all in one thread, bounded.

A stranger can hold neither a thread, nor much memory, nor a place that the job's clients need:

- the thread that accepts also runs every handshake (sockets under one selector, read and
  written without blocking), so a silent connection costs a file descriptor and a few bytes,
  never a thread; one that sends nothing at all does not even reach it (the server's listener
  has ``TCP_DEFER_ACCEPT``: the client must speak first, as accord's clients do);
- at most ``max_pending`` connections that have sent nothing yet wait at once, and at most
  ``max_pending`` that have (two tiers, apart from the job's authenticated connections); one
  more in a tier makes that tier's *oldest* connection go. A job's client sends its hello as
  soon as it is connected, and the pool reads what is waiting on the connections it holds
  before it accepts more, so a flood of connections that stay silent (the cheapest flood: no
  write) only ever pushes out its own; pushing out a client takes ``max_pending`` connections
  that send a hello each within the client's round trip (it then retries);
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
import os
import selectors
import socket
import struct
import time
from typing import Callable

from accord.errors import AuthenticationError
from accord.logs import Refusals
from accord.store import wire

log = logging.getLogger("accord.store")

# on_authenticated(channel, first payload, peer): the socket is in blocking mode
OnAuthenticated = Callable[[wire.Channel, bytes, str], None]

_HELLO, _LENGTH, _BODY = range(3)
# Connections accepted per turn before the ones already held are read again.
_ACCEPT_BATCH = 256


class _Pending:
    """One connection between accept and its first authenticated frame."""

    __slots__ = ("sock", "addr", "deadline", "stage", "need", "buf", "nonce", "channel", "header")

    def __init__(self, sock: socket.socket, addr: object, deadline: float, nonce: bytes) -> None:
        self.sock, self.addr, self.deadline, self.nonce = sock, addr, deadline, nonce
        self.stage, self.need, self.buf = _HELLO, wire.HELLO_SIZE, bytearray()
        self.channel: wire.Channel | None = None
        self.header = b""

    @property
    def peer(self) -> str:
        """``address:port`` of the other end, for logs."""
        addr = self.addr
        return f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) else str(addr)

    @property
    def silent(self) -> bool:
        """True while nothing has been read from it."""
        return self.stage == _HELLO and not self.buf


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
        # the two tiers, oldest first: nothing read yet, and something read
        self._silent: collections.OrderedDict[socket.socket, _Pending] = collections.OrderedDict()
        self._talking: collections.OrderedDict[socket.socket, _Pending] = collections.OrderedDict()
        self._selector = selectors.DefaultSelector()
        self._nonces = b""
        self._closed = False
        listener.setblocking(False)
        self._selector.register(listener, selectors.EVENT_READ)

    @property
    def pending_count(self) -> int:
        """Connections accepted that have not authenticated yet."""
        return len(self._silent) + len(self._talking)

    def _all_pending(self) -> list[_Pending]:
        return [*self._silent.values(), *self._talking.values()]

    def _find(self, sock: object) -> _Pending | None:
        return self._silent.get(sock) or self._talking.get(sock)  # type: ignore[call-overload]

    def close(self) -> None:
        """Make :meth:`run` return (from another thread); it closes what is pending."""
        self._closed = True

    def run(self) -> None:
        """Accept and handshake until :meth:`close` (or the listener is shut down)."""
        try:
            while not self._closed:
                now = time.monotonic()
                due = [p.deadline for p in self._talking.values()]
                if self._silent:
                    due.append(next(iter(self._silent.values())).deadline)
                wait = min(due, default=now + 0.2) - now
                ready = self._selector.select(max(0.0, min(wait, 0.2)))
                # what the connections held have sent first, then new ones: a client whose
                # hello has arrived moves to the talking tier before a flood can push it out
                accept = False
                for key, _ in ready:
                    if key.fileobj is self._listener:
                        accept = True
                    else:
                        pending = self._find(key.fileobj)
                        if pending is not None:
                            self._advance(pending)
                if accept and not self._accept():
                    return
                self._expire(time.monotonic())
        finally:
            # A reset, as for an eviction: a client in its handshake with a server that stops
            # (to be hosted again on the same port) connects again instead of failing
            for pending in self._all_pending():
                _reset_on_close(pending.sock)
                self._drop(pending)
            self._selector.close()

    # --- steps ---------------------------------------------------------------------------------

    def _nonce(self) -> bytes:
        """A fresh random nonce, cut from random bytes drawn in bulk (one system call for many
        connections: under a flood, every call the accepting thread saves lets it drain the
        kernel's queue sooner)."""
        if len(self._nonces) < wire.NONCE_SIZE:
            self._nonces = os.urandom(wire.NONCE_SIZE * 256)
        nonce, self._nonces = self._nonces[:wire.NONCE_SIZE], self._nonces[wire.NONCE_SIZE:]
        return nonce

    def _accept(self) -> bool:
        """Accept what is waiting (a bounded batch); False once the listener is closed.

        Each connection costs the fewest system calls that tell what it is: a look at what it
        sent (a flood's connection is often closed already, or silent), then the hello and a
        place in the selector; the socket stays in blocking mode (reads and writes pass
        ``MSG_DONTWAIT``) and gets ``TCP_NODELAY`` once it has authenticated.
        """
        for _ in range(_ACCEPT_BATCH):
            try:
                sock, addr = self._listener.accept()
            except BlockingIOError:
                return True
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self._evict_oldest(self._silent or self._talking, "out of file descriptors")  # never stop
                    return True
                if exc.errno in (errno.ECONNABORTED, errno.EPROTO, errno.EINTR):
                    continue
                return False  # the listener was shut down by close()
            try:
                first: bytes | None = sock.recv(wire.HELLO_SIZE, socket.MSG_DONTWAIT)
            except BlockingIOError:
                first = None  # silent so far
            except OSError:
                first = b""
            if first == b"":  # closed (or reset) before we looked: nothing to keep
                sock.close()
                continue
            nonce = self._nonce()
            try:
                if sock.send(wire.hello(nonce), socket.MSG_DONTWAIT) != wire.HELLO_SIZE:
                    raise OSError("could not send the hello")  # a fresh socket takes 20 bytes
            except OSError:
                sock.close()
                continue
            pending = _Pending(sock, addr, time.monotonic() + self._timeout, nonce)
            self._selector.register(sock, selectors.EVENT_READ)
            if first is None:
                self._silent[sock] = pending
                if len(self._silent) > self._max_pending:
                    self._evict_oldest(self._silent, f"{self._max_pending} silent connections were already waiting")
            else:  # a client sends its hello as soon as it is connected: usually there already
                self._silent[sock] = pending
                self._take(pending, first)
        return True

    def _advance(self, p: _Pending) -> None:
        try:
            data = p.sock.recv(p.need - len(p.buf), socket.MSG_DONTWAIT)
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
        self._take(p, data)

    def _take(self, p: _Pending, data: bytes) -> None:
        """``data`` arrived on ``p``: move it on (a stage completed, or refused)."""
        if p.silent:  # the first bytes: the connection leaves the silent tier
            self._silent.pop(p.sock, None)
            self._talking[p.sock] = p
            if len(self._talking) > self._max_pending:  # (not this one: it is the newest)
                self._evict_oldest(self._talking, f"{self._max_pending} talking connections were already waiting")
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
            with contextlib.suppress(OSError):
                p.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._on_authenticated(p.channel, payload, p.peer)

    def _expire(self, now: float) -> None:
        # the silent tier is in accept order, so its deadlines grow: only its head can be due
        # (the talking one is in the order they first spoke: all of it is looked at)
        due = [p for p in self._talking.values() if p.deadline <= now]
        for p in self._silent.values():
            if p.deadline > now:
                break
            due.append(p)
        for p in due:
            # A reset, as for an eviction: an honest client that a loaded machine kept from
            # answering in time connects again within its own deadline (a wrong secret, by
            # contrast, gets an orderly close and fails at once)
            _reset_on_close(p.sock)
            self._refuse(p, "accord store dropped connection from %s: no authenticated request "
                            "within %.1fs", p.peer, self._timeout)

    def _evict_oldest(self, tier: collections.OrderedDict[socket.socket, _Pending], why: str) -> None:
        if tier:
            oldest = next(iter(tier.values()))
            # A reset, not an orderly close: the client tells "make room, try again" (a reset
            # during its first round trip) from a refusal of its secret (the connection ends).
            _reset_on_close(oldest.sock)
            self._refuse(oldest, "accord store dropped the oldest unauthenticated connection, from "
                                 "%s: %s", oldest.peer, why)

    def _refuse(self, p: _Pending, message: str, *args: object) -> None:
        self._refusals.log(message, *args)
        self._drop(p)

    def _forget(self, p: _Pending) -> None:
        if self._silent.pop(p.sock, None) is not None or self._talking.pop(p.sock, None) is not None:
            self._selector.unregister(p.sock)

    def _drop(self, p: _Pending) -> None:
        self._forget(p)
        p.sock.close()


def _reset_on_close(sock: socket.socket) -> None:
    """Make closing ``sock`` send a reset (SO_LINGER 0), which a client reads as "try again"."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
