"""How ranks of one shared-memory communicator wait for each other without burning a core.

:class:`FutexBarrier` is a counting barrier on one 32-bit word of the shared segment. Arriving
is a single ``futex(FUTEX_WAKE_OP)`` system call: the kernel adds 1 to the word atomically and
wakes every rank sleeping on it (Python has no atomic instructions; the kernel has). Waiting is a
short spin on the word (a rank that arrives a few microseconds late costs no system call), then
``futex(FUTEX_WAIT)`` in slices of :data:`_SLICE_S`, between which the waiter checks whether a
peer aborted the communicator, whether a peer process has died (pid and start time from
``/proc``, so a recycled pid is not mistaken for the peer) and whether
ACCORD_COLLECTIVE_TIMEOUT has passed. The word only grows (modulo 2**32): barrier ``s`` is
complete once it reaches ``s * size``, so it never needs resetting and a fast rank may arrive at
the next barrier before a slow one has seen this one complete.

:class:`GlooBarrier` (a barrier on a Gloo group) is the fallback where futexes are not
available (not Linux, or an architecture whose syscall number we do not know).

Failures raise :class:`PeerLostError`; the communicator base turns it into
:class:`~accord.errors.RankFailedError` (its message says "peer" and "timed out").
"""
from __future__ import annotations

import ctypes
import errno
import platform
import sys
import time
from typing import Any, Sequence

from accord.comm.shm.segment import Layout
from accord.errors import not_answering

_SYS_FUTEX = {"x86_64": 202, "amd64": 202, "i386": 240, "i686": 240, "armv7l": 240,
              "aarch64": 98, "arm64": 98, "riscv64": 98, "ppc64le": 221, "ppc64": 221, "s390x": 238}
_FUTEX_WAIT, _FUTEX_WAKE, _FUTEX_WAKE_OP = 0, 1, 5  # shared (not PRIVATE): the word is in a shared mapping
_OP_ADD_ONE = (1 << 28) | (1 << 12)  # FUTEX_OP(FUTEX_OP_ADD, 1, FUTEX_OP_CMP_EQ, 0)
_OP_ADD_ZERO = 1 << 28  # the same, adding 0: a full memory barrier and nothing else
_WAKE_ALL = 0x7FFFFFFF
_MASK = 0xFFFFFFFF
_SLICE_S = 0.2  # longest sleep between checks for aborts, dead peers and the deadline
# x86 keeps loads in order, so seeing the counter complete means seeing the data written before
# it. Weaker architectures need a fence after that plain load; a futex op provides one.
_LOADS_ORDERED = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


class PeerLostError(RuntimeError):
    """A peer died, aborted or did not arrive in time (the base maps it to RankFailedError)."""


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Futex:
    """libc's ``syscall(SYS_futex, ...)`` through ctypes."""

    def __init__(self, number: int) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self._call = libc.syscall
        self._call.restype = ctypes.c_long
        self._call.argtypes = [ctypes.c_long] * 7
        self._number = number

    def add_one_and_wake(self, addr: int) -> None:
        """Atomically ``*addr += 1``, then wake every waiter on ``addr``."""
        if self._call(self._number, addr, _FUTEX_WAKE_OP, _WAKE_ALL, 0, addr, _OP_ADD_ONE) < 0:
            raise OSError(ctypes.get_errno(), "futex(FUTEX_WAKE_OP) failed")

    def fence(self, addr: int) -> None:
        """A full memory barrier (an atomic add of 0 done by the kernel)."""
        self._call(self._number, addr, _FUTEX_WAKE_OP, 0, 0, addr, _OP_ADD_ZERO)

    def wake(self, addr: int) -> None:
        self._call(self._number, addr, _FUTEX_WAKE, _WAKE_ALL, 0, 0, 0)

    def wait(self, addr: int, expected: int, seconds: float) -> None:
        """Sleep while ``*addr == expected``, at most ``seconds`` (spurious returns are fine)."""
        whole = int(seconds)
        timeout = _Timespec(whole, int((seconds - whole) * 1e9))  # per call: threads share this object
        if self._call(self._number, addr, _FUTEX_WAIT, expected, ctypes.addressof(timeout), 0, 0) < 0:
            err = ctypes.get_errno()
            if err not in (errno.EAGAIN, errno.ETIMEDOUT, errno.EINTR):
                raise OSError(err, "futex(FUTEX_WAIT) failed")


_FUTEX: _Futex | None = None
_FUTEX_CHECKED = False


def futex() -> _Futex | None:
    """The futex system call if this platform has a working one (checked once), else None."""
    global _FUTEX, _FUTEX_CHECKED
    if not _FUTEX_CHECKED:
        _FUTEX_CHECKED = True
        number = _SYS_FUTEX.get(platform.machine().lower())
        if sys.platform.startswith("linux") and number is not None:
            try:
                candidate = _Futex(number)
                word = ctypes.c_uint32(7)
                candidate.add_one_and_wake(ctypes.addressof(word))
                candidate.wait(ctypes.addressof(word), 7, 0.001)  # value differs: returns at once
                if word.value == 8:
                    _FUTEX = candidate
            except (OSError, AttributeError):
                _FUTEX = None
    return _FUTEX


