"""The network side of one parameter server: a ZeroMQ ROUTER socket in front of a ServerCore.

:class:`ParameterServer` binds a free TCP port (and a Unix socket on request), admits only
peers that pass ZeroMQ's PLAIN handshake with the job's connect password (it answers ZeroMQ's
authentication requests in its own loop), checks every message's MAC, addressee and sequence
number before the core sees it, and seals the answers. What the server stores and computes is
:class:`~accord.kvstore.server.core.ServerCore`'s; the process around it (environment,
registration, signals) is :mod:`accord.kvstore.server`'s. Torch-free.
"""
from __future__ import annotations

import hmac
import logging
import os
import shutil
import tempfile
import time
from typing import Any, Callable, Sequence

import zmq

from accord.errors import AuthenticationError
from accord.kvstore import protocol
from accord.kvstore.directory import Advertised, new_token
from accord.kvstore.server.core import ServerCore
from accord.kvstore.server.state import Buf
from accord.logs import Refusals

__all__ = ["ParameterServer"]

log = logging.getLogger("accord.kvstore")

_COPY_LIMIT = 64 * 1024  # smaller payloads are copied by zmq anyway; no tracking needed


class ParameterServer:
    """One server: a ROUTER socket in front of a :class:`ServerCore`.

    Args:
        secret: the job secret. num_workers: workers in the job. server_id: this server's index.
        verbose: PS_VERBOSE level: 1 logs connections, 2 also every message.
        payload_mac: authenticate array bytes too (ACCORD_KVSTORE_PAYLOAD_MAC; see protocol).
        max_frame: the largest message frame accepted (:func:`protocol.frame_limit`); ZeroMQ
            drops a peer that announces a bigger one before buffering it, so memory stays
            bounded before any MAC is checked.
        handshake_timeout: seconds a new connection has to pass the PLAIN handshake. ZeroMQ
            buffers a handshake command of up to ``max_frame`` bytes before asking this server
            whether the peer may connect, and holds it (and a file descriptor) until then.
    """

    def __init__(self, secret: bytes, num_workers: int, server_id: int = 0, verbose: int = 0,
                 payload_mac: bool = True, max_frame: int = protocol.frame_limit(),
                 handshake_timeout: float = 5.0) -> None:
        self._secret = secret
        self._payload_mac = payload_mac
        self.server_id = server_id
        self.verbose = int(verbose)
        self.token = new_token()  # names this server process in every header (no cross-server replay)
        self.max_frame = int(max_frame)
        self._ctx = zmq.Context()
        # ZeroMQ asks this socket whether a new peer may connect (ZAP); serve() answers
        self._zap = self._ctx.socket(zmq.REP)
        self._zap.setsockopt(zmq.LINGER, 0)
        self._zap.bind("inproc://zeromq.zap.01")
        self._password = protocol.connect_password(secret, self.token)
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.MAXMSGSIZE, self.max_frame)
        # ZeroMQ's default (30 s) lets a stranger hold a partly sent handshake, up to max_frame
        # bytes, that long; the job's workers pass it within a round trip.
        self._sock.setsockopt(zmq.HANDSHAKE_IVL, max(1, int(handshake_timeout * 1000)))
        self._sock.setsockopt(zmq.PLAIN_SERVER, 1)
        self._sock.setsockopt(zmq.ZAP_DOMAIN, b"accord-kvstore")
        self._monitor = self._sock.get_monitor_socket(
            zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED) if verbose else None
        self.core = ServerCore(num_workers, server_id, self._send, payload_mac)
        self._seen: dict[str, int] = {}
        self._refused = Refusals(log)
        self._dropped = Refusals(log)
        self._stop_requested = False
        self.endpoint = ""
        self._ipc_dir: str | None = None

    def bind(self, host: str = "127.0.0.1", advertise: str | None = None, ipc: bool = False,
             ipc_parent: str | None = None) -> str:
        """Bind a free port on ``host``; return what workers connect to (see
        :mod:`accord.kvstore.directory`: endpoints, this server's token, its frame limit).

        With ``ipc``, also bind a Unix socket in a fresh private (0700) directory (inside
        ``ipc_parent`` when given: accordrun passes the job's directory, which it and its
        guardian remove even when this server is killed): workers on this host take the Unix
        socket (about 40% less CPU than TCP loopback for large arrays), others the TCP
        endpoint. The MAC protects the messages either way; the directory keeps other users
        off the socket.
        """
        self._sock.bind(f"tcp://{host}:*")
        port = self._sock.getsockopt(zmq.LAST_ENDPOINT).decode().rsplit(":", 1)[1]
        ipc_endpoint = None
        if ipc and hasattr(zmq, "IPC_PATH_MAX_LEN"):
            self._ipc_dir = tempfile.mkdtemp(prefix="accord-kv-", dir=ipc_parent)
            path = os.path.join(self._ipc_dir, "server.sock")
            if len(path) < zmq.IPC_PATH_MAX_LEN:
                self._sock.bind(f"ipc://{path}")
                ipc_endpoint = f"ipc://{path}"
        self.endpoint = Advertised(f"tcp://{advertise or host}:{port}", ipc_endpoint, self.token,
                                   self.max_frame).text()
        return self.endpoint

    def request_stop(self) -> None:
        """Make :meth:`serve` return soon (safe from a signal handler)."""
        self._stop_requested = True

    def serve(self, heartbeat: Callable[[], None] | None = None, interval: float = 2.0) -> None:
        """Handle requests until stopped; ``heartbeat()`` runs every ``interval`` seconds and may
        raise to stop the server (the job's store is gone)."""
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._zap, zmq.POLLIN)
        if self._monitor is not None:
            poller.register(self._monitor, zmq.POLLIN)
        next_beat = time.monotonic() + interval
        while not self._stop_requested and not self.core.stopped:
            try:
                events = dict(poller.poll(200))
            except zmq.ZMQError:  # interrupted by a signal
                continue
            if self._zap in events:
                self._admit_peers()
            if self._sock in events:
                self._drain()
            if self._monitor is not None and self._monitor in events:
                self._log_events()
            if heartbeat is not None and time.monotonic() >= next_beat:
                heartbeat()
                next_beat = time.monotonic() + interval

    def _admit_peers(self) -> None:
        """Answer ZeroMQ's authentication requests: only the job's password gets in."""
        while True:
            try:
                request = self._zap.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            ok = len(request) == 8 and request[5] == b"PLAIN" and request[6] == protocol.CONNECT_USER \
                and hmac.compare_digest(request[7], self._password)
            if not ok:
                address = request[3].decode(errors="replace") if len(request) > 3 else "?"
                self._refused.log("server %d refused a connection from %s: it does not hold the job "
                                  "secret", self.server_id, address)
            request_id = request[1] if len(request) > 1 else b""
            self._zap.send_multipart([b"1.0", request_id, b"200" if ok else b"400",
                                      b"OK" if ok else b"refused", b"", b""])

    def _drain(self) -> None:
        for count in range(1, 1001):  # fairness: return to the poll loop now and then
            try:
                frames = self._sock.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self._handle(frames)
            if self.core.stopped:
                return
            if count % 16 == 0:
                # A worker connecting while others keep this loop busy must not wait for the
                # loop to answer its handshake (the handshake timeout would drop it).
                self._admit_peers()

    def _handle(self, frames: Sequence[Any]) -> None:
        peer, body = frames[0].bytes, frames[1:]
        try:
            header, payloads = protocol.open_message(self._secret, protocol.TO_SERVER, body,
                                                     self._payload_mac)
        except AuthenticationError:
            self._refused.log("server %d refused a message with a wrong MAC: a process without "
                              "the job secret is connecting", self.server_id)
            self._sock.send_multipart([peer, b"", protocol.REFUSED])
            return
        except protocol.ProtocolError as exc:
            self._dropped.log("server %d dropped a malformed message: %s", self.server_id, exc)
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
        self.core.handle(peer, header, payloads)

    def _send(self, peer: Any, request: dict, fields: dict, payloads: list, digests: list,
              buf: Buf | None) -> None:
        answer = {"sid": request.get("sid"), "seq": request.get("seq"), "from": self.token, **fields}
        frames = protocol.seal(self._secret, protocol.TO_WORKER, answer, payloads, digests or None,
                               self._payload_mac)
        big = any(memoryview(p).nbytes > _COPY_LIMIT for p in payloads)
        if big:
            tracker = self._sock.send_multipart([peer, *frames], copy=False, track=True)
            if buf is not None:
                buf.sent(tracker)
        else:
            self._sock.send_multipart([peer, *frames])

    def _log_events(self) -> None:
        from zmq.utils.monitor import recv_monitor_message

        while True:
            try:
                event = recv_monitor_message(self._monitor, flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            what = "accepted a connection" if event["event"] == zmq.EVENT_ACCEPTED else \
                "lost a connection"
            log.info("server %d %s (%s)", self.server_id, what, event["endpoint"].decode(errors="replace"))

    def close(self) -> None:
        """Close the socket and its context (idempotent)."""
        if self._monitor is not None:
            self._sock.disable_monitor()
            self._monitor.close(linger=0)
            self._monitor = None
        self._sock.close(linger=0)
        self._zap.close(linger=0)
        self._ctx.term()
        if self._ipc_dir is not None:
            shutil.rmtree(self._ipc_dir, ignore_errors=True)
            self._ipc_dir = None
