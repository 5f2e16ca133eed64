"""A worker's connections to the parameter servers: requests out, answers matched back.

One connection per server (:mod:`accord.kvstore.transport`: each side proves it holds the job
secret without sending it; the worker takes the server's Unix socket when it is on this host).
Every request gets a sequence number and the answers, which may come back in any order (a
dist_sync push is answered only when its round completes), are matched by it. Sockets are
non-blocking: while a call waits (to send a large value, or for answers) it reads every
server's answers and writes every queued request, so a worker and a server never wait on each
other. Not thread-safe: one store, one thread.

Failure detection: the connections are made when the object is built (all servers at once);
a server never reached fails after ``min(timeout, 30)`` seconds (a connection reset during the
handshake, as a server under a flood of connections does to make room, is retried until then).
A server whose connection drops (it exited or was killed) fails every request waiting on it at
once with :class:`~accord.errors.RankFailedError`; one that refuses our proof or one of our
messages fails them with its reason; one that stays silent fails the wait after ``timeout``
seconds.
"""
from __future__ import annotations

import hmac
import logging
import os
import secrets
import selectors
import socket
import time
from typing import Any, Callable, Sequence

from accord.errors import AccordError, AuthenticationError, ConfigError, RankFailedError, with_hint
from accord.kvstore import protocol, transport
from accord.kvstore.directory import Advertised, usable_ipc

log = logging.getLogger("accord.kvstore")

_COPY_LIMIT = 64 * 1024
_POLL_S = 0.2

# on_answer(header, payloads): consumes an answer as soon as it is authenticated
Sink = Callable[[dict, list], None]

_CONNECTING, _HELLO, _PROOF, _READY, _RETRY, _DEAD = range(6)


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


class _Link:
    """The connection to one server, from the first connect to its end."""

    def __init__(self, index: int, advertised: str, within: float) -> None:
        self.index = index
        self.shown = advertised
        self.address = Advertised.parse(advertised)
        self.endpoint = pick_endpoint(advertised)
        self.deadline = time.monotonic() + within  # to be connected by
        self.within = within
        self.state = _RETRY
        self.retry_at = 0.0
        self.delay = 0.02
        self.sock: socket.socket | None = None
        self.events = 0
        self.buf = b""
        self.nonce = b""
        self.server_nonce = b""
        self.outbox = transport.Outbox()
        self.inbox: transport.Inbox | None = None
        self.last_error = ""
        self.attempts = 0
        self.dead: str | None = None  # why it is gone
        self.refused: str | None = None  # why the server refused our proof or a message's MAC
        self.rejected: str | None = None  # why the server refused one of our messages (a limit)


