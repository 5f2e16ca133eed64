"""Join as a controller runs it: when a rank enters and leaves the joined state, and join()'s end.

:mod:`accord.engine.negotiation.join` says what join means and builds the stand-ins; this module is the
controller's side of it, one part of :class:`~accord.engine.cycle.controller.Controller`:

- **entering and leaving** happens only at a cycle boundary (:meth:`JoinControl.take`,
  under the controller's lock), so one cycle's negotiation vector and exchange payload agree
  on whether this rank is joined. The global set's controller enters on ``join()``; every other
  set follows the global one (:meth:`JoinControl.set_joined`).
- **while joined**, every full exchange's ready names this rank did not submit run as stand-ins.
- **join() ends** once the global set sees every rank joined (it returns the last one), when
  this rank, joined, is the root of a rooted collective its peers submitted (it raises, as they
  do), or when the controller stops first (it raises ShutdownError).
"""
from __future__ import annotations

import threading
from typing import Callable

from accord.engine.cycle.state import CycleState
from accord.engine.negotiation import negotiate as neg
from accord.engine.negotiation.join import JoinState, stand_in
from accord.engine.request import Handle, Request
from accord.engine.sets import GLOBAL_ID
from accord.errors import MismatchError, ShutdownError, with_hint

OnJoined = Callable[[], None]
OnJoinError = Callable[[BaseException], None]
Negotiate = Callable[[list[int]], list[int]]


class JoinControl:
    """The controller's join state (see the module). Methods :meth:`request_join`,
    :meth:`set_joined` and :meth:`abort_join` are called by the engine on a caller's thread; the
    others on the controller's thread.

    Args:
        state: the controller's shared state (its lock, the set, whether it stopped).
        on_all_joined: (global set) called once every rank has joined, before join() returns.
        on_join_error: called when this rank, joined, is the root of a rooted collective its
            peers submitted.
    """

    def __init__(self, state: CycleState, on_all_joined: OnJoined | None,
                 on_join_error: OnJoinError | None) -> None:
        self._state = state
        self._on_all_joined = on_all_joined
        self._on_join_error = on_join_error
        self.joined = False  # controller thread only: this rank is joined in this set
        self.join_state = JoinState()
        self.all_joined = False  # every member was joined in the last full exchange
        # Asked for by callers, taken at the next cycle (under cond); ``changed`` says any is
        # waiting, so the cycle checks one flag, not three.
        self.changed = False
        self._join_requested = False
        self._join_abort: BaseException | None = None  # fail join() at the next cycle
        # Other sets follow the global join: (joined, device) to take at the next cycle, and
        # the event set once taken (see set_joined).
        self._join_target: tuple[bool, int] | None = None
        self._join_ack: threading.Event | None = None

    # --- caller side ---------------------------------------------------------------------

    def request_join(self, handle: Handle, device: int) -> None:
        """Make this (global) controller's rank join from its next cycle (the caller holds ``cond``)."""
        self.join_state.handle = handle
        self.join_state.device = device
        self._join_requested = self.changed = True
        self._state.cond.notify()

    def set_joined(self, joined: bool, device: int = -1) -> threading.Event:
        """Make this (non-global) set's controller serve its peers' collectives with stand-ins
        (or stop doing so) from its next cycle; the returned event is set once it has: every
        cycle after it uses the new state."""
        with self._state.cond:
            if self._join_ack is not None:
                self._join_ack.set()  # superseded
            ack = self._join_ack = threading.Event()
            self._join_target = (joined, device)
            self.changed = True
            if self._state.stopped:
                ack.set()
            self._state.cond.notify()
        return ack

    def abort_join(self, error: BaseException) -> None:
        """(Global set) leave join at the next cycle; this rank's join() raises ``error``."""
        with self._state.cond:
            self._join_abort = error
            self.changed = True
            self._state.cond.notify()

    # --- controller thread ---------------------------------------------------------------

    def take(self) -> tuple[Handle, BaseException] | None:
        """Apply what callers asked for (the caller holds ``cond`` and saw ``changed``);
        returns a join() to fail with its error, to complete once ``cond`` is released."""
        self.changed = False
        if self._join_requested:
            self._join_requested, self.joined = False, True
        if self._join_target is not None:
            (self.joined, self.join_state.device), self._join_target = self._join_target, None
            assert self._join_ack is not None
            self._join_ack.set()
        aborted, self._join_abort = self._join_abort, None
        if aborted is None or not self.joined:
            return None
        self.joined = False
        handle, self.join_state.handle = self.join_state.handle, None
        return (handle, aborted) if handle is not None else None

    def stand_in(self, decision: neg.Decision, name: str) -> Request | None:
        """The stand-in this joined rank runs for a ready ``name`` it did not submit (None when
        this rank is not in the name's process set)."""
        sig, members = decision.agreed[name]
        return stand_in(name, sig, members, self.join_state.device) if self._state.rank in members else None

    def check_joined_roots(self, decision: neg.Decision) -> None:
        """A joined rank named root of a rooted collective it never submitted should have sent
        it: its join() fails with the error the submitting ranks get."""
        if self._on_join_error is None:
            return
        mine = sorted(n for n, root in decision.joined_roots.items() if root == self._state.rank)
        if mine:
            self._on_join_error(MismatchError(decision.errors[mine[0]]))

    def saw_joined(self, joined: list[int], negotiate: Negotiate) -> None:
        """After a full exchange: who is joined now (the global set also decides join()'s end).
        ``negotiate``: the set's negotiation, which synchronizes every rank before join() returns."""
        size = self._state.size
        self.all_joined = len(joined) == size
        if self._state.set_id != GLOBAL_ID:
            return
        last = self.join_state.observe(joined, size)
        if last is not None:  # every rank has joined: all of them return, in this cycle
            self.joined = False
            if self._on_all_joined is not None:
                self._on_all_joined()
                negotiate([0])  # every rank's other sets have left join: now return
            with self._state.cond:
                handle, self.join_state.handle = self.join_state.handle, None
            if handle is not None:
                handle.set_result(last)

    def release(self) -> Handle | None:
        """The controller stops (the caller holds ``cond``): release set_joined()'s waiter and
        take the join() still waiting, if any."""
        if self._join_ack is not None:
            self._join_ack.set()
        handle, self.join_state.handle = self.join_state.handle, None
        return handle

    def fail(self, handle: Handle, error: BaseException | None) -> None:
        """Fail a join() the stop left waiting: with the stop's error, else a ShutdownError."""
        handle.set_exception(error or ShutdownError(with_hint(
            f"join() on rank {self._state.rank} was waiting for the other ranks when the accord "
            "engine shut down: a rank called shutdown() before joining (it failed, or "
            "finished without calling join())",
            "make every rank call join() before shutdown(); the other ranks' output shows "
            "why one stopped")))
