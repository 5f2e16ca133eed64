"""Planned cycles: skipping the negotiation while every rank repeats the same step.

A negotiation costs one collective per cycle, as much as the data collective of a small
request; across hosts a lone synchronous allreduce then pays about twice raw Gloo.
When the response cache shows that every member submits the same plan cycle after cycle, the
members stop negotiating and only verify, inside the data collective itself:

- **Entering.** After :data:`STREAK` consecutive cycles whose negotiation showed exactly the
  same cached names ready on every member, nothing else pending anywhere (no partial counts, no
  new or uncached names, no shutdown or join), and a first work item that is a floating
  SUM/AVERAGE allreduce (CPU or CUDA tensors) with non-zero scale factors, every member enters
  a planned state with that plan. The decision uses only the summed vector and the cache, so all members
  make it in the same cycle.
- **A planned cycle.** A member runs the plan once all of its names are submitted again (same
  signatures): the plan's first work item travels through the fusion buffer with one extra
  element, this rank's *control* value (0), so the one collective both moves the data and
  tells every member whether all followed the plan (:meth:`Executor.run`). A communicator
  with ``allreduce_voted`` (shm) carries the control value beside the data instead, in the
  op's descriptor, and a plain lone request or a batch is then reduced straight from its
  tensors into its outputs.
- **Leaving.** A member that cannot follow the plan (another or a changed name is pending, a
  caller waits on a handle while the plan is incomplete, shutdown, join, part of the plan has waited an idle
  tick for the rest, or nothing came for a quarter of the collective timeout) joins the same first collective
  with zeros and control 1. Every member sees a non-zero sum: nothing of that cycle completes (results stay in
  the fusion buffer), the members leave the planned state together and negotiate normally from the next cycle,
  with their requests still pending. Mismatches, stalls and errors are then found as always.

Only the first work item carries the control value: once it says every member followed the
plan, every member has every request of it, so the rest runs as usual.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

from accord.comm.ops import ReduceOp
from accord.engine.cycle.execute import Executor
from accord.engine.cycle.fusion import plan_work
from accord.engine.cycle.join_control import JoinControl
from accord.engine.cycle.state import CycleState
from accord.engine.negotiation.join import stand_in
from accord.engine.request import Op, Request, Signature

STREAK = 3  # identical negotiated cycles before planning
# A lone request is normally reduced in place; planned, it goes through a staging buffer (two
# copies): worth it only while the negotiation saved costs more than copying the bytes. On the
# CPU that is up to about 256 KB; a GPU copies at terabytes a second, so there a 16 MB request
# costs ~20 us of copies against ~100 us for the negotiation and the two thread hand-offs
# (measured on an H200, benchmarks/results/gpu).
LONE_MAX_BYTES = {"cpu": 256 * 1024, "cuda": 16 * 1024 * 1024}
# Where a cycle gathers until a caller waits (no early start: shm), an arrival in the planned
# state does not wake the thread (see :meth:`PlannedCycles.quiet_arrivals`), which then looks
# at least every cycle time; only for cycle times this long, so that an idle plan wakes rarely.
QUIET_MIN_CYCLE_S = 0.1


@dataclass(frozen=True)
class Plan:
    """The cached names of one repeated cycle, in execution order, and the first work item's
    (name, signature) pairs (what a member that deviates sends zeros for); ``device_index``:
    this rank's CUDA device of that item (-1 on the CPU), where such zeros must live."""

    ids: tuple[int, ...]
    names: tuple[str, ...]
    first: tuple[tuple[str, Signature], ...]
    device_index: int = -1


