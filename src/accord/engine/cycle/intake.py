"""The queue between callers and the engine thread, and when a gathering cycle may start.

Callers put requests in; the engine thread takes them out once per cycle. Once something
arrived, the engine keeps gathering while requests keep coming. The cycle starts when a caller
waits on a handle (synchronize, or poll of an unfinished one: that caller submits nothing more
until it returns), when ``start_bytes`` are queued, when none arrived for ``quiet_time``, or
``cycle_time`` after the first. A lone synchronous request so starts at once, and a burst (a
loop of async submissions, gradients from backward) is fused. The defaults per backend are in
:func:`accord.engine.settings.default_cycle_times`.

Every method runs under the engine's condition (the caller holds it, or the method takes it),
which also guards the engine's other shared state.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

from accord.engine.request import Request
from accord.engine.settings import EngineSettings


class Intake:
    """Arrivals not yet taken by the engine thread, and what ends a gathering."""

    def __init__(self, cond: threading.Condition, settings: EngineSettings) -> None:
        self._cond = cond
        self._settings = settings
        self.items: list[Request] = []
        self._bytes = 0
        self._first_arrival = 0.0
        self._waiters = 0  # callers blocked on a handle
        self._hurry = False  # one-shot, from poll()

    def put(self, request: Request, wake: bool = True) -> None:
        """Queue ``request`` (the caller holds the condition); wake the engine when due.
        ``wake=False``: the caller waits on it at once, which wakes the engine if needed."""
        if not self.items:
            self._first_arrival = time.monotonic()
            if wake:
                self._cond.notify()
        self.items.append(request)
        before = self._bytes
        self._bytes += request.nbytes
        if wake and before < self._settings.start_bytes <= self._bytes:
            self._cond.notify()  # enough queued: no reason to wait out the cycle

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """A caller blocks on a handle inside this context: gathering stops meanwhile."""
        with self._cond:
            self._waiters += 1
            self._cond.notify()
        try:
            yield
        finally:
            with self._cond:
                self._waiters -= 1

    def hurry(self) -> None:
        """End the current (or next) gathering now: a caller polls an unfinished handle."""
        with self._cond:
            self._hurry = True
            self._cond.notify()

    def urgent(self) -> bool:
        """Whether a caller waits on a handle or polled one (the caller holds the condition)."""
        return bool(self._waiters or self._hurry)

    def take(self, stopping: Callable[[], bool]) -> list[Request]:
        """Keep gathering while the rules above allow, then return and clear the queue (the
        engine thread holds the condition). ``stopping()`` true ends the gathering too."""
        s = self._settings
        threshold = s.start_bytes
        while (self.items and not stopping() and not self._waiters and not self._hurry
               and not (0 < threshold <= self._bytes)):
            remaining = self._first_arrival + s.cycle_time - time.monotonic()
            if remaining <= 0:
                break
            seen = len(self.items)
            self._cond.wait(min(s.quiet_time, remaining))
            if len(self.items) == seen:
                break
        return self.take_now()

    def take_now(self) -> list[Request]:
        """Return and clear the queue without gathering (the caller holds the condition)."""
        taken, self.items, self._bytes = self.items, [], 0
        self._hurry = False
        return taken
