"""The network side of one parameter server: its listeners, its workers' connections, and the
checks every message passes before the core sees it.

:class:`ParameterServer` listens on a free TCP port (and a Unix socket on request), admits a
connection only once it has proven that it holds the job secret
(:mod:`accord.kvstore.server.admission`, :mod:`accord.kvstore.transport`), checks every
message's counts, MACs, addressee and sequence number before the core sees it, answers every
refusal (so that a worker fails at once, with the reason), and seals the answers. One thread
serves everything through one selector; no connection, message or slow reader can make it wait.
What the server stores and computes is :class:`~accord.kvstore.server.core.ServerCore`'s; the
process around it (environment, registration, signals) is :mod:`accord.kvstore.server`'s.
Torch-free.
"""
from __future__ import annotations

import logging
import os
import selectors
import shutil
import socket
import tempfile
import time
from typing import Any, Callable

from accord.errors import AuthenticationError
from accord.kvstore import protocol, transport
from accord.kvstore.directory import Advertised, new_token
from accord.kvstore.server.admission import Admission, descriptor_budget
from accord.kvstore.server.core import ServerCore
from accord.kvstore.server.state import Buf
from accord.logs import Refusals

__all__ = ["ParameterServer"]

log = logging.getLogger("accord.kvstore")

_COPY_LIMIT = 64 * 1024  # smaller answers are copied into one buffer: nothing to track
_UNIX_PATH_MAX = 107  # sun_path on Linux, less its terminating NUL
_LISTENER = object()  # selector data of the listening sockets
_LINGER_S = 2.0  # how long a refused connection is read (and discarded) so that the refusal arrives
_MAX_LINGERING = 64


class _Lingering:
    """A refused connection, closed for writing: read until the peer closes (or for a short
    while) so that closing does not reset the connection before the refusal is read."""

    __slots__ = ("sock", "deadline")

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock, self.deadline = sock, deadline


class _Conn:
    """One authenticated connection: its reader, its queue of answers, and how it is labelled."""

    __slots__ = ("sock", "peer", "inbox", "outbox", "events", "closed")

    def __init__(self, sock: socket.socket, peer: str, inbox: transport.Inbox) -> None:
        self.sock, self.peer, self.inbox = sock, peer, inbox
        self.outbox = transport.Outbox()
        self.events = selectors.EVENT_READ
        self.closed = False

    def __repr__(self) -> str:
        return f"<connection from {self.peer}>"


