"""``init`` and ``shutdown`` for accord.mxnet: the session, and the process sets registered with it."""
from __future__ import annotations

import atexit
from typing import Any

from accord.engine import session
from accord.engine.sets import sets_given_at_init
from accord.errors import with_hint
from accord.mxnet import process_sets as sets

_atexit_registered = False


def init(comm: Any = None, process_sets: Any = None) -> None:
    """Join the job and start accord's engine; a no-op when already initialized.

    Args:
        comm: None, or a list of every rank (accord runs one job per set of processes).
        process_sets: None, ``"dynamic"`` (sets may always be added later), or a list of
            :class:`~accord.mxnet.ProcessSet` to register now.
    Raises:
        ValueError: a duplicate process set (accord stays initialized, as Horovod does).
            NotImplementedError: ``comm`` names a subset.
        RendezvousError: the ranks could not meet.
    """
    process_sets = sets_given_at_init(process_sets)
    if session.is_initialized():
        if process_sets:  # as Horovod: each init(process_sets=...) resolves (and checks) its sets
            sets.register_at_init(process_sets, first=False)
        return
    global _atexit_registered
    if not _atexit_registered:
        atexit.register(shutdown)
        _atexit_registered = True
    session.init()
    try:
        if comm is not None and sorted(int(r) for r in comm) != list(range(session.topology().size)):
            raise NotImplementedError(with_hint(
                f"init(comm={list(comm)}) names a subset of the {session.topology().size} ranks",
                "start only the ranks you need, or use init() and a ProcessSet for the subset"))
    except BaseException:
        shutdown()
        raise
    sets.register_at_init(process_sets, first=True)  # a duplicate leaves accord initialized


def shutdown() -> None:
    """Stop the engine and leave the job; ``init()`` works again afterwards. Idempotent."""
    try:
        session.shutdown()
    finally:
        sets.forget_all()
