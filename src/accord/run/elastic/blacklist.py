"""Hosts whose workers failed, kept out of an elastic job for a while (Horovod's blacklist).

Without ``--blacklist-cooldown-range`` a failing host stays out for the rest of the job (as in
Horovod). With ``--blacklist-cooldown-range MIN MAX`` it comes back after Horovod's exponential
backoff: its n-th failure keeps it out MIN * 2**n seconds plus a random jitter of up to MIN,
kept within [MIN, MAX] (range 10 300: 20-30 s, then 40-50 s, 80-90 s, ... up to 300 s), so a host
that keeps failing stays out longer. Pure (the caller passes the clock).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class Blacklist:
    """Failing hosts and until when they are out (``None``: for good)."""

    cooldown_range: tuple[float, float] | None = None
    rng: random.Random = field(default_factory=random.Random)
    _until: dict[str, float | None] = field(default_factory=dict)
    _failures: dict[str, int] = field(default_factory=dict)

    def add(self, host: str, now: float) -> float | None:
        """Blacklist ``host`` from ``now``; return when it may come back (None: never)."""
        count = self._failures.get(host, 0) + 1
        self._failures[host] = count
        if self.cooldown_range is None:
            self._until[host] = None
            return None
        low, high = self.cooldown_range
        delay = max(low, min(high, low * 2 ** count + self.rng.uniform(0.0, 1.0) * low))
        self._until[host] = now + delay
        return now + delay

    def is_blocked(self, host: str, now: float) -> bool:
        """True while ``host`` is blacklisted."""
        if host not in self._until:
            return False
        until = self._until[host]
        return until is None or now < until

    def blocked(self, now: float) -> set[str]:
        """Every host blacklisted at ``now``."""
        return {h for h in self._until if self.is_blocked(h, now)}

    def failures(self, host: str) -> int:
        """How often ``host`` was blacklisted."""
        return self._failures.get(host, 0)
