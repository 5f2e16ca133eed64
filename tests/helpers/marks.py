"""Happenings shared between the ranks of a test as empty files in a folder the test gives them:
one rank marks "I got here", another waits for that mark. Tests order events with these
instead of sleeping and assuming a peer is done by then, or comparing durations."""
from __future__ import annotations

import os

from helpers.stacks import wait_until


def mark(folder: str, name: str) -> None:
    """Record ``name`` as happened."""
    open(os.path.join(folder, name), "w").close()


def marked(folder: str, name: str) -> bool:
    """Whether ``name`` has happened."""
    return os.path.exists(os.path.join(folder, name))


def wait_marked(folder: str, *names: str, timeout: float = 30.0) -> bool:
    """Wait until every one of ``names`` has happened; False if ``timeout`` seconds pass first.
    A caller asserts on (or returns) the result: a mark that never comes fails the test, it
    does not hang it. The timeout only bounds waiting for a mark that never comes."""
    return wait_until(lambda: all(marked(folder, n) for n in names), timeout, 0.01)
