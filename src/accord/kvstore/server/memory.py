"""Process-wide resource tuning for parameter-server processes: glibc's malloc, and the
open-file limit."""
from __future__ import annotations

import ctypes

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters


def retain_freed_memory(keep_bytes: int = 256 << 20) -> bool:
    """Make glibc keep freed blocks (up to ``keep_bytes``) for reuse; False without glibc.

    Each received payload (a few MB) is allocated and freed once merged; by default glibc
    unmaps or trims such blocks, so every message page-faults in again (~10k faults, 10-15 ms of
    CPU per server per 100 MB round here). Process wide: for parameter-server processes only.
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError):
        return False
    # 32 MiB is glibc's largest mmap threshold on 64-bit: smaller blocks come from the heap.
    return bool(mallopt(_M_MMAP_THRESHOLD, 32 << 20)) and bool(mallopt(_M_TRIM_THRESHOLD, keep_bytes))


def raise_open_file_limit(ceiling: int = 1 << 20) -> int:
    """Raise this process's soft limit on open files to its hard limit (at most ``ceiling``);
    returns the soft limit now in force.

    The server sizes its limits on connections from this limit
    (:func:`accord.kvstore.server.admission.descriptor_budget`): a higher one leaves room for
    more workers. Process wide: for parameter-server processes only.
    """
    try:
        import resource
    except ImportError:  # not a POSIX system
        return -1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = ceiling if hard == resource.RLIM_INFINITY else min(hard, ceiling)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        except (ValueError, OSError):  # the system's own ceiling (nr_open) is lower: keep ours
            return soft
        return wanted
    return soft
