"""A worker's connections to the parameter servers: requests out, answers matched back.

One ZeroMQ DEALER socket per server; every request gets a sequence number and the answers,
which may come back in any order (a dist_sync push is answered only when its round completes),
are matched by it. Not thread-safe: one store, one thread.

Failure detection: a socket monitor reports when a server's TCP connection drops (the server
exited or was killed); every request waiting on that server then fails at once with
:class:`~accord.errors.RankFailedError`. A server that stays silent fails the wait after
``timeout`` seconds; one never reached fails after ``min(timeout, 30)`` seconds.
"""
from __future__ import annotations

import logging
import secrets
import time
from typing import Any, Callable, Sequence

import zmq
from zmq.utils.monitor import recv_monitor_message

from accord.errors import AccordError, AuthenticationError, ConfigError, RankFailedError, with_hint
from accord.kvstore import protocol
from accord.kvstore.directory import Advertised, usable_ipc

log = logging.getLogger("accord.kvstore")

_COPY_LIMIT = 64 * 1024
_POLL_MS = 200

# on_answer(header, payload frames): consumes an answer as soon as it is authenticated
Sink = Callable[[dict, list], None]


class ServerError(AccordError, ValueError):
    """A server refused a request (unknown key, wrong shape, ...); the message says why."""


def pick_endpoint(advertised: str) -> str:
    """The endpoint to connect to from what a server advertised (see :mod:`.address`): its Unix
    socket when that exists on this host in a private directory of this user, else its TCP
    endpoint."""
    address = Advertised.parse(advertised)
    if address.ipc is not None and usable_ipc(address.ipc):
        return address.ipc
    return address.tcp


