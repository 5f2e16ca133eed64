"""Where a thread of this process is, read from its Python stack (``sys._current_frames()``)
instead of from how long something took. A thread blocked on a condition shows threading's
``Condition.wait`` as its innermost frame however loaded the machine is, so tests can wait
for "the other thread is now blocked there" before they act, and assert on it."""
from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, Callable

_THREADING = os.path.basename(threading.__file__)


def stack(thread: threading.Thread) -> list[tuple[str, str]]:
    """(file name, function) of ``thread``'s Python frames, innermost first ([] once it ended)."""
    frame = sys._current_frames().get(thread.ident)
    out = []
    while frame is not None:
        out.append((os.path.basename(frame.f_code.co_filename), frame.f_code.co_name))
        frame = frame.f_back
    return out


def blocked_on(thread: threading.Thread, cond: Any) -> bool:
    """True when ``thread`` is blocked in ``cond.wait()`` (``cond``: a threading.Condition)."""
    frame = sys._current_frames().get(thread.ident)
    return (frame is not None and os.path.basename(frame.f_code.co_filename) == _THREADING
            and frame.f_code.co_name == "wait" and frame.f_locals.get("self") is cond)


def waiting_in(function: str, threads: list[threading.Thread] | None = None) -> bool:
    """True when one of ``threads`` (default: every thread) is blocked in threading's
    ``wait`` (a Condition's or an Event's) called, at any depth, from ``function``."""
    for t in threads if threads is not None else threading.enumerate():
        s = stack(t)
        if s and s[0] == (_THREADING, "wait") and any(name == function for _, name in s[1:]):
            return True
    return False


def wait_until(predicate: Callable[[], bool], timeout: float = 30.0, interval: float = 0.005) -> bool:
    """Poll ``predicate`` until it holds or ``timeout`` seconds pass; return whether it held.
    The timeout only bounds a wait for something that never comes: keep it generous."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True
