"""An elastic job's start when its discovery script prints fewer slots than ``-np``, or no host
at all: the wait for enough usable slots, up to ``--elastic-timeout`` (horovodrun's
``ElasticDriver.wait_for_available_slots(num_proc)``), and what the launcher says about it.

Pure: :class:`accord.run.elastic.driver.ElasticDriver` feeds it the usable hosts (discovered,
not blacklisted) and the time; it answers the slots to start on, or whether the wait is over.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from accord.errors import with_hint
from accord.run.elastic.config import ElasticConfig
from accord.run.spec.assignment import Slot, assign_slots
from accord.run.spec.hosts import HostSlots


@dataclass(frozen=True)
class StartWait:
    """Waiting, since ``since`` (the driver's clock), for ``elastic.start_np`` usable slots."""

    elastic: ElasticConfig
    since: float

    @property
    def needed(self) -> int:
        """-np: the fewest slots the job starts on."""
        return self.elastic.start_np or 1

    def slots(self, usable: Sequence[HostSlots]) -> list[Slot] | None:
        """The first workers' slots: every usable slot, up to --max-np; None while the usable
        hosts have fewer than -np.

        Example: -np 2, no --max-np, usable ``h1:1`` -> None; ``h1:1,h2:2`` -> 3 slots.
        """
        seen = sum(h.slots for h in usable)
        if seen < self.needed:
            return None
        max_np = self.elastic.max_np
        return assign_slots(usable, seen if max_np is None else min(seen, max_np))

    def expired(self, now: float) -> bool:
        """True once the wait has lasted longer than --elastic-timeout."""
        return now - self.since > self.elastic.elastic_timeout

    def waiting(self, usable: Sequence[HostSlots], discovered: Sequence[HostSlots]) -> str:
        """The one line said when the wait begins."""
        timeout = f"waiting up to --elastic-timeout {self.elastic.elastic_timeout:g}s"
        seen = (f"no host; {timeout} for {_count(self.needed, 'slot')} (-np {self.needed})" if not discovered
                else f"{_count(_slots(usable), 'usable slot')} ({_hosts(discovered)}), fewer than -np "
                     f"{self.needed}; {timeout} for more")
        return (f"elastic: the discovery script printed {seen}, running it every "
                f"{self.elastic.discovery_interval:g}s")

    def starting(self, now: float, slots: Sequence[Slot], discovered: Sequence[HostSlots]) -> str:
        """The line said when the wait ends with enough slots."""
        return (f"elastic: {_count(len(slots), 'worker')} to start after waiting {now - self.since:.1f}s "
                f"for hosts ({_hosts(discovered)})")

    def error(self, usable: Sequence[HostSlots], discovered: Sequence[HostSlots]) -> str:
        """The job's error when the wait expired: the slots needed and seen, and a HINT."""
        return with_hint(
            f"error: timed out after --elastic-timeout {self.elastic.elastic_timeout:g}s waiting for the "
            f"{self.needed} slots the job needs to start (-np {self.needed}); the discovery script printed "
            + (f"{_count(_slots(usable), 'usable slot')}: {_hosts(discovered)}" if discovered else "no host"),
            f"make {self.elastic.discovery_script!r} print hosts with at least {self.needed} slots in all, "
            "lower -np, or raise --elastic-timeout")


def _slots(hosts: Sequence[HostSlots]) -> int:
    return sum(h.slots for h in hosts)


def _hosts(hosts: Sequence[HostSlots]) -> str:
    return ", ".join(f"{h.hostname}:{h.slots}" for h in hosts) or "none"


def _count(n: int, noun: str) -> str:
    """``_count(1, "slot")`` -> "1 slot"; ``_count(2, "slot")`` -> "2 slots"."""
    return f"{n} {noun}{'' if n == 1 else 's'}"
