"""Horovod's process sets for MXNet: ``ProcessSet``, ``global_process_set``,
``add_process_set`` and ``remove_process_set`` over accord's session.

A :class:`ProcessSet` names global ranks and gets its ``process_set_id`` when registered
(``hvd.init(process_sets=[...])`` or ``hvd.add_process_set``, collective: every rank makes the
same calls in the same order). ``root_rank`` arguments stay global ranks, as in Horovod.
"""
from __future__ import annotations

from typing import Sequence

from accord.engine import session
from accord.frontend.set_union import duplicate_error, register_init_sets
from accord.mxnet import basics


class ProcessSet:
    """A set of global ranks that run collectives together."""

    def __init__(self, ranks: Sequence[int]) -> None:
        try:
            values = list(ranks)
        except TypeError:
            values = [None]
        if any(not isinstance(r, int) or isinstance(r, bool) for r in values):
            raise ValueError("ProcessSet should be initialized with a list of process ranks")
        self.ranks: list[int] = sorted(values)
        self.process_set_id: int | None = None

    def size(self) -> int | None:
        """Number of ranks in the set; None while it is not registered."""
        if self.process_set_id is None:
            return None
        return len(basics.members(self.process_set_id))

    def rank(self) -> int | None:
        """This process's rank within the set; None while it is not registered.

        Raises:
            ValueError: this process is not in the set.
        """
        if self.process_set_id is None:
            return None
        members = basics.members(self.process_set_id)
        if basics.rank() not in members:
            raise ValueError("Process is not part of provided process set.")
        return members.index(basics.rank())

    def included(self) -> bool | None:
        """Whether this process belongs to the set; None while it is not registered."""
        if self.process_set_id is None:
            return None
        return basics.rank() in basics.members(self.process_set_id)

    def __repr__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0
_registered: dict[int, ProcessSet] = {}


def set_id(process_set: ProcessSet) -> int:
    """The id of a registered set.

    Raises:
        ValueError: the set is not registered.
    """
    if process_set.process_set_id is None:
        raise ValueError(f"{process_set} is not registered; pass it to hvd.init(process_sets=[...]) "
                         "or hvd.add_process_set() first\nHINT: register the process set on every rank")
    return process_set.process_set_id


def register_at_init(process_sets: list[ProcessSet], first: bool) -> None:
    """Give the sets passed to ``init`` their ids (the global set gets every rank). Every rank's
    sets are registered on every rank (:mod:`accord.frontend.set_union`).

    Raises:
        ValueError: an entry duplicates an earlier one or the global set (Horovod's message);
            accord stays initialized, as Horovod does.
    """
    global_process_set.process_set_id = 0
    global_process_set.ranks = list(range(basics.size()))
    ids = register_init_sets([ps.ranks for ps in process_sets], first)
    for index, (ps, set_id) in enumerate(zip(process_sets, ids)):
        if set_id is None:
            raise duplicate_error(index, ps)
        ps.process_set_id = set_id
        _registered[set_id] = ps


def forget_all() -> None:
    """Unregister every set object (shutdown)."""
    for ps in _registered.values():
        ps.process_set_id = None
    _registered.clear()


def add_process_set(process_set: ProcessSet | Sequence[int]) -> ProcessSet:
    """Register a process set on every rank (collective) and return it.

    Raises:
        ValueError: not initialized, invalid ranks, or a set with the same ranks exists.
    """
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    basics.topology()
    if basics.find_set(process_set.ranks) is not None:
        raise ValueError(f"Attempted to add a duplicate process set: {process_set}")
    process_set.process_set_id = session.add_process_set(process_set.ranks)
    _registered[process_set.process_set_id] = process_set
    return process_set


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister ``process_set`` on every rank (collective); False for the global set or a set
    that is not registered."""
    sid = process_set.process_set_id
    if sid is None or sid == 0:
        return False
    basics.topology()
    process_set.process_set_id = None
    _registered.pop(sid, None)
    if sid not in session.process_sets():
        return False
    session.remove_process_set(sid)
    return True
