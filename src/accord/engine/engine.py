"""The background engine: one thread per process that negotiates and runs named collectives.

Callers :meth:`Engine.enqueue` requests and get handles. The thread ("accord-engine") sleeps on a
condition until something is submitted (then gathers more: see :mod:`accord.engine.intake`) or
until an idle tick, so peers waiting on this rank make progress and stalls are noticed without spinning.
Each cycle: one negotiation allreduce (plus a full exchange when a rank has something new),
then the ready requests run in the agreed order through :class:`~accord.engine.execute.Executor`.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Sequence

import torch

from accord.comm.backend import Communicator
from accord.comm.ops import ReduceOp
from accord.engine import negotiate as neg
from accord.engine.execute import CommunicationFailure, Executor
from accord.engine.intake import Intake
from accord.engine.join import JoinState, stand_in
from accord.engine.request import Handle, Request
from accord.engine.sets import ProcessSetRegistry
from accord.engine.settings import EngineSettings
from accord.engine.stall import StallInspector
from accord.engine.timeline import Timeline
from accord.engine.validate import validate_group
from accord.errors import (CollectiveError, MismatchError, RankFailedError, ShutdownError,
                           with_hint)

log = logging.getLogger("accord.engine")


class Engine:
    """Request queue + negotiation + execution for one process. Start with :meth:`start`."""

    def __init__(self, rank: int, size: int, negotiation: Communicator, sets: ProcessSetRegistry,
                 settings: EngineSettings | None = None) -> None:
        self.rank, self.size = rank, size
        self.settings = settings or EngineSettings()
        self.sets = sets
        self._comm = negotiation
        self._cond = threading.Condition(threading.Lock())
        self._intake = Intake(self._cond, self.settings)
        self._inflight: dict[str, Request] = {}  # submitted and not yet completed, by name
        self._pending: dict[str, Request] = {}  # engine thread only: waiting for agreement
        self._stop_requested = False
        self._stopped = False
        self._stop_error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._timeline: Timeline | None = None
        self.joined = False  # engine thread only: this rank has joined (see accord.engine.join)
        self._join = JoinState()
        self._join_requested = False
        self.cache = neg.ResponseCache(self.settings.cache_capacity)
        s = self.settings
        self.stall = StallInspector(s.stall_check_time, s.stall_shutdown_time, s.stall_check_disable)
        self.executor = Executor(sets, s.fusion_threshold, self._complete)
        self.cycles = self.negotiations = self.full_exchanges = 0

    # --- caller side ---------------------------------------------------------------------

    def start(self) -> None:
        """Start the background thread (and the ACCORD_TIMELINE timeline, if set)."""
        if self._thread is not None:
            raise RuntimeError("engine already started")
        if self.settings.timeline:
            self.start_timeline(self.settings.timeline, self.settings.timeline_mark_cycles)
        self._thread = threading.Thread(target=self._main, name="accord-engine", daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        """True while the thread runs and no stop was requested or forced."""
        return self._thread is not None and self._thread.is_alive() and not self._stopped

    def enqueue(self, request: Request) -> Handle:
        """Submit ``request``; return its handle.

        Raises:
            ValueError: another request under the same name is in flight on this rank, or the
                request is invalid for its process set (membership, root, splits, op).
            ShutdownError / RankFailedError / StallError: the engine has stopped.
        """
        return self.enqueue_many((request,))[0]

    def enqueue_many(self, requests: Sequence[Request]) -> list[Handle]:
        """Submit ``requests`` (a group) all or none: if one is refused, none is queued, so no
        rank is left with part of a group its peers wait on. Raises as :meth:`enqueue` does,
        and ValueError for a name that appears twice in the group."""
        validate_group(requests, self.sets, self.rank)
        for request in requests:
            if request.signature.device == "cuda" and request.ready_event is None:
                request.ready_event = torch.cuda.Event()
                # the stream that produced the data: the tensor's device's, not the current one
                request.ready_event.record(torch.cuda.current_stream(request.tensor.device))
        with self._cond:
            if self._stopped or self._stop_requested or self._thread is None:
                raise self._stopped_error()
            for request in requests:
                if request.name in self._inflight:
                    raise ValueError(with_hint(
                        f"a {self._inflight[request.name].op.value} named {request.name!r} is already in "
                        f"flight on rank {self.rank}",
                        "synchronize the first handle before reusing the name, or use distinct names"))
            for request in requests:
                self._inflight[request.name] = request
                self._intake.put(request)
        return [r.handle for r in requests]

    def in_flight(self, name: str) -> bool:
        """True while a request named ``name`` is submitted on this rank and not completed."""
        with self._cond:
            return name in self._inflight

    def poll(self, handle: Handle) -> bool:
        """True when ``handle`` has completed (successfully or not). A caller polling an
        unfinished handle is waiting for it: the cycle that gathers requests starts now."""
        if handle.done():
            return True
        self._intake.hurry()
        return handle.done()

    def synchronize(self, handle: Handle) -> Any:
        """Wait for ``handle`` and return its result, re-raising the engine's error here.

        While a caller waits, the engine does not hold its cycle back for more requests: the
        waiting caller submits none, and a lone synchronous op starts at once.
        """
        if handle.done():
            return handle.result()
        with self._intake.waiting():
            while not handle.wait(0.5):
                if self._thread is None or not self._thread.is_alive():
                    handle.wait(0.5)  # the thread fails every request before it exits
                    if not handle.done():
                        raise self._stopped_error()
        return handle.result()

    def join(self, device: int = -1) -> int:
        """Horovod's join: this rank has no more data. Until every rank has joined, this rank
        takes part in the collectives the others submit (see :mod:`accord.engine.join`).

        Args:
            device: CUDA device index for stand-in tensors of CUDA collectives (-1: current).
        Returns:
            The rank that joined last (the same on every rank).
        Raises:
            ValueError: join() is already waiting on this rank (another thread called it).
            ShutdownError / RankFailedError / StallError: the engine stopped.
        """
        with self._cond:
            if self._stopped or self._stop_requested or self._thread is None:
                raise self._stopped_error()
            if self._join.handle is not None:
                raise ValueError(with_hint(f"join() is already waiting on rank {self.rank}",
                                           "call join() from one thread only"))
            handle = self._join.handle = Handle("join")
            # Resolved here, on the caller's thread: the engine thread's current CUDA device is
            # always 0 (it never picks one), and stand-ins must go where this rank's GPU is.
            if device < 0 and torch.cuda.is_available():
                device = torch.cuda.current_device()
            self._join.device = int(device)
            self._join_requested = True
            self._cond.notify()
        return int(self.synchronize(handle))

    def shutdown(self, timeout: float | None = None) -> None:
        """Ask every rank's engine to stop after the current cycle, and wait for ours."""
        with self._cond:
            self._stop_requested = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(self.settings.collective_timeout + 10 if timeout is None else timeout)
        self.stop_timeline()

    def start_timeline(self, path: str, mark_cycles: bool = False) -> None:
        """Record a chrome://tracing timeline to ``path`` (rank 0 writes; others ignore)."""
        if self.rank != 0:
            return
        self.stop_timeline()
        self._timeline = self.executor.timeline = Timeline(path, self.rank, mark_cycles)

    def stop_timeline(self) -> None:
        """Finish and close the timeline file, if one is open."""
        tl, self._timeline = self._timeline, None
        self.executor.timeline = None
        if tl is not None:
            tl.close()

    def inflight_names(self, process_set_id: int | None = None) -> list[str]:
        """Names submitted on this rank and not yet completed (optionally of one process set)."""
        with self._cond:
            return sorted(n for n, r in self._inflight.items()
                          if process_set_id is None or r.process_set_id == process_set_id)

    def stats(self) -> dict[str, int]:
        """Counters: cycles, negotiation collectives, full exchanges, data collectives."""
        return {"cycles": self.cycles, "negotiations": self.negotiations,
                "full_exchanges": self.full_exchanges, "collectives": self.executor.collectives,
                "fusion_allocations": self.executor.buffers.allocations}

    def _stopped_error(self) -> BaseException:
        if self._stop_error is not None:
            cls = type(self._stop_error)
            return cls(with_hint(f"the accord engine stopped after an earlier error: {self._stop_error}",
                                 "shut down and init() again (elastic training does this)"))
        return ShutdownError(with_hint("the accord engine is not running (shut down or never started)",
                                       "call init() before submitting collectives"))

    # --- engine thread -------------------------------------------------------------------

    def _complete(self, outcomes: Sequence[tuple[Request, Any, BaseException | None]]) -> None:
        # Names are released before handles complete, so a caller that waited may reuse them.
        with self._cond:
            for r, _, _ in outcomes:
                if self._inflight.get(r.name) is r:  # not a joined rank's stand-in
                    del self._inflight[r.name]
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
            error = RankFailedError(with_hint(
                f"a collective failed on rank {self.rank} of {self.size}: {failure}",
                "another rank probably died or stopped answering (ACCORD_COLLECTIVE_TIMEOUT="
                f"{self.settings.collective_timeout:g}s); the launcher's output and per-rank logs "
                "name the rank that failed first and its root cause"))
            error.__cause__ = failure.cause
        except BaseException as exc:  # a bug in the engine: never leave callers waiting
            log.exception("accord engine thread failed")
            error = CollectiveError(with_hint(f"the accord engine failed on rank {self.rank}: {exc!r}",
                                              "this is a bug in accord; please report it with the log"))
            error.__cause__ = exc
        finally:
            with self._cond:
                self._stopped = True
                self._stop_error = error
                leftovers = list(self._inflight.values())
                join_handle, self._join.handle = self._join.handle, None
            final = error or ShutdownError(with_hint(
                "the accord engine shut down while this request was pending",
                "synchronize every handle before shutdown(), and submit the same names on every rank"))
            self._complete([(r, None, final) for r in leftovers])
            if join_handle is not None:
                join_handle.set_exception(final)
            self._pending.clear()
            self.executor.buffers.clear()

    def _loop(self) -> BaseException | None:
        s = self.settings
        delay, needed = s.cycle_time, True
        while True:
            # A joined rank cycles without pausing: its peers' collectives need it, and each
            # cycle blocks in the negotiation until they come, so this does not spin. So does a
            # rank whose requests wait on peers that wait on nothing of its own: the peers enter
            # the next negotiation as soon as they submit, and should find this rank there.
            if self.joined or (self._pending and not needed):
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
        gathering first as :mod:`accord.engine.intake` describes."""
        with self._cond:
            if not self._intake.items and not self._stop_requested and not self._join_requested and pause > 0:
                self._cond.wait(pause)
            new = self._intake.take(lambda: self._stop_requested)
            stop = self._stop_requested
            if self._join_requested:  # set here, so a cycle's vector and payload agree
                self._join_requested, self.joined = False, True
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
        tl = self._timeline
        if tl is not None and pending:
            tl.cycle(now)
        by_id: dict[int, Request] = {}  # pending requests that match a cache entry
        unknown = uncached = False
        for r in pending:
            i = self.cache.id_of(r.name, r.signature)
            if i is not None:
                by_id[i] = r
            elif not r.announced:
                unknown = True
            else:
                uncached = True
        oldest = min((r.submitted_at for r in pending), default=None)
        want_full = unknown or self.joined or self.stall.due(now, oldest)
        vec = neg.build_vector(by_id, len(self.cache), want_full=want_full, shutdown=stop_local,
                               joined=self.joined, uncached=uncached)
        sums = self._negotiate(vec)
        stop: BaseException | bool | None = bool(sums[neg.SHUTDOWN]) or None
        decision, joined = None, None
        if sums[neg.WANT_FULL]:
            decision, joined = self._full_exchange(pending, now)
            for name, message in decision.errors.items():
                r = self._pending.pop(name, None)
                if r is not None:
                    self._complete([(r, None, MismatchError(message))])
            stall_error = self.stall.review(decision.partial, now)
            if stall_error is not None:
                stop = stall_error
            needed = any(self.rank in p.missing for p in decision.partial)
            ready = []
            for name in decision.ready:
                r = self._pending.get(name)
                if r is not None:
                    ready.append(self._pending.pop(name))
                elif self.joined:
                    sig, members = decision.agreed[name]
                    if self.rank in members:
                        ready.append(stand_in(name, sig, members, self._join.device))
        else:
            ready_ids = neg.ready_from_counts(sums, self.cache)
            self.cache.touch(ready_ids, self.cycles)
            needed = neg.peers_wait_on_me(sums, vec, uncached)
            # The cache did not change this cycle: the ids matched above still hold. (An id
            # ready without a request here is a process set this rank is not in.)
            ready = [self._pending.pop(by_id[i].name) for i in ready_ids if i in by_id]
        if tl is not None:
            done = time.monotonic()
            for r in ready:
                tl.span(r.name, "NEGOTIATE_" + r.op.value.upper(), r.submitted_at, done)
        self.executor.run(ready)
        if tl is not None:
            tl.maybe_flush()
        if joined is not None:
            last = self._join.observe(joined, self.size)
            if last is not None:  # every rank has joined: all of them return, in this cycle
                self.joined = False
                with self._cond:
                    handle, self._join.handle = self._join.handle, None
                if handle is not None:
                    handle.set_result(last)
        return bool(ready), stop, needed

    def _negotiate(self, vec: list[int]) -> list[int]:
        t = torch.tensor(vec, dtype=torch.int32)
        try:
            self._comm.allreduce(t, ReduceOp.SUM)
        except Exception as exc:
            raise CommunicationFailure(list(self._pending.values()), exc) from exc
        self.negotiations += 1
        return t.tolist()

    def _full_exchange(self, pending: list[Request], now: float) -> tuple[neg.Decision, list[int]]:
        """Exchange every rank's pending names; return the decision and the joined ranks."""
        self.full_exchanges += 1
        sets = {i: self.sets.members(i) for i in {r.process_set_id for r in pending} if i != 0}
        payload = neg.encode_pending([(r.name, r.signature, now - r.submitted_at) for r in pending],
                                     sets, self.joined)
        try:
            gathered = self._comm.allgather(torch.frombuffer(bytearray(payload), dtype=torch.uint8))
        except Exception as exc:
            raise CommunicationFailure(pending, exc) from exc
        for r in pending:
            r.announced = True
        exchange = neg.split_payloads(gathered.numpy().tobytes(), self.size)
        return neg.decide(exchange, self.cache, self.cycles), exchange.joined