class ServerConnections:
    """Requests to N parameter servers.

    Args:
        endpoints: what each server advertised (:mod:`accord.kvstore.directory`), by server index.
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
        self._payload_mac = payload_mac
        self._secret = secret
        self._rank, self._num_workers = rank, num_workers
        self.timeout = float(timeout)
        self._verbose = verbose
        self._sel = selectors.DefaultSelector()
        within = min(self.timeout, 30.0)
        self._links = [_Link(i, e, within) for i, e in enumerate(self.endpoints)]
        self._sid = secrets.token_hex(8)
        self._seq = 0
        self._pending: dict[int, int] = {}  # seq -> server index
        self._answers: dict[int, tuple[dict, list]] = {}
        self._sinks: dict[int, Sink] = {}
        self._closed = False
        # Connect now, in parallel, so that no handshake waits for the first request (a server
        # drops a connection that has not proven itself within seconds); a server that cannot
        # be reached or refuses us fails the first request made of it, with the reason.
        while any(link.state not in (_READY, _DEAD) for link in self._links):
            self._pump(_POLL_S)

    # --- requests ----------------------------------------------------------------------------

    def request(self, server: int, op: str, fields: dict[str, Any], payloads: Sequence[Any] = (),
                track: bool = False, on_answer: Sink | None = None) -> tuple[int, Any]:
        """Queue one request (and write what the socket takes now); returns ``(seq, tracker)``.

        ``track=True`` with a large payload returns a :class:`~accord.kvstore.transport.Tracker`:
        the payload's memory (the caller's) is in use until :meth:`wait_sent` says it was sent.

        ``on_answer`` (which must not raise) takes a successful answer's header and payloads the
        moment it arrives authenticated, while its bytes are still in cache; :meth:`wait` then
        returns that answer without payloads, and their memory can be reused at once.

        Raises:
            HeaderTooLarge: the header would exceed the servers' limit (nothing is sent).
            ConfigError: a payload exceeds the server's frame limit.
            RankFailedError, AuthenticationError, ServerError: that server is gone or refused us.
        """
        self._pump(0.0)
        self._check_alive(server)
        self._check_size(server, payloads)
        link = self._links[server]
        seq = self._seq + 1
        header = {"op": op, "sid": self._sid, "seq": seq, "rank": self._rank,
                  "nw": self._num_workers, "to": link.address.to, **fields}
        frames = protocol.seal(self._secret, protocol.TO_SERVER, header, payloads,
                               payload_mac=self._payload_mac)
        self._seq = seq
        big = any(memoryview(p).nbytes > _COPY_LIMIT for p in payloads)
        tracker = link.outbox.add(frames, track=big and track)
        if link.state == _READY:
            self._write(link)
        self._pending[seq] = server
        if on_answer is not None:
            self._sinks[seq] = on_answer
        return seq, tracker

    def _check_size(self, server: int, payloads: Sequence[Any]) -> None:
        limit = self._links[server].address.max_frame
        biggest = max((memoryview(p).nbytes for p in payloads), default=0)
        if limit is not None and biggest > limit:
            raise ConfigError(with_hint(
                f"worker {self._rank}: a {biggest}-byte piece exceeds parameter server {server}'s "
                f"frame limit of {limit} bytes (it would refuse the message)",
                "set the same ACCORD_KVSTORE_CHUNK_ELEMENTS for every worker and server of the job"))

    def wait_sent(self, trackers: Sequence[tuple[int, Any]]) -> None:
        """Wait until the tracked payloads ``[(server, tracker)]`` are written (their memory is
        the caller's again)."""
        deadline = time.monotonic() + self.timeout
        for server, tracker in trackers:
            while tracker is not None and not tracker.done:
                self._check_alive(server)
                if time.monotonic() > deadline:
                    self._fail_timeout([server], "sending a value")
                self._pump(_POLL_S)

    def flush(self, what: str = "sending") -> None:
        """Wait until every queued request is written."""
        deadline = time.monotonic() + self.timeout
        while True:
            busy = [link.index for link in self._links if link.outbox]
            if not busy:
                return
            for server in busy:
                self._check_alive(server)
            if time.monotonic() > deadline:
                self._fail_timeout(busy, what)
            self._pump(_POLL_S)

    def wait(self, seqs: Sequence[int], what: str = "") -> list[tuple[dict, list]]:
        """The answers to ``seqs``, in that order.

        Raises:
            ServerError: a server refused one of the requests (after all have answered).
            RankFailedError: a server died, was never reached, or was silent for ``timeout``.
            AuthenticationError: a server refused our proof or our messages.
        """
        deadline = time.monotonic() + self.timeout
        while True:
            missing = [s for s in seqs if s not in self._answers]
            if not missing:
                break
            servers = sorted({self._pending[s] for s in missing})
            for server in servers:
                self._check_alive(server)
            now = time.monotonic()
            if now > deadline:
                self._fail_timeout(servers, what)
            self._pump(min(_POLL_S, max(0.001, deadline - now)))
        answers = [self._answers.pop(s) for s in seqs]
        for header, _ in answers:
            if "error" in header:
                raise ServerError(with_hint(
                    f"parameter server {header.get('server')} refused the request: {header['error']}",
                    "every worker must init each key (same shape and dtype) before using it, and "
                    "use the store the same way (see the message)"))
        return answers

    # --- the connections ---------------------------------------------------------------------

    def _pump(self, timeout: float) -> None:
        """Move every connection on: connect, handshake, write what is queued, read answers;
        waits up to ``timeout`` seconds for something to happen."""
        if self._closed:
            return
        now = time.monotonic()
        for link in self._links:
            if link.state == _RETRY and now >= link.retry_at:
                self._connect(link)
            elif link.state in (_CONNECTING, _HELLO, _PROOF) and now > link.deadline:
                self._give_up(link, f"did not complete the handshake within {link.within:.0f}s")
            self._watch(link)
        waits = [link.retry_at - now for link in self._links if link.state == _RETRY]
        if waits:
            timeout = max(0.0, min([timeout, *waits]))
        if not self._sel.get_map():
            if timeout:
                time.sleep(timeout)
            return
        try:
            events = self._sel.select(timeout)
        except InterruptedError:
            return
        for key, mask in events:
            link = key.data
            if link.sock is not key.fileobj:
                continue
            if link.state == _CONNECTING and mask & selectors.EVENT_WRITE:
                self._connected(link)
            elif link.state in (_HELLO, _PROOF) and mask & selectors.EVENT_READ:
                self._handshake(link)
            elif link.state == _READY:
                if mask & selectors.EVENT_WRITE:
                    self._write(link)
                if mask & selectors.EVENT_READ and link.state == _READY:
                    self._read(link)

    def _watch(self, link: _Link) -> None:
        """Register ``link``'s socket for what it waits on now."""
        if link.sock is None:
            return
        events = selectors.EVENT_READ
        if link.state == _CONNECTING or (link.state == _READY and link.outbox):
            events |= selectors.EVENT_WRITE
        if events != link.events:
            if link.events:
                self._sel.modify(link.sock, events, link)
            else:
                self._sel.register(link.sock, events, link)
            link.events = events

    def _unwatch(self, link: _Link) -> None:
        if link.sock is not None:
            if link.events:
                self._sel.unregister(link.sock)
            link.sock.close()
        link.sock, link.events = None, 0

    def _connect(self, link: _Link) -> None:
        link.attempts += 1
        try:
            link.sock = transport.connect_socket(link.endpoint)
        except OSError as exc:
            self._attempt_failed(link, str(exc))
            return
        link.state, link.buf = _CONNECTING, b""
        if link.sock.family == socket.AF_UNIX:  # connected at once, or refused at once
            self._connected(link)

    def _connected(self, link: _Link) -> None:
        assert link.sock is not None
        err = link.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            self._attempt_failed(link, os.strerror(err))
            return
        link.state = _HELLO
        self._watch(link)

    def _handshake(self, link: _Link) -> None:
        assert link.sock is not None
        need = transport.HELLO_BYTES if link.state == _HELLO else transport.PROOF_BYTES
        try:
            data = link.sock.recv(need - len(link.buf))
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._attempt_failed(link, str(exc))
            return
        if not data:
            self._attempt_failed(link, "the server closed the connection during the handshake")
            return
        link.buf += data
        if len(link.buf) < need:
            return
        data, link.buf = link.buf, b""
        secret, token = self._secret, link.address.to
        if link.state == _HELLO:
            if data[:len(transport.MAGIC)] != transport.MAGIC:
                self._give_up(link, f"is not a parameter server of this accord version (it sent {data[:8]!r})")
                return
            link.server_nonce, link.nonce = data[len(transport.MAGIC):], os.urandom(transport.NONCE_BYTES)
            opening = transport.hello_bytes(link.nonce) + \
                transport.worker_proof(secret, token, link.server_nonce, link.nonce)
            try:
                link.sock.send(opening)  # 56 bytes into a fresh connection
            except OSError as exc:
                self._attempt_failed(link, str(exc))
                return
            link.state = _PROOF
        elif hmac.compare_digest(data, transport.server_proof(secret, token, link.server_nonce, link.nonce)):
            link.state = _READY
            link.inbox = transport.Inbox(self._check_head, link.address.max_frame or protocol.frame_limit())
            if self._verbose:
                log.info("worker %d connected to server %d at %s", self._rank, link.index, link.endpoint)
            self._watch(link)
            self._write(link)
        elif data == transport.REFUSED_BUSY:
            self._attempt_failed(link, "the server had no room for another connection")
        else:
            why = "refused our proof of the job secret: it holds another secret" \
                if data == transport.REFUSED_SECRET else \
                "answered with a wrong proof: it does not hold this job's secret"
            self._refuse(link, why)

    def _check_head(self, tags: bytes, header: bytes, lengths: list) -> protocol.Head:
        return protocol.check_head(self._secret, protocol.TO_WORKER, tags, header, lengths, self._payload_mac)

    def _write(self, link: _Link) -> None:
        assert link.sock is not None
        try:
            link.outbox.flush(link.sock)
        except OSError:
            self._lost(link)
            return
        self._watch(link)

    def _read(self, link: _Link) -> None:
        assert link.sock is not None and link.inbox is not None
        for _ in range(64):
            try:
                messages = link.inbox.receive_once(link.sock)
            except (BlockingIOError, InterruptedError):
                return
            except transport.Refused as exc:
                if exc.kind == "limit":
                    self._reject(link, exc.reason)
                else:
                    self._refuse(link, f"refused our messages: {exc.reason}")
                return
            except (transport.Closed, OSError):
                self._lost(link)
                return
            except (AuthenticationError, protocol.ProtocolError) as exc:
                self._give_up(link, f"sent a message this worker cannot trust ({exc})")
                return
            for head, payloads in messages:
                self._deliver(link, head, payloads)

    def _deliver(self, link: _Link, head: protocol.Head, payloads: list) -> None:
        server = link.index
        try:
            header, payloads = protocol.open_body(self._secret, protocol.TO_WORKER, head, payloads,
                                                  self._payload_mac)
        except (AuthenticationError, protocol.ProtocolError) as exc:
            log.warning("worker %d dropped a message from server %d: %s", self._rank, server, exc)
            return
        seq = header.get("seq")
        if header.get("from") != link.address.to:
            log.warning("worker %d dropped an answer from server %d meant for another server's "
                        "worker (seq %r)", self._rank, server, seq)
            return
        if seq is None and header.get("sid") is None and "error" in header:
            # The server could not read one of our messages: every request waiting on it fails.
            for waiting in [s for s, where in self._pending.items() if where == server]:
                del self._pending[waiting]
                self._sinks.pop(waiting, None)
                self._answers[waiting] = ({"error": header["error"], "server": server}, [])
            return
        if header.get("sid") != self._sid or self._pending.get(seq) != server:
            log.warning("worker %d dropped an unexpected answer from server %d (seq %r)",
                        self._rank, server, seq)
            return
        del self._pending[seq]
        sink = self._sinks.pop(seq, None)
        if sink is not None and "error" not in header:
            sink(header, payloads)
            payloads = []
        self._answers[seq] = (header, payloads)

    # --- failures ----------------------------------------------------------------------------

    def _attempt_failed(self, link: _Link, why: str) -> None:
        """A connection attempt ended before the handshake did: try again until the deadline."""
        self._unwatch(link)
        link.last_error = why
        now = time.monotonic()
        if now + link.delay > link.deadline:
            self._give_up(link, f"could not be reached within {link.within:.0f}s (last: {why})")
            return
        link.state, link.retry_at = _RETRY, now + link.delay
        link.delay = min(link.delay * 2, 0.5)

    def _lost(self, link: _Link) -> None:
        self._give_up(link, "closed the connection (it exited or was killed)")

    def _end(self, link: _Link, field: str, why: str) -> None:
        """The connection is over; ``field`` (dead, refused, rejected) records why, once."""
        self._unwatch(link)
        link.outbox.drop()
        link.state = _DEAD
        if link.dead is None and link.refused is None and link.rejected is None:
            setattr(link, field, why)
            log.warning("worker %d: parameter server %d at %s %s", self._rank, link.index, link.endpoint,
                        why if field != "rejected" else f"refused one of our messages: {why}")

    def _give_up(self, link: _Link, why: str) -> None:
        self._end(link, "dead", why)

    def _refuse(self, link: _Link, why: str) -> None:
        self._end(link, "refused", why)

    def _reject(self, link: _Link, why: str) -> None:
        self._end(link, "rejected", why)

    def _check_alive(self, server: int) -> None:
        if self._closed:
            raise RankFailedError(with_hint("this kvstore was closed", "create a new store"))
        link = self._links[server]
        if link.refused is not None:
            raise AuthenticationError(with_hint(
                f"parameter server {server} at {link.endpoint} {link.refused}",
                "every worker and server of the job must use the same secret (ACCORD_JOB_SECRET or "
                "ACCORD_SECRET_FILE), the same ACCORD_KVSTORE_PAYLOAD_MAC and the same accord version"))
        if link.rejected is not None:
            raise ServerError(with_hint(
                f"worker {self._rank}: parameter server {server} at {link.endpoint} refused one of "
                f"our messages and closed the connection: {link.rejected}",
                "every worker and server of the job must run the same accord version with the same "
                "ACCORD_KVSTORE_CHUNK_ELEMENTS (see the limit named above)"))
        if link.dead is not None:
            raise RankFailedError(with_hint(
                f"worker {self._rank}: parameter server {server} at {link.endpoint} {link.dead}",
                "the servers hold the store's values, so the job cannot go on: see that server's "
                "log for its error, then restart the job"))

    def _fail_timeout(self, servers: Sequence[int], what: str) -> None:
        raise RankFailedError(with_hint(
            f"worker {self._rank}: no answer from parameter server(s) {list(servers)} within "
            f"{self.timeout:.0f}s{' while ' + what if what else ''}",
            "in dist_sync a push is answered when every worker has pushed that key: check that "
            "no worker died or skipped a push; raise ACCORD_KVSTORE_TIMEOUT for slow steps"))

    def close(self) -> None:
        """Close every connection (pending requests are abandoned; idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._sinks.clear()
        for link in self._links:
            self._unwatch(link)
            link.outbox.drop()
        self._sel.close()
