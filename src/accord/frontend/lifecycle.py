"""Horovod's ``init`` and ``shutdown``, for every frontend: start the engine, register the
process sets passed to ``init``, stop it again.

A frontend that must do more around them (accord.torch forgets its integer handles and lets a
worker added to a running elastic job wait for its place) registers hooks with
:func:`add_hooks` instead of wrapping these functions. There is one engine per process, so the
hooks of every frontend imported run, whichever frontend's ``init`` is called.
"""
from __future__ import annotations

import atexit
from typing import Any, Callable

from accord import engine
from accord.errors import with_hint
from accord.frontend import process_sets as sets

Hook = Callable[[], None]

_before_start: list[Hook] = []
_after_shutdown: list[Hook] = []
_atexit_registered = False


def add_hooks(*, before_start: Hook | None = None, after_shutdown: Hook | None = None) -> None:
    """Run ``before_start`` in every ``init`` that starts the engine, before it starts, and
    ``after_shutdown`` after every ``shutdown`` (also when stopping the engine failed). Hooks
    run in the order they were added; adding a hook again changes nothing."""
    for hook, hooks in ((before_start, _before_start), (after_shutdown, _after_shutdown)):
        if hook is not None and hook not in hooks:
            hooks.append(hook)


def init(comm: Any = None, process_sets: Any = None) -> None:
    """Start accord (meet the other ranks, start the engine); a no-op when already initialized.

    Args:
        comm: None (every rank), a list of ranks (must be every rank: accord runs one job per
            set of processes), or an mpi4py communicator spanning every rank.
        process_sets: None, ``"dynamic"`` (accepted for compatibility: sets may always be
            added later), or a list of :class:`~accord.frontend.process_sets.ProcessSet` to
            register now.

    Raises:
        ValueError: a duplicate process set (accord stays initialized, as Horovod does), or
            ``comm`` is neither a list of ranks nor an mpi4py communicator.
        NotImplementedError: ``comm`` names a subset.
        RendezvousError: the ranks could not meet.
    """
    process_sets = engine.sets_given_at_init(process_sets)
    if engine.is_initialized():
        if process_sets:  # as Horovod: each init(process_sets=...) resolves (and checks) its sets
            sets.register_at_init(process_sets, first=False)
        return
    global _atexit_registered
    if not _atexit_registered:  # like Horovod: leave the job cleanly when the script ends
        atexit.register(shutdown)
        _atexit_registered = True
    for hook in list(_before_start):
        hook()
    engine.init()
    try:
        _check_comm(comm)
    except BaseException:
        shutdown()
        raise
    # A duplicate set raises ValueError with accord left initialized, as in Horovod (whose core
    # is up by then): the script may call init again with a valid list.
    sets.register_at_init(process_sets, first=True)


def _check_comm(comm: Any) -> None:
    if comm is None:
        return
    n = engine.topology().size
    if hasattr(comm, "Get_size"):
        given = comm.Get_size()
        covered, shown = given == n, f"<an mpi4py communicator of {given} ranks>"
    else:
        try:
            ranks = sorted(int(r) for r in comm)
        except TypeError:
            raise ValueError("Invalid type of argument comm. Expected list of rank integers or "
                             "mpi4py.MPI.Comm object.") from None
        covered, shown = ranks == list(range(n)), str(list(comm))
    if not covered:
        raise NotImplementedError(with_hint(
            f"init(comm={shown}) names a subset of the {n} ranks, which is not supported",
            "start only the ranks you need, or use init() and a ProcessSet for the subset"))


def shutdown() -> None:
    """Stop the engine and leave the job; ``init()`` works again afterwards. Idempotent."""
    try:
        engine.shutdown()
    finally:
        sets.forget_all()
        for hook in list(_after_shutdown):
            hook()
