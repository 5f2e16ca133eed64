"""Slot assignment: which rank runs where, and its local and cross coordinates.

Ranks fill hosts in the order given (host 0's slots first); their local and cross coordinates
follow :mod:`accord.placement` (Horovod's definitions, the rule every worker's init uses too).
Pure: no processes, no network.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from accord.errors import ConfigError, with_hint
from accord.placement import coordinates
from accord.run.spec.hosts import HostSlots

# The most workers (or servers) one job may have: far above any real job (the largest Horovod
# jobs had tens of thousands of ranks), low enough that a mistyped count such as -np 10000000000
# is refused at once instead of filling the memory with slots or starting millions of processes.
MAX_WORKERS = 1 << 20


@dataclass(frozen=True)
class Slot:
    """One worker's place in the job."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    hostname: str
    host_index: int  # index of the host among the hosts that got workers (torchrun's GROUP_RANK)


def assign_slots(hosts: Sequence[HostSlots], num_proc: int) -> list[Slot]:
    """Give ``num_proc`` ranks to ``hosts`` in order; hosts left without ranks are dropped.

    Example: hosts a:2, b:2 and 3 ranks -> rank 0 a/local 0, rank 1 a/local 1, rank 2 b/local 0.

    Raises:
        ConfigError: ``num_proc`` < 1 or above :data:`MAX_WORKERS`, no hosts, or more ranks than slots.
    """
    total = sum(h.slots for h in hosts)
    if num_proc < 1:
        raise ConfigError(with_hint(f"-np must be at least 1, got {num_proc}", "pass -np N with N >= 1"))
    check_count(num_proc, "the number of workers (-np, or the slots of the hosts)")
    if not hosts:
        raise ConfigError(with_hint("no hosts to run on", "pass -H host:slots or --hostfile FILE"))
    if num_proc > total:
        listing = ",".join(f"{h.hostname}:{h.slots}" for h in hosts)
        raise ConfigError(with_hint(
            f"-np {num_proc} is more than the {total} slots available ({listing})",
            f"lower -np to at most {total}, or add slots/hosts (e.g. -H {hosts[0].hostname}:{num_proc})",
        ))
    placed: list[str] = []  # hostname per rank
    for host in hosts:
        take = min(host.slots, num_proc - len(placed))
        placed.extend(host.hostname for _ in range(take))
        if len(placed) == num_proc:
            break
    return slots_on(placed)


def slots_on(hostnames: Sequence[str]) -> list[Slot]:
    """Every rank's slot in a job whose rank r runs on ``hostnames[r]`` (see :mod:`accord.placement`)."""
    names = list(hostnames)
    return [Slot(rank=c.rank, size=c.size, local_rank=c.local_rank, local_size=c.local_size,
                 cross_rank=c.cross_rank, cross_size=c.cross_size, hostname=name, host_index=c.host_index)
            for c, name in zip(coordinates(names), names)]


def hosts_of(slots: Sequence[Slot]) -> list[str]:
    """The distinct host names of a job, in host order."""
    return list(dict.fromkeys(s.hostname for s in slots))


def check_count(count: int, what: str) -> None:
    """Refuse a worker or server count above :data:`MAX_WORKERS` (``what`` names it).

    Raises:
        ConfigError: naming ``what``, the count and the limit, with a HINT.
    """
    if count > MAX_WORKERS:
        raise ConfigError(with_hint(f"{what} is {count}, more than the {MAX_WORKERS} accordrun starts",
                                    "check the count for a typo (a few extra digits?)"))