def process_start_time(pid: int) -> int:
    """Start time of ``pid`` in clock ticks since boot (``/proc/<pid>/stat`` field 22); 0 if unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return 0
    if fields[0] in (b"Z", b"X"):  # a zombie has exited; it is only waiting to be reaped
        return 0
    return int(fields[19])


class PeerWatch:
    """Tells whether peer processes still exist (same host, same pid namespace)."""

    def __init__(self, peers: Sequence[tuple[int, int, int]]) -> None:
        """``peers``: (global rank, pid, start time) of every other member."""
        self._peers = [p for p in peers if p[2]]
        # A peer we cannot see under its own pid lives in another pid namespace: do not judge it.
        if any(process_start_time(pid) != start for _, pid, start in self._peers):
            self._peers = []

    def dead(self) -> list[tuple[int, int]]:
        """(global rank, pid) of peers whose process has exited."""
        return [(rank, pid) for rank, pid, start in self._peers if process_start_time(pid) != start]


class FutexBarrier:
    """A barrier among ``size`` processes on words of a shared buffer (see the module doc)."""

    def __init__(self, buffer: Any, counter_offset: int, abort_offset: int, size: int,
                 ranks: Sequence[int], rank: int, timeout_s: float, spin_s: float, watch: PeerWatch) -> None:
        impl = futex()
        if impl is None:
            raise RuntimeError("futex is not available on this platform")
        self._futex = impl
        self._counter = ctypes.c_uint32.from_buffer(buffer, counter_offset)
        self._abort = ctypes.c_uint32.from_buffer(buffer, abort_offset)
        # Each rank's word of arrivals: the target of the last barrier it arrived at, which is
        # how a rank that times out names the peers that did not arrive. It sits in the rank's
        # own record of the segment, after its two op descriptors (bytes the layout leaves free).
        layout = Layout(size, 1)
        self._arrived_at = [layout.meta(1, i) + (layout.meta(1, i) - layout.meta(0, i)) for i in range(size)]
        assert all(at + 4 <= layout.record(i + 1) for i, at in enumerate(self._arrived_at))
        self._arrivals = [ctypes.c_uint32.from_buffer(buffer, at) for at in self._arrived_at]
        self._arrival = self._arrivals[rank]
        self._counter_addr = ctypes.addressof(self._counter)
        self._abort_addr = ctypes.addressof(self._abort)
        self._size = size
        self._ranks = tuple(ranks)
        self._rank = rank
        # Not the counter's current value: a faster peer may already have arrived at barrier 1.
        self._target = 0
        self.timeout_s = timeout_s
        self.spin_s = spin_s
        self._watch = watch

    def close(self) -> None:
        """Drop the views of the shared buffer (the buffer can only be unmapped after this)."""
        self._counter = self._abort = self._arrival = None
        self._arrivals = []

    def abort(self) -> None:
        """Make every rank waiting on this barrier (now or later) raise PeerLostError."""
        if self._abort is not None and not self._abort.value:
            self._abort.value = self._rank + 1
            self._futex.wake(self._counter_addr)

    def wait(self) -> None:
        """Arrive, then return once every rank has arrived.

        Raises:
            PeerLostError: a peer aborted, its process exited, or ACCORD_COLLECTIVE_TIMEOUT passed.
        """
        target = self._target = (self._target + self._size) & _MASK
        counter = self._counter
        self._arrival.value = target  # before the counter: whoever sees this arrival sees the mark
        self._futex.add_one_and_wake(self._counter_addr)
        if ((counter.value - target) & _MASK) < 0x80000000:
            return self._acquire()
        end = time.perf_counter() + self.spin_s
        while time.perf_counter() < end:
            for _ in range(8):
                if ((counter.value - target) & _MASK) < 0x80000000:
                    return self._acquire()
        self._sleep(target)
        return self._acquire()

    def _acquire(self) -> None:
        if not _LOADS_ORDERED:
            self._futex.fence(self._counter_addr)

    def _sleep(self, target: int) -> None:
        counter, start = self._counter, time.monotonic()
        deadline = start + self.timeout_s
        while True:
            seen = counter.value
            if ((seen - target) & _MASK) < 0x80000000:
                return
            if self._abort.value:
                # A peer may have passed this barrier, then closed: re-read the counter first.
                if ((counter.value - target) & _MASK) < 0x80000000:
                    return
                raise PeerLostError(f"peer rank {self._ranks[self._abort.value - 1]} aborted the shm "
                                    f"communicator (it failed or closed) while rank "
                                    f"{self._ranks[self._rank]} waited")
            now = time.monotonic()
            if now - start > _SLICE_S:
                gone = self._watch.dead()
                if gone:
                    self.abort()
                    raise PeerLostError("peer " + ", ".join(f"rank {r} (pid {p})" for r, p in gone)
                                        + f" exited while rank {self._ranks[self._rank]} waited in the shm barrier")
            if now >= deadline:
                missing = [self._ranks[i] for i, word in enumerate(self._arrivals) if word.value != target]
                self.abort()
                raise PeerLostError(
                    f"timed out after {self.timeout_s:g}s (ACCORD_COLLECTIVE_TIMEOUT) in the shm "
                    f"barrier of ranks {list(self._ranks)}: peer {not_answering(missing)} while rank "
                    f"{self._ranks[self._rank]} waited")
            self._futex.wait(self._counter_addr, seen, min(_SLICE_S, deadline - now))


class GlooBarrier:
    """The fallback: a barrier on a private Gloo group of the members (timeout: the group's)."""

    def __init__(self, group: Any) -> None:
        self._group = group

    def wait(self) -> None:
        """Return once every member has arrived."""
        import torch.distributed as dist

        try:
            self._group.barrier(dist.BarrierOptions()).wait()
        except RuntimeError as exc:
            raise PeerLostError(f"peer lost in the gloo barrier of the shm communicator: {exc}") from exc

    def abort(self) -> None:
        """Nothing to do: Gloo's own timeout ends the peers' waits."""

    def close(self) -> None:
        """Release the Gloo group."""
        from accord import group_teardown

        group, self._group = self._group, None
        group_teardown.release_group(group)
