"""Choosing between flat and hierarchical allreduce by measuring both on the job's own data.

When the hierarchy was chosen automatically (HOROVOD_HIERARCHICAL_ALLREDUCE unset), whether it
pays depends on the links and on the hosts' spare CPU: on simulated hosts it was 1.2-1.45x flat
at 1 Gbit/s but 0.5x at 10 Gbit/s, where the shared cores, not the links, were the limit. So the
first big allreduces of a job alternate between the two paths, per size class (sizes within a
factor of two), and once :data:`PAIRS` pairs are timed, the ranks add their timings with one
small flat allreduce and every rank keeps the path with the smaller total (the same sums give
the same choice everywhere; the calls happen in the same order on every rank).
"""
from __future__ import annotations

PAIRS = 3
FLAT, HIERARCHICAL = "flat", "hierarchical"


class PathChooser:
    """Alternates the two paths per size class until enough pairs are timed, then keeps one."""

    def __init__(self, pairs: int = PAIRS) -> None:
        self.pairs = pairs
        self.choice: str | None = None
        self._times: dict[int, dict[str, list[float]]] = {}

    def next_path(self, nbytes: int) -> str:
        """The path to time for an allreduce of ``nbytes`` (the choice once made)."""
        if self.choice is not None:
            return self.choice
        times = self._times.setdefault(nbytes.bit_length(), {HIERARCHICAL: [], FLAT: []})
        return HIERARCHICAL if len(times[HIERARCHICAL]) <= len(times[FLAT]) else FLAT

    def record(self, nbytes: int, path: str, seconds: float) -> bool:
        """Note one timing; True when enough pairs are timed for :meth:`decide`."""
        self._times[nbytes.bit_length()][path].append(seconds)
        return self.paired() >= self.pairs

    def paired(self) -> int:
        """Pairs timed so far (one of each path in the same size class)."""
        return sum(min(len(t[HIERARCHICAL]), len(t[FLAT])) for t in self._times.values())

    def totals(self) -> list[float]:
        """[hierarchical seconds, flat seconds] over the paired timings only."""
        sums = [0.0, 0.0]
        for t in self._times.values():
            m = min(len(t[HIERARCHICAL]), len(t[FLAT]))
            sums[0] += sum(t[HIERARCHICAL][:m])
            sums[1] += sum(t[FLAT][:m])
        return sums

    def decide(self, totals: list[float]) -> str:
        """Keep the faster path given every rank's summed ``totals``; returns it."""
        self.choice = HIERARCHICAL if totals[0] < totals[1] else FLAT
        return self.choice
