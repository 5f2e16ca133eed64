"""What a test run must not leave behind: ``accord-*`` entries in the run's temporary directory,
accord's shared-memory segments in /dev/shm, and processes started by the run.

tests/conftest.py gives the whole run a private temporary directory (TMPDIR, inherited by every
child: ranks, launchers, servers, mpirun), marks every child with :data:`MARK` in its
environment, and at the end of the session calls :func:`find` and fails the run on anything
found. The private directory keeps this check exact on a machine where other jobs also create
``accord-*`` entries in /tmp.
"""
from __future__ import annotations

import os
import re
import time

MARK = "PYTEST_ACCORD_RUN_ID"  # not ACCORD_*: helpers that drop ACCORD_ variables keep it
SHM = "/dev/shm"
_SEGMENT = re.compile(r"accord-shm-(\d+)-")


def shm_segments() -> set[str]:
    """Names of accord's segments in /dev/shm now."""
    try:
        return {n for n in os.listdir(SHM) if n.startswith("accord-")}
    except OSError:
        return set()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def marked_processes(run_id: str, ignore_pids: set[int] = frozenset()) -> list[str]:
    """Live processes (not zombies) other than this one and ``ignore_pids`` whose environment
    carries the run's mark."""
    needle = f"{MARK}={run_id}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid() or int(entry) in ignore_pids:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if needle not in fh.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if _alive(int(entry)):
            found.append(f"pid {entry}: {cmd[:160]}")
    return found


def find(tmpdir: str, run_id: str, shm_before: set[str], grace: float = 5.0,
         ignore_pids: set[int] = frozenset()) -> list[str]:
    """Everything the run left: accord-* in ``tmpdir``, new accord segments in /dev/shm whose
    creator has exited, marked processes. Waits up to ``grace`` seconds for things that are
    still going away (a process being reaped, a segment about to be unlinked)."""
    deadline = time.monotonic() + grace
    while True:
        problems = [f"temporary directory entry {os.path.join(tmpdir, n)}"
                    for n in sorted(os.listdir(tmpdir)) if n.startswith("accord-")]
        for name in sorted(shm_segments() - shm_before):
            m = _SEGMENT.match(name)
            if m is None or not _alive(int(m.group(1))):  # a live creator is still setting it up
                problems.append(f"shared-memory segment {SHM}/{name}")
        problems += [f"process {p}" for p in marked_processes(run_id, ignore_pids)]
        if not problems or time.monotonic() >= deadline:
            return problems
        time.sleep(0.5)
