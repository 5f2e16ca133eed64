"""Parameter-server processes: ``python -m accord.kvstore.server`` (no torch: starts in ~0.2 s).

A server reads its configuration from the environment (accord names, MXNet's accepted)::

    ACCORD_ROLE / DMLC_ROLE                 server (or scheduler, see below)
    ACCORD_NUM_WORKERS / DMLC_NUM_WORKER    workers in the job (default ACCORD_SIZE)
    ACCORD_PS_ROOT_URI/PORT (DMLC_PS_ROOT_URI/PORT), else ACCORD_STORE_ADDR/PORT
                                            the job's authenticated store, where servers register
    ACCORD_JOB_SECRET / ACCORD_SECRET_FILE  the per-job secret
    ACCORD_NODE_HOST / DMLC_NODE_HOST       address to advertise (multi-host runs)
    ACCORD_VERBOSE / PS_VERBOSE             1: log registration and connections to stderr;
                                            2: also every message (op, key, rank, bytes)
    ACCORD_SERVER_INDEX                     this server's index (accordrun sets it; default:
                                            the next value of a store counter)

It takes its index from ACCORD_SERVER_INDEX (else the next value of a store counter), binds a
ZeroMQ ROUTER socket on a free port (loopback when the store is on loopback, else every
interface) and a Unix socket (ACCORD_KVSTORE_IPC), publishes its address
(:mod:`accord.kvstore.address`: endpoints, a random token, its frame limit) under
``accord/kvstore/server/<index>`` (workers on the same host take the Unix socket), admits only
peers that pass ZeroMQ's PLAIN handshake with the job's connect password (answering ZeroMQ's
authentication requests in its own loop) and serves
until a ``stop`` request, SIGTERM/SIGINT, or the store stops answering (the job is over), so no
server outlives its job.

``ACCORD_ROLE=scheduler`` runs the store itself on ACCORD_PS_ROOT_URI:ACCORD_PS_ROOT_PORT, for
jobs started MXNet-style (a scheduler, servers and workers started by another tool, e.g. MXNet's
``tools/launch.py``, with DMLC_* variables and ACCORD_JOB_SECRET). In such jobs rank 0's store
stops the servers when it closes (at exit at the latest), as MXNet's does, and the scheduler
exits once every server has stopped.

``accordrun --num-servers N`` starts N of these programs itself (:mod:`accord.run.servers`;
the launcher does not import this module); :func:`start_servers` does it for tests and
:class:`~accord.kvstore.cluster.LocalCluster`.
"""
from __future__ import annotations

import hmac
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Mapping, Sequence

import zmq

from accord import config
from accord.errors import AuthenticationError, ConfigError, RendezvousError, with_hint
from accord.kvstore import protocol
from accord.kvstore.address import Advertised, new_token
from accord.kvstore.server_core import ServerCore, _Buf
from accord.kvstore.server_memory import retain_freed_memory
from accord.logs import Refusals

log = logging.getLogger("accord.kvstore")

