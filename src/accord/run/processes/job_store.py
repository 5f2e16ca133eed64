"""The launcher's side of the rendezvous: accord's store, ports, and rank check-in.

Two ports per job, both from the OS unless given: accord's authenticated store
(``ACCORD_STORE_PORT``) and ``MASTER_PORT``, which rank 0 of a plain ``env://`` script binds for
torch's own TCPStore. Torch-free (the launcher must start fast).
"""
from __future__ import annotations

import socket
import time
from typing import Any, Sequence

from accord.errors import LaunchError, RendezvousError, with_hint
from accord.worker_contract import CHECKIN_KEY


def free_port(host: str = "") -> int:
    """A port the OS says is free on ``host`` (all interfaces by default).

    Another process may take it before our worker binds it; torchrun accepts the same race.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class ReservedPort:
    """A port kept bound (not listening) by the launcher until the job ends.

    A port the OS handed out and we let go can go to the next process that asks for one (another
    job's store, say) before rank 0 of an ``env://`` script binds it. Holding it bound with
    ``SO_REUSEADDR`` closes that window: the kernel gives no other ``bind(0)`` a port that a
    socket holds, while torch's TCPStore, which also sets ``SO_REUSEADDR``, can still bind and
    listen on it (only a listening socket blocks a reusing bind). Not inherited by children.

    Args:
        port: the port to hold; 0 takes a free one from the OS.
        flag: the option that named ``port``, for the error.
        host: the address to bind (all interfaces by default).

    Raises:
        LaunchError: ``port`` is in use on this host.
    """

    def __init__(self, port: int = 0, flag: str = "--master-port", host: str = "") -> None:
        self._sock: socket.socket | None = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind((host, port))
        except OSError as exc:
            self._sock.close()
            raise LaunchError(with_hint(
                f"port {port} ({flag}) is already in use on this host: {exc.strerror}",
                f"pass another port to {flag}, or leave {flag} out (or pass 0) to let the OS pick a "
                f"free one; `ss -ltnp 'sport = :{port}'` shows who holds it",
            )) from None
        self.port: int = self._sock.getsockname()[1]

    def release(self) -> None:
        """Let the port go (idempotent)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None


class JobStore:
    """accord's rendezvous store for one job, and the check-in query the launcher needs."""

    def __init__(self, bind_host: str, port: int, secret: bytes) -> None:
        from accord.store.server import StoreServer  # torch-free

        self._secret = secret
        self._server = StoreServer(host=bind_host, port=port, secret=secret)
        try:
            self._server.start()
        except RendezvousError as exc:
            raise LaunchError(with_hint(
                f"accordrun could not start the rendezvous store on {bind_host}:{port} "
                f"(--store-port): {str(exc).splitlines()[0]}",
                "pass another --store-port, or leave it out to let the OS pick a free port",
            )) from None
        self._conn = None
        self._checked: set[int] = set()

    @property
    def port(self) -> int:
        """The port the store listens on."""
        return self._server.port

    @property
    def refusals(self) -> int:
        """Connections the store refused (a failed handshake: another secret, or not accord)."""
        return int(self._server.refusal_count)

    def connection(self) -> Any:
        """The launcher's own authenticated connection to the store (made once)."""
        from accord.store.connection import StoreConnection

        if self._conn is None:
            self._conn = StoreConnection("127.0.0.1" if self._server.host in ("0.0.0.0", "")
                                         else self._server.host,
                                         self.port, self._secret, timeout=5.0, connect_timeout=5.0)
        return self._conn

    def missing_ranks(self, ranks: Sequence[int]) -> list[int]:
        """The ranks among ``ranks`` that have not set their check-in key yet."""
        self.connection()
        for rank in ranks:
            if rank not in self._checked and self._conn.check([CHECKIN_KEY.format(rank=rank)]):
                self._checked.add(rank)
        return [r for r in ranks if r not in self._checked]

    def close(self) -> None:
        """Stop the store (idempotent)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self._server.close()


def start_store(bind_host: str, port: int, secret: bytes) -> JobStore | None:
    """Start the job's store; None when accord.store.server is not available.

    Raises:
        LaunchError: the port is in use or the address cannot be bound.
    """
    try:
        import accord.store.server  # noqa: F401
    except ImportError:
        return None
    return JobStore(bind_host, port, secret)


class CheckinWatch:
    """Enforces ``--start-timeout``: every rank must check in before the deadline."""

    def __init__(self, store: JobStore, ranks: Sequence[int], timeout: float, interval: float = 0.2) -> None:
        self._store = store
        self._ranks = list(ranks)
        self.deadline = time.monotonic() + timeout
        self.timeout = timeout
        self._interval = interval
        self._next = 0.0
        self.done = False

    def poll(self) -> list[int]:
        """Return the missing ranks once the deadline passed with ranks missing, else []."""
        now = time.monotonic()
        if self.done or now < self._next:
            return []
        self._next = now + self._interval
        missing = self._store.missing_ranks(self._ranks)
        if not missing:
            self.done = True
            return []
        if now >= self.deadline:
            self.done = True
            return missing
        return []
