"""accord's rendezvous store behind torch's ``Store`` interface, so c10d bootstraps through it.

``torch.distributed.init_process_group(backend="gloo", store=StoreClient(...), rank=r,
world_size=n)`` works, as does wrapping it in a ``PrefixStore``. What torch 2.13 calls on a
Python store (checked against it): ``set``, ``get`` (blocking, no timeout argument: this client's
timeout applies), ``wait(keys[, timedelta])``, ``add``, ``compare_set``, ``check``, ``multi_get``,
``multi_set`` and ``append``; ``delete_key`` and ``num_keys`` are only reachable from Python (a
``PrefixStore`` around a Python store cannot forward them in 2.13).

Thread-safe: each call borrows an idle :class:`StoreConnection` from a small pool (opening a new
one when all are busy), so one thread blocked in ``get`` never holds up another. Timeouts and
lost connections raise :class:`~accord.errors.RendezvousError` (a ``RuntimeError``, which is
what torch's own stores raise) with a HINT.
"""
from __future__ import annotations

import contextlib
import threading
from datetime import timedelta
from typing import Iterator, Sequence

import torch.distributed as dist

from accord.store.connection import StoreConnection

# Idle connections kept for reuse; more are opened on demand and closed when returned.
_POOL_SIZE = 4


class StoreClient(dist.Store):
    """A ``torch.distributed.Store`` backed by accord's authenticated store server.

    Args:
        host, port: the store's address.
        secret: the per-job secret (bytes).
        timeout: seconds a blocking request (get, wait, multi_get) may take before
            RendezvousError.
        connect_timeout: seconds to keep trying to reach the store (default ``timeout``).
    """

    def __init__(self, host: str, port: int, secret: bytes, timeout: float = 300.0,
                 connect_timeout: float | None = None) -> None:
        super().__init__()
        self.host = host
        self.port = int(port)
        self._secret = bytes(secret)
        self._timeout_s = float(timeout)
        self._idle: list[StoreConnection] = []
        self._open = 0  # connections this client holds open (idle or in use)
        self._lock = threading.Lock()
        self._closed = False
        self._connect_timeout = connect_timeout
        super().set_timeout(timedelta(seconds=self._timeout_s))
        # Connect now (a new connection pings), so that an unreachable store or a wrong secret
        # fails here, clearly.
        with self._connection():
            pass

    @property
    def connection_count(self) -> int:
        """How many connections to the store this client holds open."""
        with self._lock:
            return self._open

    @contextlib.contextmanager
    def _connection(self) -> Iterator[StoreConnection]:
        with self._lock:
            conn = self._idle.pop() if self._idle else None
        if conn is None:
            conn = StoreConnection(self.host, self.port, self._secret, timeout=self._timeout_s,
                                   connect_timeout=self._connect_timeout)
            with self._lock:
                self._open += 1
        try:
            yield conn
        finally:
            with self._lock:
                keep = not conn.closed and not self._closed and len(self._idle) < _POOL_SIZE
                if keep:
                    self._idle.append(conn)
                else:
                    self._open -= 1
            if not keep:
                conn.close()

    def close(self) -> None:
        """Close every pooled connection (idempotent); calls after this open new ones."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            self._open -= len(idle)
        for conn in idle:
            conn.close()

    # --- torch.distributed.Store interface -----------------------------------------------------

    def set(self, key: str, value: bytes | str) -> None:
        with self._connection() as conn:
            conn.set(key, value)

    def get(self, key: str) -> bytes:
        with self._connection() as conn:
            return conn.get(key)

    def add(self, key: str, value: int) -> int:
        with self._connection() as conn:
            return conn.add(key, value)

    def compare_set(self, key: str, expected_value: bytes | str, desired_value: bytes | str) -> bytes:
        with self._connection() as conn:
            return conn.compare_set(key, expected_value, desired_value)

    def wait(self, keys: Sequence[str], timeout: timedelta | float | None = None) -> None:
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
        with self._connection() as conn:
            conn.wait(list(keys), seconds)

    def check(self, keys: Sequence[str]) -> bool:
        with self._connection() as conn:
            return conn.check(list(keys))

    def delete_key(self, key: str) -> bool:
        with self._connection() as conn:
            return conn.delete(key)

    def num_keys(self) -> int:
        with self._connection() as conn:
            return conn.num_keys()

    def multi_get(self, keys: Sequence[str]) -> list[bytes]:
        with self._connection() as conn:
            return conn.multi_get(list(keys))

    def multi_set(self, keys: Sequence[str], values: Sequence[bytes | str]) -> None:
        with self._connection() as conn:
            conn.multi_set(list(keys), list(values))

    def append(self, key: str, value: bytes | str) -> None:
        with self._connection() as conn:
            conn.append(key, value)

    def clone(self) -> "StoreClient":
        """A new client to the same store (its own connections)."""
        return StoreClient(self.host, self.port, self._secret, self._timeout_s,
                           self._connect_timeout)
