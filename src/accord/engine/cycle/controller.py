"""One process set's controller: its queue, its thread, and the parts that run its cycles.

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

The controller owns the queue's side that callers see (the names in flight, stop requests, the
thread's life) and holds the parts that run cycles, each with its own attributes and the one
shared :class:`~accord.engine.cycle.state.CycleState`: :class:`~accord.engine.cycle.negotiated.NegotiatedCycles`,
:class:`~accord.engine.cycle.plan.PlannedCycles` (no negotiation while a step repeats),
:class:`~accord.engine.cycle.caller_runs.CallerRuns` (a waiting caller runs a planned cycle) and
:class:`~accord.engine.cycle.join_control.JoinControl`.

Join (:mod:`accord.engine.negotiation.join`) is decided by the global set's controller; every controller
enters and leaves the joined state, and runs stand-ins while joined, as
:mod:`accord.engine.cycle.join_control` describes.
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Sequence

import torch

from accord.comm.backend import Communicator
from accord.engine.cycle.caller_runs import CallerRuns
from accord.engine.cycle.execute import Executor
from accord.engine.cycle.failure import CommunicationFailure, pending_at_stop
from accord.engine.cycle.in_flight import InFlight
from accord.engine.cycle.intake import Intake
from accord.engine.cycle.join_control import JoinControl, OnJoined, OnJoinError
from accord.engine.cycle.negotiated import NegotiatedCycles
from accord.engine.cycle.plan import PlannedCycles, Planner
from accord.engine.cycle.state import CycleState
from accord.engine.cycle.timeline import Timeline
from accord.engine.negotiation.join import JoinState
from accord.engine.negotiation.negotiate import ResponseCache
from accord.engine.request import Handle, Request
from accord.engine.sets import GLOBAL_ID, ProcessSetRegistry
from accord.engine.settings import EngineSettings
from accord.errors import CollectiveError, ShutdownError, with_hint

log = logging.getLogger("accord.engine")

OnStop = Callable[["Controller", "BaseException | None"], None]


class Controller:
    """Queue + negotiation + execution of one process set on this rank.

    Args:
        set_id: the process set (0: every rank).
        rank: this process's global rank.
        negotiation: the communicator the set's members negotiate on (its ``ranks`` are the
            set's global ranks); only this controller's thread uses it.
        sets: the registry (communicators for execution, members for the exchange).
        settings: the engine's settings.
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
        cond = threading.Condition(threading.Lock())
        self._state = state = CycleState(set_id, rank, tuple(negotiation.ranks), settings, sets, cond,
                                         Intake(cond, settings), ResponseCache(settings.cache_capacity))
        self._on_stop = on_stop
        self._in_flight = InFlight()
        self._stop_cause: BaseException | None = None  # why a forced stop was asked for
        self.stop_error: BaseException | None = None
        self.thread: threading.Thread | None = None
        self.executor = Executor(sets, settings.fusion_threshold, self._complete)
        self.join_control = JoinControl(state, on_all_joined, on_join_error)
        self.planned = PlannedCycles(state, self.executor, self.join_control)
        self.caller_runs = CallerRuns(state, self.planned, self.join_control)
        self.negotiated = NegotiatedCycles(state, negotiation, self.executor, self.planned, self.join_control,
                                           self._complete)

    # --- what the engine reads and sets ----------------------------------------------------

    @property
    def cond(self) -> threading.Condition:
        """The lock guarding the queue, the names in flight, stop and join requests."""
        return self._state.cond

    @property
    def intake(self) -> Intake:
        """The queue callers put requests in (and tell when they wait or poll)."""
        return self._state.intake

    @property
    def stopped(self) -> bool:
        """True once the controller's thread is exiting."""
        return self._state.stopped

    @property
    def comm(self) -> Communicator | None:
        """The negotiation communicator (None once the thread has stopped)."""
        return self.negotiated.comm

    @comm.setter
    def comm(self, comm: Communicator | None) -> None:
        self.negotiated.use(comm)

    @property
    def timeline(self) -> Timeline | None:
        """The timeline this set records its negotiations to (None: none)."""
        return self._state.timeline

    @timeline.setter
    def timeline(self, timeline: Timeline | None) -> None:
        self._state.timeline = timeline

    @property
    def planner(self) -> Planner:
        """The planned state's planner (its counter of planned cycles)."""
        return self.planned.planner

    @property
    def join_state(self) -> JoinState:
        """This rank's side of join (the join() waiting, if any)."""
        return self.join_control.join_state

    @property
    def cycles(self) -> int:
        """Cycles run, negotiated and planned."""
        return self.negotiated.cycles

    @property
    def negotiations(self) -> int:
        """Negotiation collectives run."""
        return self.negotiated.negotiations

    @property
    def full_exchanges(self) -> int:
        """Full exchanges of pending names run."""
        return self.negotiated.full_exchanges

    @property
    def lent_cycles(self) -> int:
        """Planned cycles run on a waiting caller's thread."""
        return self.caller_runs.lent_cycles

    # --- caller side ---------------------------------------------------------------------

    def start(self) -> None:
        """Start the controller's thread."""
        name = "accord-engine" if self._state.set_id == GLOBAL_ID else f"accord-set-{self._state.set_id}"
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)
        self.thread.start()

    @property
    def running(self) -> bool:
        """True while the thread runs and it was neither stopped nor asked to stop."""
        return self.thread is not None and self.thread.is_alive() and not self._state.stopped

    def accepting(self) -> bool:
        """Whether new requests may be queued (the caller holds ``cond``)."""
        return not (self._state.stopped or self._state.stop_requested or self.thread is None)

    def put(self, requests: Sequence[Request], waited: bool = False) -> None:
        """Queue ``requests`` all or none (the caller holds ``cond`` and checked :meth:`accepting`).
        ``waited``: the caller synchronizes at once; in the planned state the thread is then
        not woken, so the caller may run the cycle itself (see :mod:`accord.engine.cycle.caller_runs`);
        nor for any submission where :attr:`PlannedCycles.quiet_arrivals` says so.

        Raises:
            InvalidArgumentError: a name is already in flight on this rank, or a group of
                another size under the same name (see :mod:`accord.engine.cycle.in_flight`).
        """
        self._in_flight.add(requests, self._state.rank)
        wake = not (self.planned.plan is not None and (waited or self.planned.quiet_arrivals))
        for request in requests:
            request.handle.owner = self
            self._state.intake.put(request, wake)

    def run_here(self, handle: Handle) -> bool:
        """Run the planned cycle on the caller's thread if it may (see
        :meth:`CallerRuns.run_here`); return whether it ran there."""
        return self.caller_runs.run_here(handle)

    def in_flight(self, name: str) -> bool:
        """True while a request named ``name`` is submitted here and not completed."""
        with self._state.cond:
            return name in self._in_flight

    def inflight_names(self) -> list[str]:
        """Names submitted here and not yet completed."""
        with self._state.cond:
            return self._in_flight.names()

    def request_join(self, handle: Handle, device: int) -> None:
        """See :meth:`JoinControl.request_join` (the caller holds ``cond``)."""
        self.join_control.request_join(handle, device)

    def set_joined(self, joined: bool, device: int = -1) -> threading.Event:
        """See :meth:`JoinControl.set_joined`; returns the event set once the set has changed."""
        return self.join_control.set_joined(joined, device)

    def abort_join(self, error: BaseException) -> None:
        """See :meth:`JoinControl.abort_join`."""
        self.join_control.abort_join(error)

    def request_stop(self, cause: BaseException | None = None) -> None:
        """Stop after the current cycle, negotiated with the set's members (any member asking
        stops the set on all of them). ``cause``: the error pending requests fail with (default:
        ShutdownError)."""
        with self._state.cond:
            self._state.stop_requested = True
            if cause is not None and self._stop_cause is None:
                self._stop_cause = cause
            self._state.cond.notify()

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
        where = "" if self._state.set_id == GLOBAL_ID else f" for process set {self._state.set_id}"
        return ShutdownError(with_hint(f"the accord engine is not running{where} (shut down, set "
                                       "removed, or never started)",
                                       "call init() (and add_process_set) before submitting collectives"))

    # --- controller thread ---------------------------------------------------------------

    def _complete(self, outcomes: Sequence[tuple[Request, Any, BaseException | None]]) -> None:
        # Names are released before handles complete, so a caller that waited may reuse them.
        with self._state.cond:
            self._in_flight.release(r for r, _, _ in outcomes)
        # Last first: a caller usually waits on the first handle, and waking it only once the
        # rest are done spares a GIL ping-pong per handle.
        for r, value, error in reversed(outcomes):
            if error is None:
                r.handle.set_result(value)
            else:
                r.handle.set_exception(error)

    def _main(self) -> None:
        state = self._state
        error: BaseException | None = None
        # Grad mode is per thread and on by default: the engine's copies and in-place scaling of
        # tensors that require grad must neither record autograd history nor be refused.
        torch.set_grad_enabled(False)
        try:
            error = self._loop()
        except CommunicationFailure as failure:
            where = "" if state.set_id == GLOBAL_ID else f" in process set {state.set_id} {list(state.members)}"
            error = failure.rank_failed(state.rank, state.sets.size, where, state.settings.collective_timeout)
        except BaseException as exc:  # a bug in the engine: never leave callers waiting
            log.exception("accord engine thread failed")
            error = CollectiveError(with_hint(f"the accord engine failed on rank {state.rank}: {exc!r}",
                                              "this is a bug in accord; please report it with the log"))
            error.__cause__ = exc
        finally:
            with state.cond:
                join_handle = self.join_control.release()
                state.stopped = True
                self.stop_error = error or self._stop_cause
                leftovers = self._in_flight.requests()
                cause = self._stop_cause
            final = error or cause or pending_at_stop(state.set_id, state.members, state.rank,
                                                      self.negotiated.peers_stopped)
            self._complete([(r, None, final) for r in leftovers])
            if join_handle is not None:
                self.join_control.fail(join_handle, error or cause)
            state.pending.clear()
            self.executor.buffers.clear()
            self.executor.staging.clear()
            # Controllers live in reference cycles (handles, callbacks): holding the
            # communicator would leave its process group to a later garbage collection, after
            # the session has closed the store it was built on, where its teardown can hang.
            self.negotiated.use(None)
            if self._on_stop is not None:
                self._on_stop(self, error)

    def _loop(self) -> BaseException | None:
        s = self._state.settings
        planned, join = self.planned, self.join_control
        delay, needed = s.cycle_time, True
        while True:
            if planned.plan is not None:
                stop_local, _ = self._gather(planned.pause())
                # a caller that ran the plan may have left it (see caller_runs)
                if planned.plan is not None and planned.step(stop_local):
                    delay = 0.0
                needed = True
                continue
            # A joined rank cycles without pausing: its peers' collectives need it, and each
            # cycle blocks in the negotiation until they come, so this does not spin. So does a
            # rank whose requests wait on peers that wait on nothing of its own: the peers enter
            # the next negotiation as soon as they submit, and should find this rank there.
            pending = self._state.pending
            if (join.joined and not join.all_joined) or (pending and not needed):
                pause = 0.0
            else:
                pause = delay if pending else s.tick
            stop_local, arrived = self._gather(pause)
            executed, stop, needed = self.negotiated.run(stop_local)
            if stop is not None:
                return stop if isinstance(stop, BaseException) else None
            # Peers wait on requests this rank has not submitted: sleep until its caller submits
            # (an arrival wakes the engine at once), backing off so a rank whose peers wait on
            # it for long costs little CPU.
            delay = 0.0 if executed or arrived else min(max(2 * delay, s.cycle_time, 1e-3), s.max_backoff)

    def _gather(self, pause: float) -> tuple[bool, bool]:
        """Sleep until work, a stop request or ``pause``; then move what arrived into pending,
        gathering first as :mod:`accord.engine.cycle.intake` describes."""
        state, join = self._state, self.join_control
        with state.cond:
            if not state.intake.items and not state.stop_requested and not join.changed and pause > 0:
                self.caller_runs.wait_parked(pause)
            state.urgent = state.intake.urgent()
            new = state.intake.take(lambda: state.stop_requested)
            stop = state.stop_requested
            # taken here, at the cycle boundary, so a cycle's vector and payload agree
            failed_join = join.take() if join.changed else None
        if failed_join is not None:
            failed_join[0].set_exception(failed_join[1])
        for r in new:
            state.pending[r.name] = r
        return stop, bool(new)