def plannable(ready: Sequence[Request], fusion_threshold: int,
              scattered: bool = False) -> tuple[tuple[str, Signature], ...] | None:
    """The first work item's (name, signature) pairs when ``ready`` may run as a plan, else None.

    Decided from signatures only (identical on every member). ``scattered``: the set's
    communicator reduces batches without a fusion buffer, which a plan would give up; there
    negotiating costs microseconds, so only small lone requests are planned. (shm carries the
    plan's vote beside a batch's data, so it plans batches: see :meth:`PlannedCycles._scattered`.)
    """
    if not ready:
        return None
    first = plan_work(ready, fusion_threshold)[0]
    r = first[0]
    sig = r.signature
    if sig.device not in LONE_MAX_BYTES or (len(first) > 1 and scattered) or (
            len(first) == 1 and first[0].nbytes > LONE_MAX_BYTES[sig.device]):
        return None
    wire = r.wire_dtype or (r.tensor.dtype if r.tensor is not None else None)
    if (r.op is not Op.ALLREDUCE or wire is None or not wire.is_floating_point
            or ReduceOp(sig.reduce_op) not in (ReduceOp.SUM, ReduceOp.AVERAGE)
            or sig.prescale == 0 or sig.postscale == 0):
        return None
    return tuple((q.name, q.signature) for q in first)


class Planner:
    """Counts identical negotiated cycles and holds the active plan (controller thread only)."""

    def __init__(self) -> None:
        self.plan: Plan | None = None
        self._last: tuple[int, ...] = ()
        self._streak = 0
        self.planned_cycles = 0  # data collectives run without a negotiation (tests read it)

    def observe(self, steady: bool, ready_ids: Sequence[int], ready: Sequence[Request],
                fusion_threshold: int, scattered: bool = False) -> None:
        """After a negotiated cycle: ``steady`` says every member had exactly ``ready_ids``
        pending (see the module). Enters the planned state after :data:`STREAK` of them."""
        key = tuple(ready_ids)
        if not steady or not key or key != self._last:
            self._last, self._streak = (key if steady else ()), (1 if steady and key else 0)
            return
        self._streak += 1
        if self._streak >= STREAK:
            first = plannable(ready, fusion_threshold, scattered)
            if first is not None:
                tensor = ready[0].tensor  # the first work item starts with it (plan_work)
                index = tensor.device.index if tensor is not None and tensor.is_cuda else None
                self.plan = Plan(key, tuple(r.name for r in ready), first, -1 if index is None else index)

    def ran(self) -> None:
        """A planned cycle ran: every member followed the plan."""
        self.planned_cycles += 1

    def leave(self) -> None:
        """Back to negotiating every cycle (every member does it in the same cycle)."""
        self.plan = None
        self._last, self._streak = (), 0


