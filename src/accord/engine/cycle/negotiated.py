"""Negotiated cycles: one negotiation among the set's members, then what is ready runs.

Each cycle the controller's thread sends one vector (:func:`~accord.engine.negotiation.negotiate.build_vector`)
through an allreduce on the set's negotiation communicator. When the sums show only cached names,
the ready ones run at once; when any member asks for it (a name new to the cache, a name a peer
announced, join, the stall inspector due), the members also exchange their pending names
(:meth:`NegotiatedCycles._full_exchange`): mismatches fail on every member, the stall inspector
reviews what is partly submitted, and a joined rank runs stand-ins for what it did not submit.
A negotiated cycle also tells the planned state what was ready, so that it can start skipping
the negotiation while every member repeats one step (:mod:`accord.engine.cycle.plan`).

Controller thread only: the negotiation communicator is never used by two threads.
"""
from __future__ import annotations

import time

import torch

from accord.comm.backend import Communicator
from accord.comm.ops import ReduceOp
from accord.engine.cycle.execute import Complete, Executor
from accord.engine.cycle.failure import CommunicationFailure
from accord.engine.cycle.join_control import JoinControl
from accord.engine.cycle.plan import PlannedCycles
from accord.engine.cycle.stall import StallInspector
from accord.engine.cycle.state import CycleState
from accord.engine.negotiation import negotiate as neg
from accord.engine.negotiation.announce import awaited_names, classify
from accord.engine.request import Request
from accord.engine.sets import GLOBAL_ID
from accord.errors import InvalidArgumentError, MismatchError


