"""SyncBatchNorm's ``comm_scope`` (Perseus' convention), for every frontend: ``'global'`` (or 1)
synchronizes over every rank, ``'local'`` (or 0) over the ranks of this rank's host, whose
process set is registered here."""
from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence, TypeVar

from accord import engine
from accord.errors import with_hint
from accord.runtime.groups import local_sets


class _FrontendSet(Protocol):
    process_set_id: int | None


SetT = TypeVar("SetT", bound=_FrontendSet)


def scope_name(comm_scope: Any) -> str:
    """``'global'`` for 1 / 'global', ``'local'`` for 0 / 'local'.

    Raises:
        ValueError: anything else (with a HINT).
    """
    if comm_scope in ("global", 1):
        return "global"
    if comm_scope in ("local", 0):
        return "local"
    raise ValueError(with_hint(f"comm_scope must be 'global' or 'local' (or 1 / 0), got {comm_scope!r}",
                               "use 'global' (1) to synchronize over every rank, 'local' (0) within a host"))


def host_set() -> tuple[int, tuple[int, ...]]:
    """The id and ranks of this rank's host's process set (the global set on one host).

    Collective the first time: every rank registers every host's set, in the same order.
    """
    topo = engine.topology()
    if topo.local_size == topo.size:
        return engine.GLOBAL_ID, tuple(range(topo.size))
    mine = None
    for ranks in local_sets(topo):
        set_id = engine.find_process_set(ranks)
        if set_id is None:
            set_id = engine.add_process_set(list(ranks))
        if topo.rank in ranks:
            mine = set_id, tuple(ranks)
    assert mine is not None
    return mine


def host_process_set(make: Callable[[Sequence[int]], SetT], global_set: SetT) -> SetT:
    """This rank's host's set as a frontend's ProcessSet: ``global_set`` on one host, else
    ``make(ranks)`` bound to the registered id (collective the first time, as :func:`host_set`)."""
    set_id, ranks = host_set()
    if set_id == engine.GLOBAL_ID:
        return global_set
    mine = make(list(ranks))
    mine.process_set_id = set_id
    return mine