class ServerConnections:
    """Requests to N parameter servers.

    Args:
        endpoints: ``tcp://host:port`` of each server, by server index.
        secret: the job secret. rank, num_workers: this worker's place (sent in every header).
        timeout: seconds a wait may go without an answer before failing.
        payload_mac: authenticate array bytes too (see :mod:`accord.kvstore.protocol`).

    Raises:
        ConfigError: ``payload_mac`` is on and the ``cryptography`` package is missing.
    """

    def __init__(self, endpoints: Sequence[str], secret: bytes, rank: int, num_workers: int,
                 timeout: float, verbose: bool = False, payload_mac: bool = True) -> None:
        if payload_mac:
            protocol.require_payload_mac()  # a missing package fails here, before any socket
        self.endpoints = list(endpoints)
        self._addresses = [Advertised.parse(e) for e in self.endpoints]
        self._payload_mac = payload_mac
        self._secret = secret
        self._rank, self._num_workers = rank, num_workers
        self.timeout = float(timeout)
        self._verbose = verbose
        self._ctx = zmq.Context()
        self._socks: list[zmq.Socket] = []
        self._monitors: list[zmq.Socket] = []
        self._poller = zmq.Poller()
        for advertised in self.endpoints:
            endpoint = pick_endpoint(advertised)
            sock = self._ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.PLAIN_USERNAME, protocol.CONNECT_USER)
            sock.setsockopt(zmq.PLAIN_PASSWORD,
                            protocol.connect_password(secret, Advertised.parse(advertised).to))
            mon = sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED
                                          | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
            sock.connect(endpoint)
            self._socks.append(sock)
            self._monitors.append(mon)
            self._poller.register(sock, zmq.POLLIN)
            self._poller.register(mon, zmq.POLLIN)
        self._index = {s: i for i, s in enumerate(self._socks)}
        self._mon_index = {m: i for i, m in enumerate(self._monitors)}
        self._connected = [False] * len(self._socks)
        self._dead: dict[int, str] = {}
        self._refused: set[int] = set()  # servers that refused our password
        self._sid = secrets.token_hex(8)
        self._seq = 0
        self._pending: dict[int, int] = {}  # seq -> server index
        self._answers: dict[int, tuple[dict, list]] = {}
        self._sinks: dict[int, Sink] = {}
        self._started = time.monotonic()
        self._closed = False

    # --- requests ----------------------------------------------------------------------------

    def request(self, server: int, op: str, fields: dict[str, Any], payloads: Sequence[Any] = (),
                track: bool = False, on_answer: Sink | None = None) -> tuple[int, Any]:
        """Send one request; returns ``(seq, tracker)``.

        ``track=True`` with a large payload returns a zmq tracker: the payload's memory (the
        caller's) is in use until :meth:`wait_sent` says it was sent.

        ``on_answer`` (which must not raise) takes a successful answer's header and payloads the
        moment it arrives authenticated, while its bytes are still in cache; :meth:`wait` then
        returns that answer without payloads, and zmq can reuse their memory at once.
        """
        self._poll_monitors()
        self._check_alive(server)
        self._check_size(server, payloads)
        self._seq += 1
        header = {"op": op, "sid": self._sid, "seq": self._seq, "rank": self._rank,
                  "nw": self._num_workers, "to": self._addresses[server].to, **fields}
        frames = protocol.seal(self._secret, protocol.TO_SERVER, header, payloads,
                               payload_mac=self._payload_mac)
        big = any(memoryview(p).nbytes > _COPY_LIMIT for p in payloads)
        tracker = self._socks[server].send_multipart(frames, copy=not big, track=big and track)
        self._pending[self._seq] = server
        if on_answer is not None:
            self._sinks[self._seq] = on_answer
        return self._seq, tracker

    def _check_size(self, server: int, payloads: Sequence[Any]) -> None:
        limit = self._addresses[server].max_frame
        biggest = max((memoryview(p).nbytes for p in payloads), default=0)
        if limit is not None and biggest > limit:
            raise ConfigError(with_hint(
                f"worker {self._rank}: a {biggest}-byte piece exceeds parameter server {server}'s "
                f"frame limit of {limit} bytes (it would drop the connection)",
                "set the same ACCORD_KVSTORE_CHUNK_ELEMENTS for every worker and server of the job"))

    def wait_sent(self, trackers: Sequence[tuple[int, Any]]) -> None:
        """Wait until zmq no longer reads the tracked payloads ``[(server, tracker)]``."""
        deadline = time.monotonic() + self.timeout
        for server, tracker in trackers:
            while tracker is not None and not tracker.done:
                self._poll_monitors()
                self._check_alive(server)
                if time.monotonic() > deadline:
                    self._fail_timeout([server], "sending a value")
                try:
                    tracker.wait(0.1)
                except zmq.NotDone:
                    pass

    def wait(self, seqs: Sequence[int], what: str = "") -> list[tuple[dict, list]]:
        """The answers to ``seqs``, in that order.

        Raises:
            ServerError: a server refused one of the requests (after all have answered).
            RankFailedError: a server died, was never reached, or was silent for ``timeout``.
            AuthenticationError: a server refused our secret.
        """
        deadline = time.monotonic() + self.timeout
        while True:
            missing = [s for s in seqs if s not in self._answers]
            if not missing:
                break
            servers = sorted({self._pending[s] for s in missing})
            for server in servers:
                self._check_alive(server)
                if not self._connected[server] and \
                        time.monotonic() - self._started > min(self.timeout, 30.0):
                    self._mark_dead(server, f"could not be reached within "
                                            f"{min(self.timeout, 30.0):.0f}s")
                    self._check_alive(server)
            now = time.monotonic()
            if now > deadline:
                self._fail_timeout(servers, what)
            for sock, _ in self._poller.poll(min(_POLL_MS, max(1, int((deadline - now) * 1000)))):
                if sock in self._index:
                    self._receive(self._index[sock])
                else:
                    self._monitor_events(self._mon_index[sock])
        answers = [self._answers.pop(s) for s in seqs]
        for header, _ in answers:
            if "error" in header:
                raise ServerError(with_hint(
                    f"parameter server {header.get('server')} refused the request: {header['error']}",
                    "every worker must init each key (same shape and dtype) before using it, and "
                    "use the store the same way (see the message)"))
        return answers

    # --- plumbing ----------------------------------------------------------------------------

    def _receive(self, server: int) -> None:
        sock = self._socks[server]
        while True:
            try:
                frames = sock.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            if len(frames) == 2 and frames[1].bytes == protocol.REFUSED:
                raise _refused_error(server, self.endpoints[server])
            try:
                header, payloads = protocol.open_message(self._secret, protocol.TO_WORKER, frames,
                                                         self._payload_mac)
            except (AuthenticationError, protocol.ProtocolError) as exc:
                log.warning("worker %d dropped a message from server %d: %s", self._rank, server, exc)
                continue
            seq = header.get("seq")
            if header.get("sid") != self._sid or self._pending.get(seq) != server \
                    or header.get("from") != self._addresses[server].to:
                log.warning("worker %d dropped an unexpected answer from server %d (seq %r)",
                            self._rank, server, seq)
                continue
            del self._pending[seq]
            sink = self._sinks.pop(seq, None)
            if sink is not None and "error" not in header:
                sink(header, payloads)
                payloads = []
            self._answers[seq] = (header, payloads)

    def _poll_monitors(self) -> None:
        for i in range(len(self._monitors)):
            self._monitor_events(i)

    def _monitor_events(self, server: int) -> None:
        mon = self._monitors[server]
        while True:
            try:
                event = recv_monitor_message(mon, flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            if event["event"] == zmq.EVENT_CONNECTED:
                self._connected[server] = True
                if self._verbose:
                    log.info("worker %d connected to server %d at %s", self._rank, server,
                             self.endpoints[server])
            elif event["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                if server not in self._refused:
                    log.warning("worker %d: parameter server %d at %s refused our password: it "
                                "holds another job secret", self._rank, server, self.endpoints[server])
                self._refused.add(server)
            elif event["event"] == zmq.EVENT_DISCONNECTED and server not in self._refused:
                # a server that refused us closes the connection too: that is no crash
                self._mark_dead(server, "closed the connection (it exited or was killed)")

    def _mark_dead(self, server: int, why: str) -> None:
        if server not in self._dead:
            self._dead[server] = why
            log.warning("worker %d: parameter server %d at %s %s", self._rank, server,
                        self.endpoints[server], why)

    def _check_alive(self, server: int) -> None:
        if self._closed:
            raise RankFailedError(with_hint("this kvstore was closed", "create a new store"))
        if server in self._refused:
            raise _refused_error(server, self.endpoints[server])
        why = self._dead.get(server)
        if why is not None:
            raise RankFailedError(with_hint(
                f"worker {self._rank}: parameter server {server} at {self.endpoints[server]} {why}",
                "the servers hold the store's values, so the job cannot go on: see that server's "
                "log for its error, then restart the job"))

    def _fail_timeout(self, servers: Sequence[int], what: str) -> None:
        raise RankFailedError(with_hint(
            f"worker {self._rank}: no answer from parameter server(s) {list(servers)} within "
            f"{self.timeout:.0f}s{' while ' + what if what else ''}",
            "in dist_sync a push is answered when every worker has pushed that key: check that "
            "no worker died or skipped a push; raise ACCORD_KVSTORE_TIMEOUT for slow steps"))

    def close(self) -> None:
        """Close every socket (pending requests are abandoned; idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._sinks.clear()
        for sock, mon in zip(self._socks, self._monitors):
            sock.disable_monitor()
            mon.close(linger=0)
            sock.close(linger=0)
        self._ctx.term()


def _refused_error(server: int, endpoint: str) -> AuthenticationError:
    return AuthenticationError(with_hint(
        f"parameter server {server} at {endpoint} refused our messages: our password or MAC does "
        "not match its secret",
        "every worker and server of the job must use the same secret (ACCORD_JOB_SECRET or "
        "ACCORD_SECRET_FILE) and the same ACCORD_KVSTORE_PAYLOAD_MAC"))