class NegotiatedCycles:
    """The negotiated cycles of one process set (see the module): one part of
    :class:`~accord.engine.cycle.controller.Controller`.

    Args:
        state: the controller's shared state (the set, pending requests, cache, timeline).
        comm: the communicator the set's members negotiate on.
        executor: runs the ready requests in the agreed order.
        planned: the planned state, told what each cycle ran (and left on a full exchange).
        join: whether this rank is joined, its stand-ins and join()'s end.
        complete: completes requests that fail in the negotiation (a mismatch, an invalid
            argument), releasing their names.
    """

    def __init__(self, state: CycleState, comm: Communicator, executor: Executor, planned: PlannedCycles,
                 join: JoinControl, complete: Complete) -> None:
        self._state = state
        self.comm: Communicator | None = comm
        self._executor = executor
        self._planned = planned
        self._join = join
        self._complete = complete
        s = state.settings
        self.stall = StallInspector(s.stall_check_time, s.stall_shutdown_time, s.stall_check_disable)
        self._awaited: frozenset[str] = frozenset()  # names peers announced, not submitted here
        self.negotiated_cycles = self.negotiations = self.full_exchanges = 0
        self.peers_stopped = False  # the negotiated stop came from other members only

    @property
    def cycles(self) -> int:
        """Cycles run on this set, negotiated and planned: the response cache's clock."""
        return self.negotiated_cycles + self._planned.cycles

    def use(self, comm: Communicator | None) -> None:
        """Negotiate on ``comm`` from now on (None once the controller stops: see its thread)."""
        self.comm = comm

    def run(self, stop_local: bool) -> tuple[bool, BaseException | bool | None, bool]:
        """One negotiation + execution. ``stop_local``: this rank asks the set to stop.

        Returns (anything executed, stop reason or None, whether peers may wait on this rank).

        Raises:
            CommunicationFailure: a negotiation or data collective failed.
        """
        state = self._state
        now = time.monotonic()
        self.negotiated_cycles += 1
        pending = list(state.pending.values())
        tl = state.timeline
        if tl is not None and pending:
            tl.cycle(now)
        by_id, unknown, uncached = classify(pending, state.cache, self._awaited)
        oldest = min((r.submitted_at for r in pending), default=None)
        want_full = unknown or self._join.joined or self.stall.due(now, oldest)
        vec = neg.build_vector(by_id, len(state.cache), want_full=want_full, shutdown=stop_local,
                               joined=self._join.joined, uncached=uncached)
        sums = self.negotiate(vec)
        stop: BaseException | bool | None = bool(sums[neg.SHUTDOWN]) or None
        self.peers_stopped = bool(stop) and not stop_local
        joined = None
        if sums[neg.WANT_FULL]:
            ready, needed, joined, stall_error = self._full_cycle(pending, now)
            if stall_error is not None:
                stop = stall_error
        else:
            ready_ids = neg.ready_from_counts(sums, state.cache)
            state.cache.touch(ready_ids, self.cycles)
            needed = neg.peers_wait_on_me(sums, vec, uncached)
            # The cache did not change this cycle: the ids matched above still hold. (An id
            # ready without a request here is a process set this rank is not in.)
            ready = [state.pending.pop(by_id[i].name) for i in ready_ids if i in by_id]
            self._planned.observe(neg.steady(sums, state.cache) and not state.pending
                                  and len(ready) == len(ready_ids), ready_ids, ready, now)
        if tl is not None:
            done = time.monotonic()
            for r in ready:
                tl.span(r.name, "NEGOTIATE_" + r.op.value.upper(), r.submitted_at, done)
        self._executor.run(ready)
        if joined is not None:
            self._join.saw_joined(joined, self.negotiate)
        return bool(ready), stop, needed

    def _full_cycle(self, pending: list[Request], now: float
                    ) -> tuple[list[Request], bool, list[int], BaseException | None]:
        """The rest of a cycle whose negotiation asked for a full exchange: mismatches fail, the
        stall inspector reviews what is partly submitted.

        Returns (the ready requests in the agreed order, stand-ins included; whether peers may
        wait on this rank; the joined members; the stall inspector's error, if it stops the set).
        """
        state = self._state
        self._planned.leave()
        decision, joined = self._full_exchange(pending, now)
        self._awaited = awaited_names(decision.partial, state.rank)
        for name, message in decision.errors.items():
            r = state.pending.pop(name, None)
            if r is not None:
                error = InvalidArgumentError if name in decision.invalid else MismatchError
                self._complete([(r, None, error(message))])
        if self._join.joined:
            self._join.check_joined_roots(decision)
        stall_error = self.stall.review(decision.partial, now)
        needed = any(state.rank in p.missing for p in decision.partial)
        ready = []
        for name in decision.ready:  # in the agreed order
            q = state.pending.pop(name, None)
            if q is None and self._join.joined:
                q = self._join.stand_in(decision, name)
            if q is not None:
                ready.append(q)
        return ready, needed, joined, stall_error

    def negotiate(self, vec: list[int]) -> list[int]:
        """Sum ``vec`` over the set's members (one negotiation collective).

        Raises:
            CommunicationFailure: the collective failed (a peer died, a timeout).
        """
        t = torch.tensor(vec, dtype=torch.int32)
        try:
            self.comm.allreduce(t, ReduceOp.SUM)
        except Exception as exc:
            raise CommunicationFailure(list(self._state.pending.values()), exc) from exc
        self.negotiations += 1
        return t.tolist()

    def _full_exchange(self, pending: list[Request], now: float) -> tuple[neg.Decision, list[int]]:
        """Exchange every member's pending names; return the decision and the joined ranks."""
        state = self._state
        self.full_exchanges += 1
        sets = {i: state.sets.members(i) for i in {r.process_set_id for r in pending} if i != GLOBAL_ID}
        payload = neg.encode_pending([(r.name, r.signature, now - r.submitted_at) for r in pending],
                                     sets, self._join.joined, {r.name: r.group for r in pending if r.group})
        try:
            gathered = self.comm.allgather(torch.frombuffer(bytearray(payload), dtype=torch.uint8))
        except Exception as exc:
            raise CommunicationFailure(pending, exc) from exc
        for r in pending:
            r.announced = True
        exchange = neg.split_payloads(gathered.numpy().tobytes(), state.size, state.members)
        return neg.decide(exchange, state.cache, self.cycles), exchange.joined
