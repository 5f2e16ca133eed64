"""What a thread of another process is doing, read from /proc instead of timed: whether it is
asleep in the kernel (state S, a wait channel such as futex_wait_queue) and how often it went
to sleep (its voluntary context switches, one per wait it entered). A thread that spins is
never found asleep; one that polls goes to sleep far more often than its waits' timeouts ask.
Neither reading changes on a busy machine, unlike a CPU share."""
from __future__ import annotations

import os
import time

from helpers.stacks import wait_until


def thread_state(tid: int, pid: int | None = None) -> tuple[str, str]:
    """(state letter, wait channel) of thread ``tid`` of process ``pid`` (default: this one)."""
    base = f"/proc/{pid or os.getpid()}/task/{tid}"
    with open(f"{base}/stat") as fh:
        state = fh.read().rsplit(")", 1)[1].split()[0]
    try:
        with open(f"{base}/wchan") as fh:
            wchan = fh.read().strip()
    except OSError:
        wchan = ""
    return state, wchan


def voluntary_switches(tid: int, pid: int | None = None) -> int:
    """How many times thread ``tid`` gave up the CPU to wait (its voluntary context switches)."""
    with open(f"/proc/{pid or os.getpid()}/task/{tid}/status") as fh:
        for line in fh:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    raise AssertionError(f"no voluntary_ctxt_switches for thread {tid}")


def watch_sleeper(tid: int, pid: int | None = None, seconds: float = 1.0, find_asleep: float = 30.0) -> dict:
    """Watch thread ``tid``, which must be waiting all along, for ``seconds``: how often it
    went to sleep meanwhile (``sleeps``), and whether it was found asleep in a futex (polled
    for up to ``find_asleep`` seconds: a thread that waits is found at once).
    ``seconds`` is the measured window (on a loaded machine, longer than asked)."""
    start, before = time.monotonic(), voluntary_switches(tid, pid)
    time.sleep(seconds)
    sleeps, elapsed = voluntary_switches(tid, pid) - before, time.monotonic() - start
    seen: list[tuple[str, str]] = []

    def asleep_in_futex() -> bool:
        seen.append(thread_state(tid, pid))
        return seen[-1][0] == "S" and "futex" in seen[-1][1]

    found = wait_until(asleep_in_futex, find_asleep, 0.01)
    return {"seconds": elapsed, "sleeps": sleeps, "asleep_in_futex": found, "states": seen[-5:]}
