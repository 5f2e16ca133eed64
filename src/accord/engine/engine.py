"""The engine: one controller per process set this rank belongs to, each on its own thread.

Callers :meth:`Engine.enqueue` requests and get handles; the engine routes each request to
its process set's :class:`~accord.engine.cycle.controller.Controller`, which negotiates with the
set's members only. So, as in Horovod, a collective on a process set never waits for a rank
outside the set, and sets of disjoint ranks progress concurrently.

Why independent threads cannot deadlock: a controller's thread blocks only in collectives on
its own set's communicators (negotiation and data), which no other thread uses; on every member
the set's thread issues the same sequence of them (the negotiation makes it so), and each
member's thread for that set runs regardless of what the rank's other sets are doing. A rank in
two overlapping sets therefore serves both at once; nothing of one set waits on the other.
(Communicators of different sets are independent: separate Gloo process groups, separate
shared-memory segments. MPI needs MPI_THREAD_MULTIPLE, mpi4py's default. NCCL collectives of
overlapping sets issued from two threads may interleave differently on two GPUs; Horovod
serializes them on one thread, so GPU jobs that run overlapping sets concurrently should keep
to one set at a time.)

Controllers start with the engine (for sets already registered) or when a set is added
(:meth:`Engine.open_set`), and stop when it is removed (:meth:`Engine.close_set`) or at
:meth:`Engine.shutdown`; a stop is negotiated within the set, so pending requests fail on every
member. A controller that stops on an error (a rank failed, a stall shutdown) stops every other
controller of this rank with that error.

Join (:mod:`accord.engine.negotiation.join`) is decided by the global set: join() returns once every rank
has joined. While a rank is joined, every set controller of that rank serves its peers'
collectives with stand-ins too (each set's exchange says which members are joined). Once all
ranks have joined, each rank's set controllers leave the joined state, then the global
controller synchronizes every rank, and only then does join() return: no set can count a rank
as joined after that rank could have submitted again.
"""
from __future__ import annotations

import sys
import threading
from typing import Any, Sequence

import torch

from accord.comm.backend import Communicator
from accord.comm.host_first import host_first
from accord.engine.cycle.controller import Controller
from accord.engine.cycle.timeline import Timeline
from accord.engine.negotiation.validate import validate_group
from accord.engine.request import Handle, Request
from accord.engine.sets import GLOBAL_ID, ProcessSetRegistry
from accord.engine.settings import EngineSettings
from accord.errors import BackendError, InvalidArgumentError, ShutdownError, with_hint


