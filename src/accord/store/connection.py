"""A torch-free client of accord's rendezvous store (one authenticated connection).

The launcher uses it to wait for ranks to check in; :class:`accord.runtime.store_client.
StoreClient` pools several of them behind torch's ``Store`` interface. One connection serves
one caller at a time (it is not thread-safe); a failed connection is closed and every later call
raises :class:`~accord.errors.RendezvousError`.
"""
from __future__ import annotations

import math
import socket
import time
from typing import Any, Sequence

from accord.errors import RendezvousError, with_hint
from accord.store import wire
from accord.store.opcodes import Op, Status

# Extra seconds the socket waits beyond a blocking request's own timeout, so that the server's
# TIMEOUT answer (which names the missing keys) arrives before the socket gives up.
_SOCKET_SLACK = 10.0


class StoreConnection:
    """One connection to a :class:`~accord.store.server.StoreServer`.

    Args:
        host, port: where the store listens.
        secret: the per-job secret (bytes).
        timeout: default seconds for blocking requests (get, wait, multi_get).
        connect_timeout: seconds to keep retrying the connection (the store may start after
            us); defaults to ``timeout``.
    """

    def __init__(
        self,
        host: str,
        port: int,
        secret: bytes,
        timeout: float = 300.0,
        connect_timeout: float | None = None,
        max_frame: int = wire.DEFAULT_MAX_FRAME,
    ) -> None:
        self.host = host
        self.port = int(port)
        self.timeout = float(timeout)
        within = self.timeout if connect_timeout is None else connect_timeout
        deadline = time.monotonic() + max(within, 0.0)
        while True:
            self._channel = _connect(host, self.port, bytes(secret), deadline - time.monotonic(), max_frame)
            # One round trip now: a wrong secret fails here, and the server (which drops clients
            # that stay silent after connecting) sees us authenticate at once.
            try:
                self.ping()
                return
            except RendezvousError as exc:
                # a reset before our first answer: a flood of new connections pushed ours out
                # of the server's bounded handshake queue (store/handshake.py), or a loaded
                # machine kept us past its handshake timeout; try again
                if not isinstance(exc.__context__, ConnectionResetError) or time.monotonic() >= deadline:
                    raise

    @property
    def closed(self) -> bool:
        """True once closed or broken."""
        return self._channel is None

    def close(self) -> None:
        """Close the connection (idempotent)."""
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def __enter__(self) -> "StoreConnection":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- requests ----------------------------------------------------------------------------

    def ping(self) -> None:
        """Round trip to the server (checks that it is alive and accepts our secret)."""
        self._call(Op.PING)

    def set(self, key: str, value: bytes | str) -> None:
        """Store ``value`` under ``key`` (overwrites)."""
        self._call(Op.SET, key, _as_bytes(value))

    def get(self, key: str, timeout: float | None = None) -> bytes:
        """The value of ``key``, waiting up to ``timeout`` seconds for it to be set."""
        wait = self._timeout(timeout)
        return self._call(Op.GET, key, wait, wait=wait)[0]

    def add(self, key: str, delta: int) -> int:
        """Add ``delta`` to the integer counter ``key`` (0 when missing); return the new value."""
        return self._call(Op.ADD, key, int(delta))[0]

    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes:
        """Set ``key`` to ``desired`` if it holds ``expected`` (torch semantics); return its value."""
        return self._call(Op.COMPARE_SET, key, _as_bytes(expected), _as_bytes(desired))[0]

    def wait(self, keys: Sequence[str], timeout: float | None = None) -> None:
        """Return once every key exists; RendezvousError naming the missing ones on timeout."""
        wait = self._timeout(timeout)
        self._call(Op.WAIT, list(keys), wait, wait=wait)

    def check(self, keys: Sequence[str]) -> bool:
        """True when every key exists (does not wait)."""
        return self._call(Op.CHECK, list(keys))[0]

    def delete(self, key: str) -> bool:
        """Remove ``key``; True when it existed."""
        return self._call(Op.DELETE, key)[0]

    def num_keys(self) -> int:
        """How many keys the store holds."""
        return self._call(Op.NUM_KEYS)[0]

    def multi_get(self, keys: Sequence[str], timeout: float | None = None) -> list[bytes]:
        """Values of several keys, waiting up to ``timeout`` for all of them."""
        wait = self._timeout(timeout)
        return self._call(Op.MULTI_GET, list(keys), wait, wait=wait)[0]

    def multi_set(self, keys: Sequence[str], values: Sequence[bytes | str]) -> None:
        """Set several keys at once."""
        self._call(Op.MULTI_SET, list(keys), [_as_bytes(v) for v in values])

    def append(self, key: str, value: bytes | str) -> None:
        """Append bytes to ``key`` (created when missing)."""
        self._call(Op.APPEND, key, _as_bytes(value))

    # --- plumbing ----------------------------------------------------------------------------

    def _timeout(self, timeout: float | None) -> float:
        value = self.timeout if timeout is None else float(timeout)
        if math.isnan(value):
            raise ValueError(with_hint("a store request's timeout must be a finite number of "
                                       "seconds, got nan", "pass seconds, or a negative number "
                                       "to wait without a deadline"))
        return -1.0 if math.isinf(value) else value

    def _call(self, op: Op, *args: Any, wait: float = 0.0) -> list[Any]:
        channel = self._channel
        if channel is None:
            raise RendezvousError(
                with_hint(
                    f"the connection to the rendezvous store at {self.host}:{self.port} is closed",
                    "create a new connection; an earlier error or close() ended this one",
                )
            )
        try:
            channel.sock.settimeout(None if wait < 0 else wait + max(_SOCKET_SLACK, self.timeout))
            channel.send(wire.encode([int(op), *args]))
            payload = channel.recv()
            if payload is None:
                raise RendezvousError(
                    with_hint(
                        f"the rendezvous store at {self.host}:{self.port} closed the connection "
                        f"during {op.name}",
                        "the store refuses clients with a wrong secret (check ACCORD_JOB_SECRET / "
                        "ACCORD_SECRET_FILE match the launcher's) or it was shut down (did the "
                        "launcher or rank 0 exit?)",
                    )
                )
            response = wire.decode(payload)
        except (OSError, RendezvousError) as exc:
            self.close()
            if isinstance(exc, RendezvousError):
                raise
            raise RendezvousError(
                with_hint(
                    f"{op.name} on the rendezvous store at {self.host}:{self.port} failed: {exc}",
                    "check that the launcher (or rank 0, which hosts the store) is still running "
                    "and reachable from this host",
                )
            ) from None
        status, values = response[0], response[1:]
        if status == Status.OK:
            return values
        if status == Status.TIMEOUT:
            missing = values[0] if values else []
            raise RendezvousError(
                with_hint(
                    f"timed out after {wait:.1f}s waiting for {len(missing)} key(s) in the "
                    f"rendezvous store at {self.host}:{self.port}: {_show(missing)}",
                    "some ranks have not reached this point: check that every rank started and "
                    "is still running (see the launcher's log), or raise the timeout "
                    "(ACCORD_START_TIMEOUT)",
                )
            )
        raise RendezvousError(
            with_hint(
                f"the rendezvous store at {self.host}:{self.port} rejected {op.name}: "
                f"{values[0] if values else 'no reason given'}",
                "this is a bug in the caller or a version mismatch between processes; use the "
                "same accord version everywhere",
            )
        )


