"""A caller that waits runs the planned cycle on its own thread.

In the planned state (:mod:`accord.engine.cycle.plan`) a cycle needs no negotiation: once every name
of the plan is submitted, the controller's thread only runs one data collective. For a
synchronous call (``hvd.allreduce``) that still costs two thread hand-offs, caller to
controller and back, which across hosts on a busy machine add as much as the Python work of
the cycle itself (a lone 1 KB allreduce). So when a caller starts waiting on a handle
and the plan is complete with its request, the caller borrows the controller's role for that
one cycle:

- **Lending** happens under the controller's lock, and only while the controller's thread is
  parked in its wait for submissions (it has not returned from that wait, even if notified), so
  it is not using the communicator and does not touch its pending requests. The requests
  queued for it move to pending, as the thread would have moved them.
- **The borrowed cycle** is exactly the thread's planned cycle (:meth:`PlannedCycles.step`),
  with autograd off as on the thread. If a member left the plan, the requests stay pending and
  the plan is left, as on the thread.
- **Returning**: the thread, woken while the role is lent, waits until it comes back, still
  parked; if the lent cycle left it nothing to do it parks again for the rest of its wait (so
  that an ``allreduce_async`` + ``synchronize`` loop, whose submissions wake the thread, keeps
  lending every cycle). A failure of the borrowed collective is handed to the thread, which
  stops the controller exactly as if its own collective had failed (every pending handle, the
  caller's included, gets the error).

Anything else (no plan, an incomplete plan, extra requests, stop, join, the thread busy) leaves
the work to the thread.
"""
from __future__ import annotations

import time

import torch

from accord.engine.cycle.join_control import JoinControl
from accord.engine.cycle.plan import PlannedCycles
from accord.engine.cycle.state import CycleState
from accord.engine.request import Handle
from accord.errors import CollectiveError, with_hint


class CallerRuns:
    """The lending of a controller's planned cycle to a waiting caller: one part of
    :class:`~accord.engine.cycle.controller.Controller`. :meth:`run_here` is called on a
    caller's thread, :meth:`wait_parked` on the controller's thread.

    Args:
        state: the controller's shared state (its lock, queue, pending requests, stop flag).
        planned: the planned state whose cycle is lent.
        join: join's requests and state (a joined rank, or one about to change, lends nothing).
    """

    def __init__(self, state: CycleState, planned: PlannedCycles, join: JoinControl) -> None:
        self._state = state
        self._planned = planned
        self._join = join
        self._parked = False  # the controller's thread is inside its wait for submissions
        self._lent = False  # a caller runs the planned cycle
        self._lent_failure: BaseException | None = None  # for the thread to stop on
        self._awaiting_return = False  # the parked thread waits for a lent role to come back
        self.lent_cycles = 0  # planned cycles run on a caller's thread (tests read it)

    def run_here(self, handle: Handle) -> bool:
        """Run the planned cycle on this (caller's) thread if it is complete with ``handle``'s
        request and the controller's thread is parked; return whether it ran here."""
        state = self._state
        with state.cond:
            if not self._lendable(handle):
                return False
            for r in state.intake.take_now():
                state.pending[r.name] = r
            self._lent = True
        failure: BaseException | None = None
        # Autograd off as on the thread. Set directly: the no_grad context manager builds three
        # objects per call, a few microseconds on a path whose whole cost is tens of them.
        grad = torch.is_grad_enabled()
        try:
            if grad:
                torch._C._set_grad_enabled(False)
            self._planned.step(False)
        except BaseException as exc:  # noqa: B036 (handed to the thread, then re-raised if not an Exception)
            failure = exc
        finally:
            if grad:
                torch._C._set_grad_enabled(True)
        with state.cond:
            self._lent = False
            self.lent_cycles += 1
            if failure is not None:
                self._lent_failure = failure if isinstance(failure, Exception) else CollectiveError(with_hint(
                    f"a collective run on rank {state.rank}'s calling thread was interrupted: {failure!r}",
                    "the engine stops; shut down and init() again"))
            # A thread still in its timed wait needs no wake after a planned cycle that ran (it
            # re-reads the plan's deadline); waking it costs a core the next caller may need.
            if failure is not None or self._planned.plan is None or state.pending or self._awaiting_return:
                state.cond.notify_all()
        if failure is not None and not isinstance(failure, Exception):
            raise failure
        return True

    def _lendable(self, handle: Handle) -> bool:
        """Whether the plan is complete with ``handle``'s request and nothing else is due (the
        caller holds ``cond``)."""
        state = self._state
        plan = self._planned.plan
        if (plan is None or not self._parked or self._lent or state.stop_requested or self._join.changed
                or self._join.joined or handle.done()):
            return False
        queued = {r.name: r for r in state.intake.items}
        pending = state.pending
        if len(queued) + len(pending) != len(plan.names) or any(n in pending for n in queued):
            return False
        mine = False
        for i, name in zip(plan.ids, plan.names):
            r = queued.get(name) or pending.get(name)
            if r is None or state.cache.id_of(name, r.signature) != i:
                return False
            mine = mine or r.handle is handle
        return mine

    def wait_parked(self, pause: float) -> None:
        """The controller thread's wait for submissions (it holds ``cond``): lendable while in
        it; returns only once a lent cycle is back, raising its failure.

        The thread stays parked while it waits for a lent role to come back, and parks again
        for the rest of ``pause`` when the lent cycle left it nothing to do: otherwise, woken
        by the submission that the caller then ran itself, it would find the caller's next
        request first and take it over (an ``allreduce_async`` + ``synchronize`` loop would
        hand every other cycle to the thread)."""
        cond = self._state.cond
        deadline = time.monotonic() + pause
        lent_at_park = self.lent_cycles
        self._parked = True
        try:
            cond.wait(pause)
            while True:
                while self._lent:
                    self._awaiting_return = True  # the caller wakes the thread when it is back
                    cond.wait()
                self._awaiting_return = False
                failure, self._lent_failure = self._lent_failure, None
                if failure is not None:
                    raise failure
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self.lent_cycles == lent_at_park or not self._idle_after_lending():
                    return
                cond.wait(remaining)
        finally:
            self._parked = self._awaiting_return = False

    def _idle_after_lending(self) -> bool:
        """Whether the thread has nothing to do after a lent cycle: still planned, nothing
        pending or queued, no stop or join to handle (it holds ``cond``)."""
        state = self._state
        return (self._planned.plan is not None and not state.pending and not state.intake.items
                and not state.stop_requested and not self._join.changed)
