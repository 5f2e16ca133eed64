"""One process set's controller: its queue, negotiation, response cache, stall inspector,
fusion buffers and thread.

Each process set this rank belongs to has a controller with its own thread
("accord-set-<id>"), which negotiates only with the set's members, over the set's own CPU
communicator. Sets therefore progress independently, as Horovod's per-set controllers do: a
collective on a set never waits for a rank outside it, and disjoint sets run concurrently.
A communicator is only ever used by its set's thread (negotiation and data alike), so no two
threads share one (see :mod:`accord.engine.engine` for why that cannot deadlock).

The thread sleeps on a condition until something is submitted (then gathers more: see
:mod:`accord.engine.cycle.intake`) or until an idle tick, so peers waiting on this rank make progress
and stalls are noticed without spinning. Each cycle: one negotiation allreduce among the set's
members (plus a full exchange when a member has something new), then the ready requests run
in the agreed order through :class:`~accord.engine.cycle.execute.Executor`.

Join (:mod:`accord.engine.negotiation.join`) is decided by the global set's controller; every controller
enters and leaves the joined state, and runs stand-ins while joined, as
:mod:`accord.engine.cycle.join_control` describes.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Sequence

import torch

from accord.comm.backend import Communicator
from accord.comm.ops import ReduceOp
from accord.engine.cycle.caller_runs import CallerRuns
from accord.engine.cycle.execute import Executor
from accord.engine.cycle.failure import CommunicationFailure, pending_at_stop
from accord.engine.cycle.intake import Intake
from accord.engine.cycle.join_control import JoinControl, OnJoined, OnJoinError
from accord.engine.cycle.plan import PlannedCycles, Planner
from accord.engine.cycle.stall import StallInspector
from accord.engine.cycle.timeline import Timeline
from accord.engine.naming import GroupsInFlight
from accord.engine.negotiation import negotiate as neg
from accord.engine.negotiation.announce import awaited_names, classify
from accord.engine.request import Request
from accord.engine.sets import GLOBAL_ID, ProcessSetRegistry
from accord.engine.settings import EngineSettings
from accord.errors import (
    CollectiveError,
    InvalidArgumentError,
    MismatchError,
    ShutdownError,
    with_hint,
)

log = logging.getLogger("accord.engine")

OnStop = Callable[["Controller", "BaseException | None"], None]


class Controller(PlannedCycles, CallerRuns, JoinControl):
    """Queue + negotiation + execution of one process set on this rank.

    Args:
        set_id: the process set (0: every rank).
        rank: this process's global rank.
        negotiation: the communicator the set's members negotiate on (its ``ranks`` are the
            set's global ranks); only this controller's thread uses it.
        sets: the registry (communicators for execution, members for the exchange).
        on_stop: called on the controller's thread as it exits, with its error (None after a
            negotiated stop).
        on_all_joined: (global set) called on the controller's thread once every rank has
            joined, before join() returns anywhere (see :meth:`Engine.join`).
        on_join_error: called when this rank, joined, is the root of a rooted collective its
            peers submitted: its join() must fail (see :mod:`accord.engine.negotiation.join`).
    """

    def __init__(self, set_id: int, rank: int, negotiation: Communicator, sets: ProcessSetRegistry,
                 settings: EngineSettings, on_stop: OnStop | None = None,
                 on_all_joined: OnJoined | None = None,
                 on_join_error: OnJoinError | None = None) -> None:
        self.set_id, self.rank = set_id, rank
        self.members = tuple(negotiation.ranks)
        self.size = len(self.members)
        self.settings = settings
        self.sets = sets
        self.comm: Communicator | None = negotiation
        self._on_stop = on_stop
        self.cond = threading.Condition(threading.Lock())
        self.intake = Intake(self.cond, settings)
        self._inflight: dict[str, Request] = {}  # submitted and not yet completed, by name
        self._groups = GroupsInFlight()  # the group keys among them (one size per key)
        self._pending: dict[str, Request] = {}  # controller thread only: waiting for agreement
        self._awaited: frozenset[str] = frozenset()  # names peers announced, not submitted here
        self._stop_requested = False
        self._stop_cause: BaseException | None = None  # why a forced stop was asked for
        self._peers_stopped = False  # the negotiated stop came from other members only
        self.stopped = False
        self.stop_error: BaseException | None = None
        self.thread: threading.Thread | None = None
        self.timeline: Timeline | None = None
        self._init_join(on_all_joined, on_join_error)
        self._init_caller_runs()
        self.cache = neg.ResponseCache(settings.cache_capacity)
        s = settings
        self.stall = StallInspector(s.stall_check_time, s.stall_shutdown_time, s.stall_check_disable)
        self.executor = Executor(sets, s.fusion_threshold, self._complete)
        self.cycles = self.negotiations = self.full_exchanges = 0
        self.planner = Planner()  # planned cycles: no negotiation while a step repeats
        self._plan_since = 0.0  # when the planned state began or last ran a cycle
        self._urgent = False  # a caller waited or polled during the last gathering

    # --- caller side ---------------------------------------------------------------------

    def start(self) -> None:
        """Start the controller's thread."""
        name = "accord-engine" if self.set_id == GLOBAL_ID else f"accord-set-{self.set_id}"
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)
        self.thread.start()

    @property
    def running(self) -> bool:
        """True while the thread runs and it was neither stopped nor asked to stop."""
        return self.thread is not None and self.thread.is_alive() and not self.stopped

    def accepting(self) -> bool:
        """Whether new requests may be queued (the caller holds ``cond``)."""
        return not (self.stopped or self._stop_requested or self.thread is None)

    def put(self, requests: Sequence[Request], waited: bool = False) -> None:
        """Queue ``requests`` all or none (the caller holds ``cond`` and checked :meth:`accepting`).
        ``waited``: the caller synchronizes at once; in the planned state the thread is then
        not woken, so the caller may run the cycle itself (see :mod:`accord.engine.cycle.caller_runs`).

        Raises:
            InvalidArgumentError: a name is already in flight on this rank, or a group of
                another size under the same name (see :class:`~accord.engine.naming.GroupsInFlight`).
        """
        for request in requests:
            if request.name in self._inflight:
                raise InvalidArgumentError(with_hint(
                    f"a {self._inflight[request.name].op.value} named {request.name!r} is already in "
                    f"flight on rank {self.rank}",
                    "synchronize the first handle before reusing the name, or use distinct names"))
            group = request.group
            if group is not None or self._groups:  # (submitting gradients one by one costs nothing more)
                self._groups.check(request.name, group, group is not None and group[0] in self._inflight,
                                   request.op.value, self.rank)
        self._groups.add([r.group for r in requests])
        wake = not (waited and self.planner.plan is not None)
        for request in requests:
            request.handle.owner = self
            self._inflight[request.name] = request
            self.intake.put(request, wake)

    def in_flight(self, name: str) -> bool:
        """True while a request named ``name`` is submitted here and not completed."""
        with self.cond:
            return name in self._inflight

    def inflight_names(self) -> list[str]:
        """Names submitted here and not yet completed."""
        with self.cond:
            return list(self._inflight)

    def request_stop(self, cause: BaseException | None = None) -> None:
        """Stop after the current cycle, negotiated with the set's members (any member asking
        stops the set on all of them). ``cause``: the error pending requests fail with (default:
        ShutdownError)."""
        with self.cond:
            self._stop_requested = True
            if cause is not None and self._stop_cause is None:
                self._stop_cause = cause
            self.cond.notify()

    def wait_stopped(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the thread to exit."""
        if self.thread is not None:
            self.thread.join(timeout)

    def stopped_error(self) -> BaseException:
        """The error a request on this stopped (or stopping) controller fails with."""
        # While a stop forced by an error elsewhere (a stall in another process set) is still
        # being negotiated, stop_error is not set yet: name that error, not a plain shutdown.
        error = self.stop_error or self._stop_cause
        if error is not None:
            return type(error)(with_hint(f"the accord engine stopped after an earlier error: {error}",
                                         "shut down and init() again (elastic training does this)"))
        where = "" if self.set_id == GLOBAL_ID else f" for process set {self.set_id}"
        return ShutdownError(with_hint(f"the accord engine is not running{where} (shut down, set "
                                       "removed, or never started)",
                                       "call init() (and add_process_set) before submitting collectives"))

    # --- controller thread ---------------------------------------------------------------

    def _complete(self, outcomes: Sequence[tuple[Request, Any, BaseException | None]]) -> None:
        # Names are released before handles complete, so a caller that waited may reuse them.
        with self.cond:
            for r, _, _ in outcomes:
                if self._inflight.get(r.name) is r:  # not a joined rank's stand-in
                    del self._inflight[r.name]
                    if r.group is not None:
                        self._groups.release(r.group)
        # Last first: a caller usually waits on the first handle, and waking it only once the
        # rest are done spares a GIL ping-pong per handle.
        for r, value, error in reversed(outcomes):
            if error is None:
                r.handle.set_result(value)
            else:
                r.handle.set_exception(error)

    def _main(self) -> None:
        error: BaseException | None = None
        # Grad mode is per thread and on by default: the engine's copies and in-place scaling of
        # tensors that require grad must neither record autograd history nor be refused.
        torch.set_grad_enabled(False)
        try:
            error = self._loop()
        except CommunicationFailure as failure:
            where = "" if self.set_id == GLOBAL_ID else f" in process set {self.set_id} {list(self.members)}"
            error = failure.rank_failed(self.rank, self.sets.size, where, self.settings.collective_timeout)
        except BaseException as exc:  # a bug in the engine: never leave callers waiting
            log.exception("accord engine thread failed")
            error = CollectiveError(with_hint(f"the accord engine failed on rank {self.rank}: {exc!r}",
                                              "this is a bug in accord; please report it with the log"))
            error.__cause__ = exc
        finally:
            with self.cond:
                join_handle = self._release_join()
                self.stopped = True
                self.stop_error = error or self._stop_cause
                leftovers = list(self._inflight.values())
                cause = self._stop_cause
            final = error or cause or pending_at_stop(self.set_id, self.members, self.rank, self._peers_stopped)
            self._complete([(r, None, final) for r in leftovers])
            if join_handle is not None:
                self._fail_join(join_handle, error or cause)
            self._pending.clear()
            self.executor.buffers.clear()
            self.executor.staging.clear()
            # Controllers live in reference cycles (handles, callbacks): holding the
            # communicator would leave its process group to a later garbage collection, after
            # the session has closed the store it was built on, where its teardown can hang.
            self.comm = None
            if self._on_stop is not None:
                self._on_stop(self, error)

    def _loop(self) -> BaseException | None:
        s = self.settings
        delay, needed = s.cycle_time, True
        while True:
            if self.planner.plan is not None:
                stop_local, _ = self._gather(self._plan_pause())
                # a caller that ran the plan may have left it (see caller_runs)
                if self.planner.plan is not None and self._planned(stop_local):
                    delay = 0.0
                needed = True
                continue
            # A joined rank cycles without pausing: its peers' collectives need it, and each
            # cycle blocks in the negotiation until they come, so this does not spin. So does a
            # rank whose requests wait on peers that wait on nothing of its own: the peers enter
            # the next negotiation as soon as they submit, and should find this rank there.
            if (self.joined and not self._all_joined) or (self._pending and not needed):
                pause = 0.0
            else:
                pause = delay if self._pending else s.tick
            stop_local, arrived = self._gather(pause)
            executed, stop, needed = self._cycle(stop_local)
            if stop is not None:
                return stop if isinstance(stop, BaseException) else None
            # Peers wait on requests this rank has not submitted: sleep until its caller submits
            # (an arrival wakes the engine at once), backing off so a rank whose peers wait on
            # it for long costs little CPU.
            delay = 0.0 if executed or arrived else min(max(2 * delay, s.cycle_time, 1e-3), s.max_backoff)

    def _gather(self, pause: float) -> tuple[bool, bool]:
        """Sleep until work, a stop request or ``pause``; then move what arrived into pending,
        gathering first as :mod:`accord.engine.cycle.intake` describes."""
        with self.cond:
            if not self.intake.items and not self._stop_requested and not self._join_changed and pause > 0:
                self._wait_parked(pause)
            self._urgent = self.intake.urgent()
            new = self.intake.take(lambda: self._stop_requested)
            stop = self._stop_requested
            # taken here, at the cycle boundary, so a cycle's vector and payload agree
            failed_join = self._take_join() if self._join_changed else None
        if failed_join is not None:
            failed_join[0].set_exception(failed_join[1])
        for r in new:
            self._pending[r.name] = r
        return stop, bool(new)

    def _cycle(self, stop_local: bool) -> tuple[bool, BaseException | bool | None, bool]:
        """One negotiation + execution.

        Returns (anything executed, stop reason or None, whether peers may wait on this rank).
        """
        now = time.monotonic()
        self.cycles += 1
        pending = list(self._pending.values())
        tl = self.timeline
        if tl is not None and pending:
            tl.cycle(now)
        by_id, unknown, uncached = classify(pending, self.cache, self._awaited)
        oldest = min((r.submitted_at for r in pending), default=None)
        want_full = unknown or self.joined or self.stall.due(now, oldest)
        vec = neg.build_vector(by_id, len(self.cache), want_full=want_full, shutdown=stop_local,
                               joined=self.joined, uncached=uncached)
        sums = self._negotiate(vec)
        stop: BaseException | bool | None = bool(sums[neg.SHUTDOWN]) or None
        self._peers_stopped = bool(stop) and not stop_local
        joined = None
        if sums[neg.WANT_FULL]:
            ready, needed, joined, stall_error = self._full_cycle(pending, now)
            if stall_error is not None:
                stop = stall_error
        else:
            ready_ids = neg.ready_from_counts(sums, self.cache)
            self.cache.touch(ready_ids, self.cycles)
            needed = neg.peers_wait_on_me(sums, vec, uncached)
            # The cache did not change this cycle: the ids matched above still hold. (An id
            # ready without a request here is a process set this rank is not in.)
            ready = [self._pending.pop(by_id[i].name) for i in ready_ids if i in by_id]
            self.planner.observe(neg.steady(sums, self.cache) and not self._pending
                                 and len(ready) == len(ready_ids), ready_ids, ready,
                                 self.settings.fusion_threshold,
                                 self._scattered(ready[0].signature.device if ready else "cpu"))
            if self.planner.plan is not None:
                self._plan_since = now
        if tl is not None:
            done = time.monotonic()
            for r in ready:
                tl.span(r.name, "NEGOTIATE_" + r.op.value.upper(), r.submitted_at, done)
        self.executor.run(ready)
        if joined is not None:
            self._saw_joined(joined)
        return bool(ready), stop, needed

    def _full_cycle(self, pending: list[Request], now: float
                    ) -> tuple[list[Request], bool, list[int], BaseException | None]:
        """The rest of a cycle whose negotiation asked for a full exchange: mismatches fail, the
        stall inspector reviews what is partly submitted.

        Returns (the ready requests in the agreed order, stand-ins included; whether peers may
        wait on this rank; the joined members; the stall inspector's error, if it stops the set).
        """
        self.planner.leave()
        decision, joined = self._full_exchange(pending, now)
        self._awaited = awaited_names(decision.partial, self.rank)
        for name, message in decision.errors.items():
            r = self._pending.pop(name, None)
            if r is not None:
                error = InvalidArgumentError if name in decision.invalid else MismatchError
                self._complete([(r, None, error(message))])
        if self.joined:
            self._check_joined_roots(decision)
        stall_error = self.stall.review(decision.partial, now)
        needed = any(self.rank in p.missing for p in decision.partial)
        ready = []
        for name in decision.ready:  # in the agreed order
            q = self._pending.pop(name, None)
            if q is None and self.joined:
                q = self._stand_in(decision, name)
            if q is not None:
                ready.append(q)
        return ready, needed, joined, stall_error

    def _negotiate(self, vec: list[int]) -> list[int]:
        t = torch.tensor(vec, dtype=torch.int32)
        try:
            self.comm.allreduce(t, ReduceOp.SUM)
        except Exception as exc:
            raise CommunicationFailure(list(self._pending.values()), exc) from exc
        self.negotiations += 1
        return t.tolist()

    def _full_exchange(self, pending: list[Request], now: float) -> tuple[neg.Decision, list[int]]:
        """Exchange every member's pending names; return the decision and the joined ranks."""
        self.full_exchanges += 1
        sets = {i: self.sets.members(i) for i in {r.process_set_id for r in pending} if i != GLOBAL_ID}
        payload = neg.encode_pending([(r.name, r.signature, now - r.submitted_at) for r in pending],
                                     sets, self.joined, {r.name: r.group for r in pending if r.group})
        try:
            gathered = self.comm.allgather(torch.frombuffer(bytearray(payload), dtype=torch.uint8))
        except Exception as exc:
            raise CommunicationFailure(pending, exc) from exc
        for r in pending:
            r.announced = True
        exchange = neg.split_payloads(gathered.numpy().tobytes(), self.size, self.members)
        return neg.decide(exchange, self.cache, self.cycles), exchange.joined
