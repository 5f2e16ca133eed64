"""What an elastic job may use: Ray's live nodes and their worker slots, less the nodes whose
workers failed (blacklisted, as horovodrun blacklists a host).

A node's slots come from its total resources, as horovod.ray counts them: ``CPU //
cpus_per_worker``, and with GPUs at most ``GPU // gpus_per_worker``. Nodes keep the order in
which the job first saw them, so the oldest workers keep the lowest ranks.

Without ``cooldown_range`` a blacklisted node stays out for the rest of the job; with
``(MIN, MAX)`` its n-th failure keeps it out ``MIN * 2**n`` seconds plus up to ``MIN`` of
jitter, within ``[MIN, MAX]`` (Horovod's backoff, as accordrun's ``--blacklist-cooldown-range``).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Node:
    """A live Ray node: its id, its address (the host name accord sees) and its slots."""

    node_id: str
    ip: str
    slots: int


def slots_of(resources: dict[str, float], cpus_per_worker: float, gpus_per_worker: float) -> int:
    """How many workers a node's resources hold (0 when not one)."""
    counts = []
    if cpus_per_worker:
        counts.append(int(resources.get("CPU", 0) // cpus_per_worker))
    if gpus_per_worker:
        counts.append(int(resources.get("GPU", 0) // gpus_per_worker))
    return min(counts) if counts else 0


@dataclass
class Nodes:
    """The job's view of Ray's nodes (see the module docstring)."""

    cpus_per_worker: float
    gpus_per_worker: float
    cooldown_range: tuple[float, float] | None = None
    rng: random.Random = field(default_factory=random.Random)
    order: list[str] = field(default_factory=list)  # node ids, first seen first
    _until: dict[str, float | None] = field(default_factory=dict)
    _failures: dict[str, int] = field(default_factory=dict)

    def live(self, ray: Any) -> list[Node]:
        """Ray's live nodes with at least one slot, in the job's order."""
        found = {}
        for n in ray.nodes():
            if not n.get("Alive"):
                continue
            slots = slots_of(n.get("Resources", {}), self.cpus_per_worker, self.gpus_per_worker)
            if slots > 0:
                found[n["NodeID"]] = Node(n["NodeID"], n["NodeManagerAddress"], slots)
        for node_id in found:
            if node_id not in self.order:
                self.order.append(node_id)
        return [found[i] for i in self.order if i in found]

    def usable(self, ray: Any, now: float) -> list[Node]:
        """The live nodes that are not blacklisted."""
        return [n for n in self.live(ray) if not self.blocked(n.node_id, now)]

    def blacklist(self, node_id: str, now: float) -> float | None:
        """Keep ``node_id`` out from ``now``; return until when (None: for good)."""
        count = self._failures.get(node_id, 0) + 1
        self._failures[node_id] = count
        if self.cooldown_range is None:
            self._until[node_id] = None
            return None
        low, high = self.cooldown_range
        until = now + max(low, min(high, low * 2 ** count + self.rng.uniform(0.0, 1.0) * low))
        self._until[node_id] = until
        return until

    def blocked(self, node_id: str, now: float) -> bool:
        """True while ``node_id`` is blacklisted."""
        if node_id not in self._until:
            return False
        until = self._until[node_id]
        return until is None or now < until