PREFIX = "accord/kvstore"
SERVER_KEY = PREFIX + "/server/{index}"
SERVER_COUNTER = PREFIX + "/server_count"
STOPPED_KEY = PREFIX + "/server/{index}/stopped"
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
    """

    def __init__(self, secret: bytes, num_workers: int, server_id: int = 0, verbose: int = 0,
                 payload_mac: bool = True, max_frame: int = protocol.frame_limit()) -> None:
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
        :mod:`accord.kvstore.address`: endpoints, this server's token, its frame limit).

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
        for _ in range(1000):  # fairness: return to the poll loop now and then
            try:
                frames = self._sock.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self._handle(frames)
            if self.core.stopped:
                return

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
              buf: _Buf | None) -> None:
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


def store_address() -> tuple[str, int]:
    """Where servers register: ACCORD_PS_ROOT_URI/PORT, else ACCORD_STORE_ADDR/PORT.

    Raises:
        ConfigError: neither pair is set.
    """
    host = config.get("ACCORD_PS_ROOT_URI") or config.get("ACCORD_STORE_ADDR")
    port = config.get("ACCORD_PS_ROOT_PORT") or config.get("ACCORD_STORE_PORT")
    if not host or not port:
        raise ConfigError(with_hint(
            "parameter servers need the job's store address, and neither ACCORD_PS_ROOT_URI/"
            "ACCORD_PS_ROOT_PORT (DMLC_PS_ROOT_URI/PORT) nor ACCORD_STORE_ADDR/PORT is set",
            "start the job with `accordrun --num-servers N`, or set DMLC_PS_ROOT_URI and "
            "DMLC_PS_ROOT_PORT to the scheduler's address"))
    return str(host), int(port)


def _is_loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


def _interface_bind() -> str | None:
    """The address of ACCORD_INTERFACE (--network-interface, DMLC_INTERFACE), or None if unset.

    Raises:
        ConfigError: the interface does not exist here or has no IPv4 address.
    """
    import ipaddress

    from accord.errors import LaunchError
    from accord.run.hosts import interface_address

    iface = config.get("ACCORD_INTERFACE")
    if not iface:
        return None
    try:
        return str(ipaddress.ip_address(iface))
    except ValueError:
        pass
    try:
        return interface_address(iface)
    except LaunchError as exc:
        raise ConfigError(str(exc)) from None


def _advertised(store_host: str) -> tuple[str, str]:
    """(bind address, advertised address) for a server whose store is at ``store_host``.

    Multi-host: the named interface's address when there is one (nothing on 0.0.0.0), else
    every interface, advertising ACCORD_NODE_HOST or the source address of the route to the store.
    """
    node = config.get("ACCORD_NODE_HOST")
    if _is_loopback(store_host):
        return "127.0.0.1", node or "127.0.0.1"
    bind = _interface_bind()
    if bind is not None:
        return bind, node or bind
    if node:
        return "0.0.0.0", node
    try:  # the source address of the route towards the store; UDP connect sends nothing
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect((store_host, 9))
            return "0.0.0.0", sock.getsockname()[0]
    except OSError:
        return "0.0.0.0", socket.gethostname()


def _setup_logging(verbose: int, label: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"[{label}] %(message)s"))
    log.addHandler(handler)
    # level 2 also shows the core's per-request debug lines (e.g. each async push)
    log.setLevel(logging.WARNING if verbose <= 0 else logging.INFO if verbose == 1 else logging.DEBUG)
    log.propagate = False


def _run_scheduler(secret: bytes, verbose: int) -> int:
    from accord.store.server import StoreServer

    host, port = store_address()
    servers = int(config.get("ACCORD_NUM_SERVERS"))
    stopped = [STOPPED_KEY.format(index=i) for i in range(servers)]
    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(1))
    bind = "127.0.0.1" if _is_loopback(host) else (_interface_bind() or "0.0.0.0")
    with StoreServer(host=bind, port=port, secret=secret) as store:
        log.info("scheduler: store serving on %s:%d for %d servers", host, port, servers)
        # As ps-lite's scheduler, leave once the job is over: every server has stopped.
        while not stop and not (stopped and store.has_keys(stopped)):
            time.sleep(0.1)
    log.info("scheduler: stopping")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run a server (or the scheduler) from the environment; returns the exit code.

    0 after a stop request, SIGTERM/SIGINT, or once the job's store is gone; 2 when the
    configuration is unusable or the store cannot be reached at start.
    """
    verbose = int(config.get("ACCORD_VERBOSE"))
    role = str(config.get("ACCORD_ROLE")).lower()
    _setup_logging(verbose, f"accord-kvstore {role} pid {os.getpid()}")
    try:
        secret = protocol.load_secret()
        if role == "scheduler":
            return _run_scheduler(secret, verbose)
        if role != "server":
            raise ConfigError(with_hint(f"ACCORD_ROLE/DMLC_ROLE is {role!r}; this program runs "
                                        "parameter servers", "set DMLC_ROLE=server (or scheduler)"))
        workers = config.get("ACCORD_NUM_WORKERS") or config.get("ACCORD_SIZE")
        if not workers:
            raise ConfigError(with_hint("a parameter server needs the number of workers",
                                        "set ACCORD_NUM_WORKERS (or DMLC_NUM_WORKER)"))
        return _serve(secret, int(workers), verbose)
    except (ConfigError, RendezvousError, zmq.ZMQError) as exc:
        log.error("%s", exc)
        return 2


