"""The rendezvous store's key-value table: ``str -> bytes`` pairs and the operations on them.

:class:`KeyTable` is what :class:`~accord.store.server.StoreServer` serves; it knows nothing of
sockets. Each operation takes a request's arguments as decoded from the wire and returns the
response values (``[Status.OK, ...]``); arguments of the wrong type raise ``TypeError`` or
``ValueError``, which the server answers as a malformed request. Counters made by ``add`` are
stored as ASCII decimals, like torch's TCPStore, so ``get`` of a counter returns ``b"3"``.
Blocking operations (get, wait, multi_get) wait on one condition until their keys exist, their
timeout passes or the table is closed. Safe to use from many threads.
"""
from __future__ import annotations

import math
import threading
import time
from typing import Any, Callable, Sequence

from accord.store.opcodes import Op, Status

__all__ = ["KeyTable"]

_INT64 = (-(1 << 63), (1 << 63) - 1)


class KeyTable:
    """The store's pairs, one lock and condition around them, and an operation per :class:`Op`."""

    def __init__(self) -> None:
        self._data: dict[str, bytes] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._ops: dict[int, Callable[..., list[Any]]] = {
            Op.PING: lambda: [Status.OK],
            Op.SET: self._set,
            Op.GET: self._get,
            Op.ADD: self._add,
            Op.COMPARE_SET: self._compare_set,
            Op.WAIT: self._wait,
            Op.CHECK: self._check,
            Op.DELETE: self._delete,
            Op.NUM_KEYS: self._num_keys,
            Op.MULTI_GET: self._multi_get,
            Op.MULTI_SET: self._multi_set,
            Op.APPEND: self._append,
        }

    def handler(self, op: Any) -> Callable[..., list[Any]] | None:
        """The operation for request code ``op``, or None when ``op`` is not one."""
        return self._ops.get(op) if isinstance(op, int) else None

    def has_keys(self, keys: Sequence[str]) -> bool:
        """True when every key exists."""
        with self._cond:
            return all(k in self._data for k in keys)

    def close(self) -> None:
        """Wake every blocked operation (it answers that the store is shutting down); later
        blocking operations return at once."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # --- operations (each returns the response values) ----------------------------------------

    def _wait_for(self, keys: Sequence[str], timeout: Any) -> list[str]:
        """Block until every key exists; return those still missing at the deadline."""
        timeout = _timeout(timeout)
        deadline = None if timeout < 0 else time.monotonic() + timeout
        with self._cond:
            while True:
                missing = [k for k in keys if k not in self._data]
                if not missing or self._closed:
                    return missing
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return missing
                self._cond.wait(remaining)

    def _blocking_result(self, keys: Sequence[str], timeout: Any) -> list[Any] | None:
        missing = self._wait_for(keys, timeout)
        if not missing:
            return None
        if self._closed:
            return [Status.ERROR, "the store is shutting down"]
        return [Status.TIMEOUT, missing]

    def _set(self, key: str, value: bytes) -> list[Any]:
        with self._cond:
            self._data[_key(key)] = _value(value)
            self._cond.notify_all()
        return [Status.OK]

    def _get(self, key: str, timeout: float) -> list[Any]:
        failed = self._blocking_result([_key(key)], timeout)
        if failed:
            return failed
        with self._cond:
            return [Status.OK, self._data[key]]

    def _add(self, key: str, delta: int) -> list[Any]:
        if isinstance(delta, bool) or not isinstance(delta, int):
            raise TypeError(f"add takes an integer, got {type(delta).__name__}")
        with self._cond:
            current = self._data.get(_key(key), b"0")
            try:
                value = int(current) + delta
            except ValueError:
                return [Status.ERROR, f"key {key!r} holds {current[:32]!r}, not a counter"]
            if not _INT64[0] <= value <= _INT64[1]:  # counters are 64-bit, as torch's TCPStore
                return [Status.ERROR, f"adding {delta} to counter {key!r} ({int(current)}) "
                        "leaves the 64-bit range"]
            self._data[key] = str(value).encode()
            self._cond.notify_all()
        return [Status.OK, value]

    def _compare_set(self, key: str, expected: bytes, desired: bytes) -> list[Any]:
        # torch's TCPStore semantics: a missing key is created only when expected is empty.
        with self._cond:
            current = self._data.get(_key(key))
            if current is None:
                if _value(expected) == b"":
                    self._data[key] = _value(desired)
                    self._cond.notify_all()
                    return [Status.OK, desired]
                return [Status.OK, expected]
            if current == expected:
                self._data[key] = _value(desired)
                self._cond.notify_all()
            return [Status.OK, self._data[key]]

    def _wait(self, keys: list[str], timeout: float) -> list[Any]:
        return self._blocking_result([_key(k) for k in keys], timeout) or [Status.OK]

    def _check(self, keys: list[str]) -> list[Any]:
        with self._cond:
            return [Status.OK, all(_key(k) in self._data for k in keys)]

    def _delete(self, key: str) -> list[Any]:
        with self._cond:
            return [Status.OK, self._data.pop(_key(key), None) is not None]

    def _num_keys(self) -> list[Any]:
        with self._cond:
            return [Status.OK, len(self._data)]

    def _multi_get(self, keys: list[str], timeout: float) -> list[Any]:
        failed = self._blocking_result([_key(k) for k in keys], timeout)
        if failed:
            return failed
        with self._cond:
            return [Status.OK, [self._data[k] for k in keys]]

    def _multi_set(self, keys: list[str], values: list[bytes]) -> list[Any]:
        if len(keys) != len(values):
            raise ValueError(f"multi_set got {len(keys)} keys and {len(values)} values")
        with self._cond:
            for k, v in zip(keys, values):
                self._data[_key(k)] = _value(v)
            self._cond.notify_all()
        return [Status.OK]

    def _append(self, key: str, value: bytes) -> list[Any]:
        with self._cond:
            self._data[_key(key)] = self._data.get(key, b"") + _value(value)
            self._cond.notify_all()
        return [Status.OK]


def _timeout(value: Any) -> float:
    """A request's timeout in seconds: a finite number; negative waits forever."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"a timeout is a number of seconds, got {type(value).__name__}")
    if not math.isfinite(value):
        raise ValueError(f"a timeout must be a finite number of seconds, got {value!r} "
                         "(a negative one waits forever)")
    return -1.0 if value < 0 else min(float(value), threading.TIMEOUT_MAX / 2)


def _key(key: Any) -> str:
    if not isinstance(key, str):
        raise TypeError(f"store keys are strings, got {type(key).__name__}")
    return key


def _value(value: Any) -> bytes:
    if not isinstance(value, bytes):
        raise TypeError(f"store values are bytes, got {type(value).__name__}")
    return value
