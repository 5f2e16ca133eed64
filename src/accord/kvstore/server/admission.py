"""A parameter server's connections between accept and proof (:mod:`accord.kvstore.transport`):
bounded in number, bytes, time and file descriptors, whoever opens them.

- a connection gets the server's 24-byte hello and has ``timeout`` seconds to send its 56-byte
  opening (hello and proof); the server reads nothing more from it before the proof is checked,
  so a stranger's connection holds 56 bytes of buffer, a descriptor, and no thread;
- at most ``max_pending`` connections wait at once; one more makes the *oldest* go (a reset),
  so a flood cannot keep the job's workers out: a worker proves itself within one round trip,
  and one pushed out during it (only ``max_pending`` new connections arriving in that round trip
  can) connects again;
- a wrong proof is answered with a refusal (the worker then fails at once, naming it) and the
  connection closed; refusals are logged at a bounded rate (:class:`accord.logs.Refusals`);
- the descriptors of waiting connections never exhaust the process's: the server sizes
  ``max_pending`` from its open-file limit (:func:`descriptor_budget`), and when accept fails for
  want of descriptors anyway (another part of the process used them) the oldest waiting
  connection goes and the new one is accepted and closed at once through a spare descriptor, so
  that nothing spins on a listener it cannot drain and nothing aborts.

Only a connection whose proof is right reaches ``admitted``. Torch-free.
"""
from __future__ import annotations

import collections
import contextlib
import errno
import hmac
import logging
import os
import selectors
import socket
import struct
import time
from typing import Callable

from accord.kvstore import transport
from accord.logs import Refusals

log = logging.getLogger("accord.kvstore")

# admitted(socket, peer, the server's proof to send first)
Admitted = Callable[[socket.socket, str, bytes], None]

_OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