def _serve(secret: bytes, workers: int, verbose: int) -> int:
    from accord.store.connection import StoreConnection

    if config.get("ACCORD_KVSTORE_PAYLOAD_MAC"):
        protocol.require_payload_mac()  # fail at start, not at the first message
    retain_freed_memory()  # process wide, so here in the server process, not in ServerCore
    host, port = store_address()
    conn = StoreConnection(host, port, secret, timeout=float(config.get("ACCORD_START_TIMEOUT")))
    server = None
    try:
        index = config.get("ACCORD_SERVER_INDEX")
        server_id = int(index) if index is not None else conn.add(SERVER_COUNTER, 1) - 1
        bind, advertise = _advertised(host)
        server = ParameterServer(secret, workers, server_id, verbose,
                                 bool(config.get("ACCORD_KVSTORE_PAYLOAD_MAC")),
                                 protocol.frame_limit(int(config.get("ACCORD_KVSTORE_CHUNK_ELEMENTS"))))
        endpoint = server.bind(bind, advertise, ipc=bool(config.get("ACCORD_KVSTORE_IPC")),
                               ipc_parent=config.get("ACCORD_KVSTORE_IPC_DIR"))
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: server.request_stop())
        conn.set(SERVER_KEY.format(index=server_id), endpoint)
        log.info("server %d registered at %s for %d workers (store %s:%d)", server_id, endpoint,
                 workers, host, port)
        try:
            server.serve(conn.ping)  # the ping raises once the store (the job) is gone
            conn.set(STOPPED_KEY.format(index=server_id), b"1")  # lets a scheduler exit
        except RendezvousError:
            log.info("server %d: the job's store at %s:%d is gone; stopping", server_id, host, port)
        log.info("server %d stopped", server_id)
        return 0
    finally:
        if server is not None:
            server.close()
        conn.close()


def server_command() -> list[str]:
    """The argv that runs one server with this Python."""
    return [sys.executable, "-m", "accord.kvstore.server"]


def server_environment(env: Mapping[str, str], num_servers: int) -> dict[str, str]:
    """``env`` plus the server role and MXNet's names (DMLC_ROLE/NUM_SERVER/NUM_WORKER).

    ``env`` must already hold the store address (ACCORD_STORE_ADDR/PORT), the secret and
    ACCORD_NUM_WORKERS (or ACCORD_SIZE).
    """
    out = dict(env)
    out.update({"ACCORD_ROLE": "server", "DMLC_ROLE": "server",
                "ACCORD_NUM_SERVERS": str(num_servers), "DMLC_NUM_SERVER": str(num_servers)})
    workers = out.get("ACCORD_NUM_WORKERS") or out.get("DMLC_NUM_WORKER") or out.get("ACCORD_SIZE")
    if workers:
        out.setdefault("ACCORD_NUM_WORKERS", workers)
        out.setdefault("DMLC_NUM_WORKER", workers)
    return out


def start_servers(num_servers: int, env: Mapping[str, str], *, stdout: Any = None,
                  stderr: Any = None, cwd: str | None = None) -> list[subprocess.Popen]:
    """Start ``num_servers`` server processes (each in its own session) and return them.

    Args:
        env: the full environment for the servers (see :func:`server_environment`).
        stdout, stderr: as for :class:`subprocess.Popen` (e.g. ``subprocess.PIPE``).
    """
    procs: list[subprocess.Popen] = []
    full = server_environment(env, num_servers)
    try:
        for _ in range(num_servers):
            procs.append(subprocess.Popen(server_command(), env=full, cwd=cwd, stdin=subprocess.DEVNULL,
                                          stdout=stdout, stderr=stderr, start_new_session=True))
    except OSError:
        for p in procs:
            p.kill()
            p.wait()
        raise
    return procs


if __name__ == "__main__":
    sys.exit(main())
