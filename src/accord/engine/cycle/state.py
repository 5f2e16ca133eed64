"""What the parts of one process set's controller share: the set, its lock, the queues, the stop flags.

A :class:`~accord.engine.cycle.controller.Controller` is built from parts, each holding this one
state object: negotiated cycles (:mod:`accord.engine.cycle.negotiated`), planned cycles
(:mod:`accord.engine.cycle.plan`), a waiting caller that runs one
(:mod:`accord.engine.cycle.caller_runs`) and join (:mod:`accord.engine.cycle.join_control`).
Each part keeps what only it writes as its own attributes; what several parts read is here, and
only the controller assigns these fields. The one thing every part that runs a cycle changes is
the contents of ``pending``, which it may do only on the controller's thread or while the
thread lends its role to a caller (so never two at once).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

from accord.engine.cycle.intake import Intake
from accord.engine.cycle.timeline import Timeline
from accord.engine.negotiation.negotiate import ResponseCache
from accord.engine.request import Request
from accord.engine.sets import ProcessSetRegistry
from accord.engine.settings import EngineSettings


@dataclass(eq=False)
class CycleState:
    """One process set's controller state that its parts share.

    Args:
        set_id: the process set (0: every rank).
        rank: this process's global rank.
        members: the set's global ranks, in the negotiation's order.
        settings: the engine's settings.
        sets: the registry (communicators for execution, members for the exchange).
        cond: guards the queue, the stop flags, join's requests and the lending of a cycle.
        intake: arrivals not yet taken by the controller's thread.
        cache: the response cache every member keeps identically.
    """

    set_id: int
    rank: int
    members: tuple[int, ...]
    settings: EngineSettings
    sets: ProcessSetRegistry
    cond: threading.Condition
    intake: Intake
    cache: ResponseCache
    # Waiting for agreement, by name: the controller's thread only, or a caller it lent its role to.
    pending: dict[str, Request] = field(default_factory=dict)
    stop_requested: bool = False  # under cond: a stop was asked for here
    stopped: bool = False  # under cond: the controller's thread is exiting or gone
    urgent: bool = False  # a caller waited or polled during the last gathering
    timeline: Timeline | None = None  # the engine sets it (rank 0 while a timeline is open)

    @property
    def size(self) -> int:
        """How many ranks the set has."""
        return len(self.members)