class PlannedCycles:
    """The controller's planned state (see the module): one part of
    :class:`~accord.engine.cycle.controller.Controller`. It runs on the controller's thread, or
    on a caller's thread the role is lent to (:mod:`accord.engine.cycle.caller_runs`).

    Args:
        state: the controller's shared state (pending requests, cache, settings, timeline).
        executor: runs the plan's collectives (with the control value).
        join: whether this rank is joined (a joined rank leaves the plan).
    """

    def __init__(self, state: CycleState, executor: Executor, join: JoinControl) -> None:
        self._state = state
        self._executor = executor
        self._join = join
        self.planner = Planner()  # no negotiation while a step repeats
        self._since = 0.0  # when the planned state began or last ran a cycle

    @property
    def plan(self) -> Plan | None:
        """The active plan (None: negotiating every cycle)."""
        return self.planner.plan

    @property
    def cycles(self) -> int:
        """Planned cycles run so far (on the controller's thread or a caller's)."""
        return self.planner.planned_cycles

    def observe(self, steady: bool, ready_ids: Sequence[int], ready: Sequence[Request], now: float) -> None:
        """After a negotiated cycle at ``now``: see :meth:`Planner.observe`."""
        # a barrier has no tensor, hence no device: its set's CPU communicator runs it
        device = (ready[0].signature.device if ready else "") or "cpu"
        self.planner.observe(steady, ready_ids, ready, self._state.settings.fusion_threshold,
                             self._scattered(device))
        if self.planner.plan is not None:
            self._since = now

    def leave(self) -> None:
        """Back to negotiating every cycle (every member does it in the same cycle)."""
        self.planner.leave()

    def _scattered(self, device: str = "cpu") -> bool:
        """Whether the set's communicator for ``device`` reduces batches in place of a fusion
        buffer, which a plan would give up: not where it also carries the plan's vote beside a
        batch's data (``allreduce_voted``, shm), since a planned batch then needs no buffer either."""
        comm = self._state.sets.communicator(self._state.set_id, device)
        return (getattr(comm, "supports_allreduce_many", None) is not None
                and getattr(comm, "allreduce_voted", None) is None)

    @property
    def quiet_arrivals(self) -> bool:
        """Whether submissions leave the thread parked in the planned state: where cycles wait
        for a caller anyway (``start_bytes`` 0), a caller that waits then runs the planned cycle
        on its own thread (:mod:`accord.engine.cycle.caller_runs`), with no hand-off to this
        thread and back; requests nobody waits on are found within a cycle time (:meth:`pause`)."""
        s = self._state.settings
        return self.planner.plan is not None and s.start_bytes == 0 and s.cycle_time >= QUIET_MIN_CYCLE_S

    def pause(self) -> float:
        """How long to wait for submissions: none once the plan is complete here."""
        plan = self.planner.plan
        if plan is not None and all(n in self._state.pending for n in plan.names):
            return 0.0
        wait = max(self._deadline() - time.monotonic(), 0.0)
        return min(wait, self._state.settings.cycle_time) if self.quiet_arrivals else wait

    def _deadline(self) -> float:
        """When this rank stops waiting for the plan and leaves it. Part of the plan pending:
        an idle tick after the first of it arrived (a name that never comes must reach the
        stall inspector). Nothing pending (the ranks compute between steps): a quarter of the
        collective timeout, so a slow step costs no wasted collective, while peers already
        inside the plan's collective are released long before that collective times out; and
        no later than the stall inspector's horizon, since a peer blocked in that collective
        can neither warn about nor stop on a name this rank never submits."""
        s = self._state.settings
        plan = self.planner.plan
        pending = self._state.pending
        arrived = [pending[n].submitted_at for n in plan.names if n in pending] if plan else []
        if arrived:
            return min(arrived) + s.tick
        return self._since + max(s.tick, min(s.collective_timeout / 4, s.stall_horizon))

    def step(self, stop_local: bool) -> bool:
        """One step of the planned state; returns whether requests completed. Runs the plan
        when it is complete here, joins its first collective with control 1 when this rank
        cannot follow it (then every member leaves the planned state), or keeps waiting."""
        plan = self.planner.plan
        assert plan is not None
        state = self._state
        pending = state.pending
        have = all(n in pending and state.cache.id_of(n, pending[n].signature) == i
                   for i, n in zip(plan.ids, plan.names))
        extra = len(pending) > len(plan.names) or (not have and any(n not in plan.names for n in pending))
        now = time.monotonic()
        if have and not extra and not stop_local and not self._join.joined:
            ready = [pending.pop(n) for n in plan.names]
            tl = state.timeline
            if tl is not None:
                for r in ready:
                    tl.span(r.name, "NEGOTIATE_" + r.op.value.upper(), r.submitted_at, now)
            if self._executor.run(ready, control=0.0):
                self.planner.ran()
                self._since = time.monotonic()
                return True
            for r in ready:  # another member left the plan: negotiate them normally
                pending[r.name] = r
            self.planner.leave()
            return False
        if not (stop_local or self._join.joined or extra or state.urgent or now >= self._deadline()):
            return False  # the rest of the plan is still to come
        standins = [stand_in(n, sig, state.members, plan.device_index) for n, sig in plan.first]
        self._executor.run(standins, control=1.0)  # tells every member; completes nothing
        self.planner.leave()
        return False
