"""Choosing between flat and hierarchical allreduce by measuring both on the job's own data.

When the hierarchy was chosen automatically (HOROVOD_HIERARCHICAL_ALLREDUCE unset), whether it
pays depends on the links and on the hosts' spare CPU: on simulated hosts it was 1.2-1.45x flat
at 1 Gbit/s but 0.5x at 10 Gbit/s, where the shared cores, not the links, were the limit. So the
first big allreduces of a job alternate between the two paths and every rank keeps the faster:

- the first call of each path (:data:`WARMUP`) is not counted: it pays one-time costs (the
  host's shared memory and the cross-host connections are set up on first use);
- after that, calls alternate per size class (sizes within a factor of two) until
  :data:`PAIRS` pairs are timed; a job's first steps often fuse different amounts, so each call
  counts as its time per byte, and each path's figure is the median over its paired calls (one
  slow call, a page fault storm or a busy core, does not decide);
- the ranks add their medians with one small flat allreduce and keep the path with the smaller
  sum (the same sums give the same choice everywhere; the calls happen in the same order on
  every rank).
"""
from __future__ import annotations

import statistics

PAIRS = 3
WARMUP = 1
FLAT, HIERARCHICAL = "flat", "hierarchical"
_MIB = 1024 * 1024


class PathChooser:
    """Alternates the two paths per size class until enough pairs are timed, then keeps one."""

    def __init__(self, pairs: int = PAIRS, warmup: int = WARMUP) -> None:
        self.pairs, self.warmup = pairs, warmup
        self.choice: str | None = None
        self._times: dict[int, dict[str, list[tuple[int, float]]]] = {}
        self._log: list[tuple[str, int, float]] = []

    def next_path(self, nbytes: int) -> str:
        """The path to time for an allreduce of ``nbytes`` (the choice once made)."""
        if self.choice is not None:
            return self.choice
        for path in (HIERARCHICAL, FLAT):
            if self._count(path) < self.warmup:
                return path
        times = self._times.setdefault(nbytes.bit_length(), {HIERARCHICAL: [], FLAT: []})
        return HIERARCHICAL if len(times[HIERARCHICAL]) <= len(times[FLAT]) else FLAT

    def record(self, nbytes: int, path: str, seconds: float) -> bool:
        """Note one timing; True when enough pairs are timed for :meth:`decide`."""
        self._log.append((path, nbytes, seconds))
        if self._count(path) > self.warmup:
            self._times.setdefault(nbytes.bit_length(), {HIERARCHICAL: [], FLAT: []})[path].append(
                (nbytes, seconds))
        return self.paired() >= self.pairs

    def _count(self, path: str) -> int:
        return sum(1 for logged, _, _ in self._log if logged == path)

    def paired(self) -> int:
        """Pairs timed so far (one of each path in the same size class, after the warm-up)."""
        return sum(min(len(t[HIERARCHICAL]), len(t[FLAT])) for t in self._times.values())

    def rates(self) -> list[float]:
        """[hierarchical, flat]: each path's median seconds per MiB over the paired calls."""
        per_byte: dict[str, list[float]] = {HIERARCHICAL: [], FLAT: []}
        for t in self._times.values():
            m = min(len(t[HIERARCHICAL]), len(t[FLAT]))
            for path, calls in per_byte.items():
                calls += [seconds / max(1, nbytes) for nbytes, seconds in t[path][:m]]
        return [statistics.median(per_byte[p]) * _MIB if per_byte[p] else 0.0 for p in (HIERARCHICAL, FLAT)]

    def timings_ms(self) -> list[tuple[str, float, float]]:
        """Every timed call so far: (path, MiB, milliseconds), warm-up included (for reports)."""
        return [(path, round(n / _MIB, 2), round(s * 1e3, 1)) for path, n, s in self._log]

    def decide(self, rates: list[float]) -> str:
        """Keep the faster path given every rank's summed :meth:`rates`; returns it."""
        self.choice = HIERARCHICAL if rates[0] < rates[1] else FLAT
        return self.choice