def descriptor_budget(reserve: int = 64) -> int:
    """File descriptors this process can still open for connections: its soft limit, less those
    open now, less ``reserve`` for everything else (the job's store, logs, imports)."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        soft = 1 << 20 if soft == resource.RLIM_INFINITY else soft
    except (ImportError, OSError, ValueError):
        soft = 1024
    try:
        open_now = len(os.listdir("/proc/self/fd"))
    except OSError:
        open_now = 64
    return max(16, soft - open_now - reserve)


class _Pending:
    """One connection between accept and its proof."""

    __slots__ = ("sock", "peer", "deadline", "nonce", "buf")

    def __init__(self, sock: socket.socket, peer: str, deadline: float, nonce: bytes) -> None:
        self.sock, self.peer, self.deadline, self.nonce = sock, peer, deadline, nonce
        self.buf = b""


class Admission:
    """The waiting connections of one server (see the module docstring).

    Args:
        secret: the job secret. token: this server's token (in both proofs).
        selector: the server's selector; waiting sockets are registered with their _Pending.
        timeout: seconds a connection has to send its opening.
        max_pending: most connections waiting at once.
        refusals: counts and logs refused connections.
        admitted: takes each connection whose proof is right.
    """

    def __init__(self, secret: bytes, token: str, selector: selectors.BaseSelector, *, timeout: float,
                 max_pending: int, refusals: Refusals, admitted: Admitted, server_id: int = 0) -> None:
        self._secret, self._token, self._sel = secret, token, selector
        self.timeout = float(timeout)
        self.max_pending = max(1, int(max_pending))
        self._refusals = refusals
        self._admitted = admitted
        self._server_id = server_id
        self._pending: collections.OrderedDict[socket.socket, _Pending] = collections.OrderedDict()
        self._spare: int | None = _open_spare()
        self.most_waiting = 0  # the most connections that waited at once (for tests and logs)
        self.evicted = 0

    @property
    def count(self) -> int:
        """Connections waiting for their proof now."""
        return len(self._pending)

    def next_deadline(self) -> float | None:
        """When the oldest waiting connection runs out of time (None: none waits)."""
        return next(iter(self._pending.values())).deadline if self._pending else None

    # --- accepting ---------------------------------------------------------------------------

    def accept(self, listener: socket.socket) -> None:
        """Accept what waits on ``listener`` (at most 64 at a time, for fairness)."""
        for _ in range(64):
            try:
                sock, addr = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in _OUT_OF_DESCRIPTORS:
                    self._shed(listener)
                    return
                if exc.errno in (errno.ECONNABORTED, errno.EPROTO):
                    continue
                return  # the listener was closed
            peer = f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) and len(addr) >= 2 else "a Unix socket"
            if len(self._pending) >= self.max_pending:
                self._evict_oldest(f"{self.max_pending} connections were already waiting for their proof")
            nonce = os.urandom(transport.NONCE_BYTES)
            try:
                sock.setblocking(False)
                if sock.family in (socket.AF_INET, socket.AF_INET6):
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if sock.send(transport.hello_bytes(nonce)) != transport.HELLO_BYTES:
                    raise OSError("could not send the hello")  # a fresh socket takes 24 bytes
            except OSError:
                sock.close()
                continue
            pending = _Pending(sock, peer, time.monotonic() + self.timeout, nonce)
            self._pending[sock] = pending
            self._sel.register(sock, selectors.EVENT_READ, pending)
            self.most_waiting = max(self.most_waiting, len(self._pending))

    def _shed(self, listener: socket.socket) -> None:
        """Out of descriptors: make room, and take the connection that waits off the listener
        (accepted and closed at once through the spare descriptor) so that it does not stay
        readable forever."""
        self._evict_oldest("the server is out of file descriptors")
        if self._spare is not None:
            os.close(self._spare)
            self._spare = None
        with contextlib.suppress(OSError):
            sock, _ = listener.accept()
            sock.close()
            self._refusals.log("server %d refused a connection: out of file descriptors", self._server_id)
        self._spare = _open_spare()

    # --- the opening -------------------------------------------------------------------------

    def readable(self, p: _Pending) -> None:
        """Read the opening of ``p`` (never more than its 56 bytes); check it when complete."""
        try:
            data = p.sock.recv(transport.OPENING_BYTES - len(p.buf))
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            log.debug("server %d: a connection from %s ended before its proof: %s", self._server_id, p.peer, exc)
            self._drop(p)
            return
        if not data:
            log.debug("server %d: a connection from %s closed before its proof", self._server_id, p.peer)
            self._drop(p)
            return
        p.buf += data
        seen = min(len(p.buf), len(transport.MAGIC))
        if p.buf[:seen] != transport.MAGIC[:seen]:
            self._refuse(p, "server %d dropped a connection from %s: it does not speak accord's "
                            "parameter-server protocol (it sent %r)", self._server_id, p.peer, p.buf[:8])
            return
        if len(p.buf) < transport.OPENING_BYTES:
            return
        worker_nonce = p.buf[len(transport.MAGIC):transport.HELLO_BYTES]
        proof = p.buf[transport.HELLO_BYTES:]
        self._forget(p)
        expected = transport.worker_proof(self._secret, self._token, p.nonce, worker_nonce)
        if not hmac.compare_digest(proof, expected):
            self._refusals.log("server %d refused a connection from %s: it does not hold the job "
                               "secret", self._server_id, p.peer)
            with contextlib.suppress(OSError):
                p.sock.send(transport.REFUSED_SECRET)
            p.sock.close()
            return
        self._admitted(p.sock, p.peer, transport.server_proof(self._secret, self._token, p.nonce, worker_nonce))

    def expire(self, now: float) -> None:
        """Drop the connections whose time for the opening is up."""
        while self._pending:
            oldest = next(iter(self._pending.values()))
            if oldest.deadline > now:
                return
            self._refuse(oldest, "server %d dropped a connection from %s: no proof within %.1fs",
                         self._server_id, oldest.peer, self.timeout)

    def _evict_oldest(self, why: str) -> None:
        if self._pending:
            oldest = next(iter(self._pending.values()))
            # A reset: a worker pushed out during its handshake tells it from a refusal and retries.
            with contextlib.suppress(OSError):
                oldest.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.evicted += 1
            self._refuse(oldest, "server %d dropped the oldest connection waiting for its proof, from "
                                 "%s: %s", self._server_id, oldest.peer, why)

    def _refuse(self, p: _Pending, message: str, *args: object) -> None:
        self._refusals.log(message, *args)
        self._drop(p)

    def _forget(self, p: _Pending) -> None:
        if self._pending.pop(p.sock, None) is not None:
            self._sel.unregister(p.sock)

    def _drop(self, p: _Pending) -> None:
        self._forget(p)
        p.sock.close()

    def close(self) -> None:
        """Close every waiting connection and the spare descriptor."""
        for p in list(self._pending.values()):
            self._drop(p)
        if self._spare is not None:
            os.close(self._spare)
            self._spare = None


def _open_spare() -> int | None:
    try:
        return os.open(os.devnull, os.O_RDONLY)
    except OSError:
        return None