_CONNECT_ATTEMPT_S = 1.0


def _connect(host: str, port: int, secret: bytes, within: float, max_frame: int) -> wire.Channel:
    """Connect and handshake, retrying refused connections until ``within`` seconds pass."""
    deadline = time.monotonic() + max(within, 0.0)
    delay = 0.02
    last: Exception | None = None
    while True:
        remaining = deadline - time.monotonic()
        sock = None
        try:
            # A connection not set up within a second is started again rather than left to the
            # system's SYN retries (1 s, 3 s, 7 s): a store whose queue a flood keeps full takes
            # a new connection whenever it frees room, so trying every second gets in sooner.
            sock = socket.create_connection((host, port), timeout=max(min(remaining, _CONNECT_ATTEMPT_S), 0.5))
            sock.settimeout(max(min(remaining, 10.0), 0.5))  # the hellos: the store may be busy
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return wire.client_handshake(sock, secret, max_frame)
        except (OSError, wire.FrameError) as exc:
            if sock is not None:
                sock.close()
            last = exc
        if time.monotonic() + delay > deadline:
            break
        time.sleep(delay)
        delay = min(delay * 2, 0.5)
    raise RendezvousError(
        with_hint(
            f"could not connect to the rendezvous store at {host}:{port} within {within:.1f}s: {last}",
            "check that the store's host (the launcher, or rank 0) is up and that the address and "
            "port (ACCORD_STORE_ADDR/ACCORD_STORE_PORT or MASTER_ADDR/MASTER_PORT) are right and "
            "reachable from this host",
        )
    )


def _as_bytes(value: bytes | str | bytearray) -> bytes:
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)


def _show(keys: Sequence[str], limit: int = 8) -> str:
    shown = ", ".join(repr(k) for k in keys[:limit])
    return shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "")
