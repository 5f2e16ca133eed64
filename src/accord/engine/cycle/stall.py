"""Stall inspector: notice names that some ranks submitted and others never did.

A rank whose oldest pending request has waited ``check_time`` seconds asks for a full exchange
(at most once per ``check_time``); the exchange tells every rank who holds which name and for
how long (:class:`~accord.engine.negotiation.negotiate.Partial`). Every rank then logs, on logger
``accord.engine``, which ranks are missing which names. If ``shutdown_time`` > 0 and a name has
waited that long, :meth:`StallInspector.review` returns a :class:`StallError` and the engine
stops on every rank (the decision uses only exchanged ages, so every rank makes it together).
The engine's default shutdown time is 30 minutes (ACCORD_STALL_SHUTDOWN_TIME_SECONDS, see
accord.config); 0 waits forever, as Horovod does by default.
"""
from __future__ import annotations

import logging
from typing import Sequence

from accord.engine.negotiation.negotiate import Partial
from accord.errors import StallError, with_hint

log = logging.getLogger("accord.engine")


class StallInspector:
    """Decides when to look for stalls, logs them, and says when to shut down."""

    def __init__(self, check_time: float, shutdown_time: float = 0.0, disabled: bool = False) -> None:
        self.check_time = max(float(check_time), 0.0)
        self.shutdown_time = max(float(shutdown_time), 0.0)
        self.disabled = disabled or self.check_time <= 0
        self._next_check = 0.0
        self._logged: dict[str, float] = {}  # name -> when it was last warned about

    def due(self, now: float, oldest_submitted: float | None) -> bool:
        """True when this rank should ask for a full exchange to look for stalls."""
        if self.disabled or oldest_submitted is None or now < self._next_check:
            return False
        age = now - oldest_submitted
        if age < self.check_time and not (self.shutdown_time and age >= self.shutdown_time):
            return False
        step = self.check_time
        if self.shutdown_time and age < self.shutdown_time:
            step = min(step, self.shutdown_time - age)  # look again right when shutdown is due
        self._next_check = now + max(step, 0.05)
        return True

    def review(self, partial: Sequence[Partial], now: float) -> StallError | None:
        """Log stalled names (rate-limited per name); return the error to stop with, if any."""
        if self.disabled:
            return None
        stalled = [p for p in partial if p.age >= self.check_time]
        current = {p.name for p in stalled}
        self._logged = {n: t for n, t in self._logged.items() if n in current}  # drop resolved ones
        fresh = [p for p in stalled if now - self._logged.get(p.name, -1e18) >= self.check_time]
        if fresh:
            for p in fresh:
                self._logged[p.name] = now
            log.warning(with_hint(
                "Stall: some ranks have waited more than %.1f s on names other ranks have not "
                "submitted:\n%s" % (self.check_time, describe(fresh)),
                "a rank skipped or reordered a collective (a branch that depends on the rank or "
                "on data, or a tensor without gradient); make every rank submit the same names. "
                "ACCORD_STALL_CHECK_TIME_SECONDS changes this delay; "
                + ("the job stops with a StallError once a name has waited %g s "
                   "(ACCORD_STALL_SHUTDOWN_TIME_SECONDS, 0: never)" % self.shutdown_time
                   if self.shutdown_time else
                   "ACCORD_STALL_SHUTDOWN_TIME_SECONDS=0 lets the job wait forever: set it to "
                   "a number of seconds to stop it with a StallError")))
        if self.shutdown_time:
            doomed = [p for p in stalled if p.age >= self.shutdown_time]
            if doomed:
                return StallError(with_hint(
                    "Stall shutdown: names waited more than %.1f s for ranks that never submitted "
                    "them:\n%s" % (self.shutdown_time, describe(doomed)),
                    "every rank must submit the same collectives; the ranks listed as missing "
                    "took another path. Raise ACCORD_STALL_SHUTDOWN_TIME_SECONDS (0 = never) if "
                    "they are only slow"))
        return None


def describe(partial: Sequence[Partial]) -> str:
    """One line per stalled name: who has it, who is missing, for how long."""
    lines = []
    for p in sorted(partial, key=lambda p: p.name):
        missing = ", ".join(map(str, p.missing))
        present = ", ".join(map(str, p.present))
        lines.append(f"  {p.name!r}: submitted by ranks [{present}] ({p.age:.1f} s), "
                     f"missing on ranks [{missing}]")
    return "\n".join(lines)