class Engine:
    """Routes requests to per-set controllers. Start with :meth:`start`.

    ``negotiation`` is the global set's negotiation communicator; every other set negotiates
    on its own CPU communicator from ``sets``.
    """

    def __init__(self, rank: int, size: int, negotiation: Communicator, sets: ProcessSetRegistry,
                 settings: EngineSettings | None = None) -> None:
        self.rank, self.size = rank, size
        self.settings = settings or EngineSettings()
        self.sets = sets
        self._lock = threading.Lock()  # guards _controllers, _started, _timeline
        self._global = Controller(GLOBAL_ID, rank, negotiation, sets, self.settings, self._stopped,
                                  self._leave_join, self._join_failed)
        self._controllers: dict[int, Controller] = {GLOBAL_ID: self._global}
        self._retired: list[Controller] = []  # stopped set controllers (their counters still count)
        self._started = False
        self._shutting_down = False
        self._timeline: Timeline | None = None
        self._python_switch_interval: float | None = None  # Python's, while ours is set

    # --- life cycle ----------------------------------------------------------------------

    def start(self) -> None:
        """Start the global controller and one per registered set this rank is in (and the
        ACCORD_TIMELINE timeline, if set to a path rather than ``DYNAMIC``)."""
        with self._lock:
            if self._started:
                raise RuntimeError("engine already started")
            self._started = True
        if self.settings.timeline_at_start:
            self.start_timeline(self.settings.timeline_at_start, self.settings.timeline_mark_cycles)
        if self.settings.switch_interval > 0:
            self._python_switch_interval = sys.getswitchinterval()
            sys.setswitchinterval(self.settings.switch_interval)
        try:  # across hosts with a hierarchical data path: negotiate host-first (see host_first)
            self._global.comm = host_first(self._global.comm, self.sets.communicator(GLOBAL_ID, "cpu"))
        except BackendError:
            pass  # no CPU communicator registered (some tests): negotiate on what was given
        self._global.start()
        for set_id in self.sets.ids():
            if set_id != GLOBAL_ID:
                self.open_set(set_id)

    def open_set(self, set_id: int) -> None:
        """Start the controller of registered set ``set_id`` if this rank is a member (and
        none runs yet). Every member calls it when the set is added."""
        if self.rank not in self.sets.members(set_id):
            return
        with self._lock:
            if not self._started or set_id in self._controllers:
                return
            comm = self.sets.communicator(set_id, "cpu")
            # A set across hosts has a hierarchical data path: negotiate on its flat part,
            # host-first, as the global set does (not through the data path's own agreements)
            negotiation = host_first(getattr(comm, "flat", comm), comm)
            controller = Controller(set_id, self.rank, negotiation, self.sets, self.settings, self._stopped,
                                    on_join_error=self._join_failed)
            controller.timeline = controller.executor.timeline = self._timeline
            self._controllers[set_id] = controller
        if not self._global.running:  # the engine stopped meanwhile: do not leave it running
            controller.request_stop(self._global.stop_error)
        controller.start()

    def close_set(self, set_id: int, timeout: float | None = None) -> None:
        """Stop set ``set_id``'s controller (negotiated with its members: requests pending there
        fail on every member) and wait for it; a no-op where this rank has none."""
        with self._lock:
            controller = self._controllers.pop(set_id, None) if set_id != GLOBAL_ID else None
            if controller is not None:
                self._retired.append(controller)
        if controller is not None:
            controller.request_stop()
            controller.wait_stopped(self._wait_time(timeout))

    @property
    def running(self) -> bool:
        """True while the global controller runs and no stop was requested or forced."""
        return self._global.running

    def shutdown(self, timeout: float | None = None) -> None:
        """Ask every controller to stop after its current cycle (each stop is negotiated within
        its set, so every rank's engine stops), and wait for them."""
        with self._lock:
            self._shutting_down = True
            controllers = list(self._controllers.values())
        for c in controllers:
            c.request_stop()
        for c in controllers:
            c.wait_stopped(self._wait_time(timeout))
        self.stop_timeline()
        if self._python_switch_interval is not None:
            sys.setswitchinterval(self._python_switch_interval)
            self._python_switch_interval = None

    def _wait_time(self, timeout: float | None) -> float:
        return self.settings.collective_timeout + 10 if timeout is None else timeout

    def _stopped(self, controller: Controller, error: BaseException | None) -> None:
        """A controller's thread is exiting: an error, or the global set stopping, stops the
        rest of this rank's engine with it."""
        if error is None and controller is not self._global:
            return
        with self._lock:
            others = [c for c in self._controllers.values() if c is not controller]
        for c in others:
            c.request_stop(error)

    # --- requests ------------------------------------------------------------------------

    def _controller(self, set_id: int) -> Controller:
        controller = self._controllers.get(set_id)
        if controller is None:  # validated as a member: the set is being added or removed
            raise self._global.stopped_error() if not self._global.running else ShutdownError(with_hint(
                f"process set {set_id} has no running controller on rank {self.rank}",
                "call add_process_set on every rank (it starts the set) before using the set"))
        return controller

    def enqueue(self, request: Request) -> Handle:
        """Submit ``request``; return its handle.

        Raises:
            InvalidArgumentError (a ValueError and a RuntimeError): another request under the
                same name is in flight on this rank, or the request is invalid for its process
                set (membership, root, splits, op).
            ShutdownError / RankFailedError / StallError: the engine has stopped.
        """
        return self.enqueue_many((request,))[0]

    def enqueue_many(self, requests: Sequence[Request], waited: bool = False) -> list[Handle]:
        """Submit ``requests`` (a group, all of one process set) all or none: if one is
        refused, none is queued, so no rank is left with part of a group its peers wait on.
        ``waited``: the caller calls :meth:`synchronize` right away (a synchronous op).
        Raises as :meth:`enqueue` does, and ValueError for a name that appears twice in the
        group or a group that spans process sets."""
        validate_group(requests, self.sets, self.rank)
        set_ids = {r.process_set_id for r in requests}
        if len(set_ids) > 1:
            raise InvalidArgumentError(with_hint(f"one group spans process sets {sorted(set_ids)}",
                                       "submit a group's tensors on one process set"))
        for request in requests:
            if request.signature.device == "cuda" and request.ready_event is None:
                request.ready_event = torch.cuda.Event()
                # the stream that produced the data: the tensor's device's, not the current one
                request.ready_event.record(torch.cuda.current_stream(request.tensor.device))
        if not requests:
            return []
        controller = self._controller(requests[0].process_set_id)
        with controller.cond:
            if not controller.accepting():
                raise self._global.stopped_error() if self._global.stopped else controller.stopped_error()
            controller.put(requests, waited)
        return [r.handle for r in requests]

    def in_flight(self, name: str) -> bool:
        """True while a request named ``name`` is submitted on this rank and not completed."""
        return any(c.in_flight(name) for c in list(self._controllers.values()))

    def poll(self, handle: Handle) -> bool:
        """True when ``handle`` has completed (successfully or not). A caller polling an
        unfinished handle is waiting for it: the cycle that gathers requests starts now."""
        if handle.done():
            return True
        (handle.owner or self._global).intake.hurry()
        return handle.done()

    def synchronize(self, handle: Handle) -> Any:
        """Wait for ``handle`` and return its result, re-raising the engine's error here.

        While a caller waits, its set's controller does not hold its cycle back for more
        requests: the waiting caller submits none, and a lone synchronous op starts at once.
        """
        if handle.done():
            return handle.result()
        controller: Controller = handle.owner or self._global
        if controller.run_here(handle) and handle.done():  # a planned cycle, run on this thread
            return handle.result()
        with controller.intake.waiting():
            while not handle.wait(0.5):
                thread = controller.thread
                if thread is None or not thread.is_alive():
                    handle.wait(0.5)  # the thread fails every request before it exits
                    if not handle.done():
                        raise controller.stopped_error()
        return handle.result()

    def join(self, device: int = -1) -> int:
        """Horovod's join: this rank has no more data. Until every rank has joined, this rank
        takes part in the global set's collectives the others submit (see
        :mod:`accord.engine.negotiation.join`; other sets are described in this module's docstring).

        Args:
            device: CUDA device index for stand-in tensors of CUDA collectives (-1: current).
        Returns:
            The rank that joined last (the same on every rank).
        Raises:
            ValueError: join() is already waiting on this rank (another thread called it).
            ShutdownError / RankFailedError / StallError: the engine stopped.
        """
        g = self._global
        with g.cond:
            if not g.accepting():
                raise g.stopped_error()
            if g.join_state.handle is not None:
                raise ValueError(with_hint(f"join() is already waiting on rank {self.rank}",
                                           "call join() from one thread only"))
            handle = Handle("join")
            handle.owner = g
            # Resolved here, on the caller's thread: the engine thread's current CUDA device is
            # always 0 (it never picks one), and stand-ins must go where this rank's GPU is.
            if device < 0 and torch.cuda.is_available():
                device = torch.cuda.current_device()
            g.request_join(handle, int(device))
        for c in self._set_controllers():
            c.set_joined(True, int(device))
        return int(self.synchronize(handle))

    def _set_controllers(self) -> list[Controller]:
        with self._lock:
            return [c for i, c in self._controllers.items() if i != GLOBAL_ID]

    def _join_failed(self, error: BaseException) -> None:
        """This rank, joined, was named root of a collective it never submitted: its join()
        raises ``error`` (as the submitting ranks do) and every set leaves the joined state."""
        self._global.abort_join(error)
        for c in self._set_controllers():
            c.set_joined(False)

    def _leave_join(self) -> None:
        """Every rank has joined (global controller's thread): this rank's other sets stop
        serving stand-ins before join() returns; the global controller then synchronizes every
        rank, so no set still counts a rank as joined once any rank's join() has returned."""
        acks = [c.set_joined(False) for c in self._set_controllers()]
        for ack in acks:
            ack.wait(self.settings.collective_timeout)

    # --- timeline and introspection ------------------------------------------------------

    def start_timeline(self, path: str, mark_cycles: bool = False) -> None:
        """Record a chrome://tracing timeline to ``path`` (rank 0 writes; others ignore)."""
        if self.rank != 0:
            return
        self.stop_timeline()
        self._set_timeline(Timeline(path, self.rank, mark_cycles))

    def stop_timeline(self) -> None:
        """Finish and close the timeline file, if one is open."""
        tl = self._set_timeline(None)
        if tl is not None:
            tl.close()

    def _set_timeline(self, timeline: Timeline | None) -> Timeline | None:
        with self._lock:
            old, self._timeline = self._timeline, timeline
            for c in self._controllers.values():
                c.timeline = c.executor.timeline = timeline
        return old

    def inflight_names(self, process_set_id: int | None = None) -> list[str]:
        """Names submitted on this rank and not yet completed (optionally of one process set)."""
        with self._lock:
            controllers = [c for i, c in self._controllers.items()
                           if process_set_id is None or i == process_set_id]
        return sorted(n for c in controllers for n in c.inflight_names())

    def stats(self) -> dict[str, int]:
        """Counters summed over this rank's controllers: cycles, negotiation collectives, full
        exchanges, data collectives, planned cycles (no negotiation, see
        :mod:`accord.engine.cycle.plan`), planned cycles run on a waiting caller's thread (see
        :mod:`accord.engine.cycle.caller_runs`), fusion buffer allocations."""
        with self._lock:
            controllers = list(self._controllers.values()) + self._retired
        return {"cycles": sum(c.cycles for c in controllers),
                "negotiations": sum(c.negotiations for c in controllers),
                "full_exchanges": sum(c.full_exchanges for c in controllers),
                "collectives": sum(c.executor.collectives for c in controllers),
                "planned_cycles": sum(c.planner.planned_cycles for c in controllers),
                "lent_cycles": sum(c.lent_cycles for c in controllers),
                "fusion_allocations": sum(c.executor.buffers.allocations for c in controllers)}

    def set_stats(self, set_id: int) -> dict[str, int]:
        """The counters of one set's controller on this rank (KeyError when it has none)."""
        c = self._controllers[set_id]
        return {"cycles": c.cycles, "negotiations": c.negotiations,
                "full_exchanges": c.full_exchanges, "collectives": c.executor.collectives}

    @property
    def executor(self) -> Any:
        """The global set's executor (benchmarks tune its fusion threshold)."""
        return self._global.executor

    @property
    def _thread(self) -> threading.Thread | None:  # tests read the global thread's CPU time
        return self._global.thread

    @property
    def _comm(self) -> Communicator:  # tests count the global negotiation's calls
        return self._global.comm
