"""What the frontend layer reads from :mod:`accord.config`, typed, in one place.

Read at each call, not once: a script may change ``ACCORD_MAX_OBJECT_BYTES`` between two
``broadcast_object`` calls, and ``ACCORD_CPU_BACKEND`` answers ``mpi_enabled()`` before init.
"""
from __future__ import annotations

from accord import config


def max_object_bytes() -> int:
    """The largest pickled object ``broadcast_object`` / ``allgather_object`` accept from a
    rank (ACCORD_MAX_OBJECT_BYTES)."""
    return int(config.get("ACCORD_MAX_OBJECT_BYTES"))


def configured_cpu_backend() -> str:
    """ACCORD_CPU_BACKEND in lower case (``auto`` is what the session resolves at init)."""
    return str(config.get("ACCORD_CPU_BACKEND")).lower()