class ParameterServer:
    """One server: listeners and connections in front of a :class:`ServerCore`.

    Args:
        secret: the job secret. num_workers: workers in the job. server_id: this server's index.
        verbose: PS_VERBOSE level: 1 logs connections, 2 also every message.
        payload_mac: authenticate array bytes too (ACCORD_KVSTORE_PAYLOAD_MAC; see protocol).
        max_frame: the largest payload accepted (:func:`protocol.frame_limit`), checked on the
            announced length before anything is allocated for it.
        handshake_timeout: seconds a new connection has to prove that it holds the secret.
        max_pending: most connections waiting for their proof at once (default: 128, fewer
            when the open-file limit is low); one more drops the oldest.
        max_connections: most authenticated connections (default: what the open-file limit
            leaves); one more is refused with a message that says so.
        message_timeout: seconds an unfinished message may go without a byte before its
            connection is closed (and the memory it holds freed).
    """

    def __init__(self, secret: bytes, num_workers: int, server_id: int = 0, verbose: int = 0,
                 payload_mac: bool = True, max_frame: int = protocol.frame_limit(),
                 handshake_timeout: float = 5.0, max_pending: int | None = None,
                 max_connections: int | None = None, message_timeout: float = 60.0) -> None:
        self._secret = secret
        self._payload_mac = payload_mac
        self.server_id = server_id
        self.verbose = int(verbose)
        self.token = new_token()  # names this server process in every header (no cross-server replay)
        self.max_frame = int(max_frame)
        self.handshake_timeout = float(handshake_timeout)
        self.message_timeout = float(message_timeout)
        budget = descriptor_budget()
        pending = max_pending if max_pending is not None else min(128, max(4, budget // 8))
        self.max_connections = max_connections if max_connections is not None else max(8, budget - pending)
        self._sel = selectors.DefaultSelector()
        self._refused = Refusals(log)
        self._dropped = Refusals(log)
        self._admission = Admission(secret, self.token, self._sel, timeout=handshake_timeout,
                                    max_pending=pending, refusals=self._refused, admitted=self._admit,
                                    server_id=server_id)
        self._listeners: list[socket.socket] = []
        self._conns: dict[socket.socket, _Conn] = {}
        self._lingering: dict[socket.socket, _Lingering] = {}
        self.core = ServerCore(num_workers, server_id, self._send, payload_mac)
        self._seen: dict[str, int] = {}
        self._stop_requested = False
        self.endpoint = ""
        self._ipc_dir: str | None = None

    # --- what tests and logs look at -----------------------------------------------------------

    @property
    def max_pending(self) -> int:
        """Most connections that may wait for their proof at once."""
        return self._admission.max_pending

    @property
    def pending_count(self) -> int:
        """Connections waiting for their proof now."""
        return self._admission.count

    @property
    def connection_count(self) -> int:
        """Authenticated connections open now."""
        return len(self._conns)

    @property
    def refusal_count(self) -> int:
        """Connections and messages refused so far."""
        return self._refused.count

    # --- lifecycle -----------------------------------------------------------------------------

    def bind(self, host: str = "127.0.0.1", advertise: str | None = None, ipc: bool = False,
             ipc_parent: str | None = None) -> str:
        """Listen on a free port of ``host``; return what workers connect to (see
        :mod:`accord.kvstore.directory`: endpoints, this server's token, its frame limit).

        With ``ipc``, also listen on a Unix socket in a fresh private (0700) directory (inside
        ``ipc_parent`` when given: accordrun passes the job's directory, which it and its
        guardian remove even when this server is killed): workers on this host take the Unix
        socket (less CPU than TCP loopback for large arrays), others the TCP endpoint. The
        handshake and the MACs protect both; the directory keeps other users off the socket.

        Raises:
            OSError: ``host`` cannot be bound.
        """
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        tcp = socket.socket(family, socket.SOCK_STREAM)
        try:
            tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            tcp.bind((host, 0))
            tcp.listen(1024)
        except OSError:
            tcp.close()
            raise
        self._listen(tcp)
        port = tcp.getsockname()[1]
        ipc_endpoint = None
        if ipc and hasattr(socket, "AF_UNIX"):
            self._ipc_dir = tempfile.mkdtemp(prefix="accord-kv-", dir=ipc_parent)
            path = os.path.join(self._ipc_dir, "server.sock")
            if len(os.fsencode(path)) <= _UNIX_PATH_MAX:
                unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                unix.bind(path)
                unix.listen(1024)
                self._listen(unix)
                ipc_endpoint = f"ipc://{path}"
        shown = f"[{advertise or host}]" if ":" in (advertise or host) else (advertise or host)
        self.endpoint = Advertised(f"tcp://{shown}:{port}", ipc_endpoint, self.token, self.max_frame).text()
        return self.endpoint

    def _listen(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self._listeners.append(sock)
        self._sel.register(sock, selectors.EVENT_READ, _LISTENER)

    def request_stop(self) -> None:
        """Make :meth:`serve` return soon (safe from a signal handler)."""
        self._stop_requested = True

    def serve(self, heartbeat: Callable[[], None] | None = None, interval: float = 2.0) -> None:
        """Handle requests until stopped; ``heartbeat()`` runs every ``interval`` seconds and may
        raise to stop the server (the job's store is gone)."""
        next_beat = time.monotonic() + interval
        next_sweep = time.monotonic() + 0.5
        try:
            while not self._stop_requested and not self.core.stopped:
                now = time.monotonic()
                wait = 0.2
                deadline = self._admission.next_deadline()
                if deadline is not None:
                    wait = min(wait, max(0.0, deadline - now))
                try:
                    events = self._sel.select(wait)
                except InterruptedError:  # a signal
                    continue
                for key, mask in events:
                    what = key.data
                    if what is _LISTENER:
                        self._admission.accept(key.fileobj)  # type: ignore[arg-type]
                    elif isinstance(what, _Conn):
                        self._serve_connection(what, mask)
                    elif isinstance(what, _Lingering):
                        self._discard(what)
                    else:
                        self._admission.readable(what)
                    if self.core.stopped:
                        break
                now = time.monotonic()
                self._admission.expire(now)
                if now >= next_sweep:
                    self._drop_stalled(now)
                    for lingering in [w for w in self._lingering.values() if w.deadline <= now]:
                        self._end_linger(lingering)
                    next_sweep = now + 0.5
                if heartbeat is not None and now >= next_beat:
                    heartbeat()
                    next_beat = time.monotonic() + interval
        finally:
            self._drain(time.monotonic() + 1.0)  # a stop's answer, say

    def close(self) -> None:
        """Close every connection and listener (idempotent)."""
        for conn in list(self._conns.values()):
            self._close(conn)
        for lingering in list(self._lingering.values()):
            self._end_linger(lingering)
        self._admission.close()
        for sock in self._listeners:
            sock.close()
        self._listeners = []
        self._sel.close()
        if self._ipc_dir is not None:
            shutil.rmtree(self._ipc_dir, ignore_errors=True)
            self._ipc_dir = None

    # --- connections ---------------------------------------------------------------------------

    def _admit(self, sock: socket.socket, peer: str, proof: bytes) -> None:
        """A connection proved that it holds the secret: answer with our proof, then serve it."""
        if len(self._conns) >= self.max_connections:
            self._refused.log("server %d refused a connection from %s: already %d open",
                              self.server_id, peer, len(self._conns))
            try:
                sock.send(transport.REFUSED_BUSY)
            except OSError:
                pass
            sock.close()
            return

        def check_head(tags: bytes, header: bytes, lengths: list) -> protocol.Head:
            return protocol.check_head(self._secret, protocol.TO_SERVER, tags, header, lengths,
                                       self._payload_mac)

        conn = _Conn(sock, peer, transport.Inbox(check_head, self.max_frame))
        self._conns[sock] = conn
        self._sel.register(sock, selectors.EVENT_READ, conn)
        conn.outbox.add_raw(proof)
        self._flush(conn)
        if self.verbose:
            log.info("server %d accepted a connection (from %s)", self.server_id, peer)

    def _serve_connection(self, conn: _Conn, mask: int) -> None:
        if mask & selectors.EVENT_WRITE:
            self._flush(conn)
        if not mask & selectors.EVENT_READ or conn.closed:
            return
        for _ in range(64):  # fairness: back to the selector now and then
            try:
                messages = conn.inbox.receive_once(conn.sock)
            except (BlockingIOError, InterruptedError):
                return
            except transport.Closed:
                self._close(conn, "lost a connection")
                return
            except transport.Refused as exc:
                self._close(conn, f"lost a connection (the peer refused: {exc.reason[:200]})")
                return
            except AuthenticationError as exc:
                self._refuse(conn, "mac", f"a message with a wrong MAC ({str(exc).splitlines()[0]}): "
                                          "a process without the job secret wrote into this "
                                          "connection, or the sender has another ACCORD_KVSTORE_PAYLOAD_MAC")
                return
            except protocol.ProtocolError as exc:  # a count over a limit, before it was buffered
                self._refuse(conn, "limit", str(exc))
                return
            except OSError as exc:
                self._close(conn, f"lost a connection ({exc})")
                return
            for head, payloads in messages:
                self._handle(conn, head, payloads)
                if conn.closed or self.core.stopped:
                    return

    def _refuse(self, conn: _Conn, kind: str, why: str) -> None:
        """Tell the peer why, then close: it fails at once instead of waiting for an answer."""
        self._refused.log("server %d refused the connection from %s: %s", self.server_id, conn.peer, why)
        conn.outbox.add_raw(transport.refusal_bytes(kind, why))
        self._flush(conn)
        linger = not conn.outbox and not conn.closed
        sock = conn.sock
        self._close(conn, keep_socket=linger)
        if linger:
            try:
                sock.shutdown(socket.SHUT_WR)
            except OSError:
                sock.close()
                return
            if len(self._lingering) >= _MAX_LINGERING:
                self._end_linger(next(iter(self._lingering.values())))
            lingering = _Lingering(sock, time.monotonic() + _LINGER_S)
            self._lingering[sock] = lingering
            self._sel.register(sock, selectors.EVENT_READ, lingering)

    def _discard(self, lingering: _Lingering) -> None:
        try:
            if lingering.sock.recv(1 << 16):
                return
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            pass
        self._end_linger(lingering)

    def _end_linger(self, lingering: _Lingering) -> None:
        if self._lingering.pop(lingering.sock, None) is not None:
            self._sel.unregister(lingering.sock)
            lingering.sock.close()

    def _handle(self, conn: _Conn, head: protocol.Head, payloads: list) -> None:
        try:
            header, payloads = protocol.open_body(self._secret, protocol.TO_SERVER, head, payloads,
                                                  self._payload_mac)
        except AuthenticationError:
            self._refuse(conn, "mac", "a message whose payload bytes do not match their MAC")
            return
        except protocol.ProtocolError as exc:
            # Authentic but unreadable: a worker of another version, say. The answer names no
            # request; the worker fails its requests pending on this server with it.
            self._dropped.log("server %d refused a malformed message from %s: %s", self.server_id,
                              conn.peer, exc)
            self.core.error(conn, {}, f"a malformed message: {exc}")
            return
        if header.get("to") != self.token:
            self._dropped.log("server %d refused a message addressed to another server (to %.40r): "
                              "a recorded message replayed here", self.server_id, header.get("to"))
            return
        sid, seq = str(header.get("sid")), header.get("seq")
        last = self._seen.get(sid)
        if not isinstance(seq, int) or (last is not None and seq <= last):
            self._dropped.log("server %d dropped a replayed or unnumbered message (session %.40s, "
                              "seq %.40r)", self.server_id, sid, seq)
            return
        if last is None and self.verbose:
            log.info("server %d: worker rank %s connected (session %s)", self.server_id,
                     header.get("rank"), sid)
        self._seen[sid] = seq
        if self.verbose >= 2:  # ps-lite's PS_VERBOSE=2: every message
            log.info("server %d: %s %s from rank %s (seq %s, %d payload bytes)", self.server_id,
                     header.get("op"), header.get("key", "-"), header.get("rank"), seq,
                     sum(memoryview(p).nbytes for p in payloads))
        self.core.handle(conn, header, payloads)

    def _send(self, peer: Any, request: dict, fields: dict, payloads: list, digests: Any,
              buf: Buf | None) -> None:
        conn: _Conn = peer
        if conn.closed:
            return
        answer = {"sid": request.get("sid"), "seq": request.get("seq"), "from": self.token, **fields}
        frames = protocol.seal(self._secret, protocol.TO_WORKER, answer, payloads, digests or None,
                               self._payload_mac)
        # Zero-copy only from a Buf, which hands its pending answers a copy before it changes;
        # other arrays (optimizer states, say) may change under an answer still queued.
        big = buf is not None and any(memoryview(p).nbytes > _COPY_LIMIT for p in payloads)
        tracker = conn.outbox.add(frames, track=big, copy=not big)
        if tracker is not None and buf is not None:
            buf.sent(tracker)
        self._flush(conn)

    def _flush(self, conn: _Conn) -> None:
        try:
            done = conn.outbox.flush(conn.sock)
        except OSError as exc:
            self._close(conn, f"lost a connection ({exc})")
            return
        events = selectors.EVENT_READ if done else selectors.EVENT_READ | selectors.EVENT_WRITE
        if events != conn.events and not conn.closed:
            conn.events = events
            self._sel.modify(conn.sock, events, conn)

    def _drop_stalled(self, now: float) -> None:
        for conn in list(self._conns.values()):
            inbox = conn.inbox
            if inbox.mid_message and now - inbox.last_read > self.message_timeout:
                self._refused.log("server %d closed the connection from %s: its message stalled "
                                  "for %.0fs, holding %d bytes", self.server_id, conn.peer,
                                  now - inbox.last_read, inbox.held_bytes)
                self._close(conn)

    def _close(self, conn: _Conn, why: str = "", keep_socket: bool = False) -> None:
        if conn.closed:
            return
        conn.closed = True
        conn.outbox.drop()
        self._conns.pop(conn.sock, None)
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        if not keep_socket:
            conn.sock.close()
        if why and self.verbose:
            log.info("server %d %s (from %s)", self.server_id, why, conn.peer)

    def _drain(self, deadline: float) -> None:
        """Write what is queued (best effort, until ``deadline``)."""
        while time.monotonic() < deadline:
            busy = [c for c in self._conns.values() if c.outbox]
            if not busy:
                return
            for conn in busy:
                self._flush(conn)
            time.sleep(0.005)
