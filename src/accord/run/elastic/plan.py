"""The elastic driver's decisions, pure: which workers to start and which to stop when the set
of usable hosts changes (:func:`plan_changes`), and the place each worker will have in the
re-formed job (:func:`planned_slots`), which a worker added later starts with.

Hosts keep the order in which they first appeared (older hosts first, as Horovod orders them),
so the oldest workers keep the lowest ranks. A host that disappeared, or was blacklisted, loses
all its workers (unless the job keeps those of a blacklisted host: :func:`usable_hosts`); a host
whose slot count dropped loses its newest workers; free slots are filled host by host, in that
order, up to ``--max-np``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from accord.run.spec.assignment import Slot, slots_on
from accord.run.spec.hosts import HostSlots


@dataclass(frozen=True)
class Plan:
    """What to change: ``start`` = one host name per worker to start; ``remove`` = worker ids."""

    start: list[str] = field(default_factory=list)
    remove: list[int] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        """True when nothing changes."""
        return not self.start and not self.remove


def usable_hosts(discovered: Sequence[HostSlots], blocked: set[str],
                 kept: dict[str, int] | None = None) -> list[HostSlots]:
    """The discovered hosts that are not blacklisted, in discovery order; a blacklisted host
    whose running workers the job keeps (``kept``: host -> how many) stays with that many slots,
    so they go on and none is added there.

    Example: ``h1:2,h2:2``, ``h1`` blocked and 1 kept there -> ``h1:1,h2:2``.
    """
    kept = kept or {}
    return [h if h.hostname not in blocked else HostSlots(h.hostname, min(h.slots, kept[h.hostname]))
            for h in discovered if h.hostname not in blocked or kept.get(h.hostname, 0) > 0]


def plan_changes(usable: Sequence[HostSlots], workers: Sequence[tuple[int, str]],
                 max_np: int | None) -> Plan:
    """Decide the workers to stop and to start.

    Args:
        usable: the hosts the job may use now (discovered, not blacklisted), in host order.
        workers: ``(id, host)`` of every running worker that is not already leaving; ids grow
            with start order.
        max_np: the most workers the job may have (None: no limit).

    Example: usable ``h1:2,h2:2``, workers ``[(0, "h1"), (1, "h1")]``, max 3 -> start ``["h2"]``.
    """
    slots = {h.hostname: h.slots for h in usable}
    remove: list[int] = []
    per_host: dict[str, list[int]] = {}
    for wid, host in sorted(workers):
        per_host.setdefault(host, []).append(wid)
    for host, ids in per_host.items():
        keep = slots.get(host, 0)
        remove.extend(ids[keep:])  # the newest beyond the host's slots (all of a gone host's)
    remaining = len(workers) - len(remove)
    room = (max_np - remaining) if max_np is not None else sum(slots.values())
    start: list[str] = []
    for host in usable:
        free = host.slots - min(len(per_host.get(host.hostname, [])), host.slots)
        take = max(0, min(free, room - len(start)))
        start.extend([host.hostname] * take)
    return Plan(start=start, remove=sorted(remove))


def planned_slots(hostnames: Sequence[str]) -> list[Slot]:
    """Every worker's place in a job whose rank r runs on ``hostnames[r]``: its local and cross
    coordinates as ``init()`` derives them from the ranks' host names (:mod:`accord.placement`),
    and the index of its host in the order hosts first appear.

    A re-formed job's ranks need not fill hosts in order (survivors keep their order, the
    workers that join come last), so a host's ranks may be interleaved with another's.

    Example: ``["a", "b", "a"]`` -> rank 2 is local rank 1 of 2 on host "a", cross rank 0 of 1.
    """
    return slots_on(hostnames)
