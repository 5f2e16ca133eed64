"""Process-wide memory tuning for parameter-server processes (glibc's malloc)."""
from __future__ import annotations

import ctypes

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters


def retain_freed_memory(keep_bytes: int = 256 << 20) -> bool:
    """Make glibc keep freed blocks (up to ``keep_bytes``) for reuse; False without glibc.

    zmq allocates each received message (a few MB) and frees it once merged; by default glibc
    unmaps or trims such blocks, so every message page-faults in again (~10k faults, 10-15 ms of
    CPU per server per 100 MB round here). Process wide: for parameter-server processes only.
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError):
        return False
    # 32 MiB is glibc's largest mmap threshold on 64-bit: smaller blocks come from the heap.
    return bool(mallopt(_M_MMAP_THRESHOLD, 32 << 20)) and bool(mallopt(_M_TRIM_THRESHOLD, keep_bytes))
