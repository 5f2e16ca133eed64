"""Horovod's process sets, for every frontend: ``ProcessSet``, ``global_process_set``,
``add_process_set`` and ``remove_process_set`` (Horovod keeps them in
``horovod/common/process_sets.py``, shared by its frameworks).

A :class:`ProcessSet` is a user-held handle on a subset of global ranks. It gets its
``process_set_id`` when it is registered (``hvd.init(process_sets=[...])`` or
``hvd.add_process_set``) and loses it when removed or when accord shuts down. Collectives take it
as ``process_set=``; ``root_rank`` arguments stay *global* ranks, as in Horovod. accord.torch and
accord.mxnet run on one engine in one process, so they share these objects too.

Unlike Horovod, adding and removing sets after init needs no ``HOROVOD_DYNAMIC_PROCESS_SETS``:
it is always allowed (every rank must make the same calls in the same order).
"""
from __future__ import annotations

from typing import Any, Sequence

from accord import engine
from accord.errors import InvalidArgumentError, with_hint
from accord.frontend import queries
from accord.frontend.set_union import duplicate_error, register_init_sets

_BAD_ARGUMENT = "ProcessSet should be initialized with a list of process ranks or an mpi4py Comm object"


class ProcessSet:
    """A set of global ranks that run collectives together.

    Build it from a list of ranks (or an mpi4py communicator when running under MPI), then pass
    it to ``hvd.init(process_sets=[...])`` or ``hvd.add_process_set``.

    Args:
        ranks_or_comm: global ranks, in any order (kept sorted), or an mpi4py communicator.

    Raises:
        ValueError: neither a list of int ranks nor an mpi4py communicator (Horovod's message).
    """

    process_set_id: int | None = None
    ranks: list[int] | None = None
    mpi_comm: Any = None

    def __init__(self, ranks_or_comm: Sequence[int] | Any) -> None:
        """Take global ranks (in any order) or an mpi4py communicator.

        Raises:
            ValueError: neither a list of int ranks nor an mpi4py communicator (Horovod's message).
        """
        if _is_iterable(ranks_or_comm):
            ranks = list(ranks_or_comm)
            if any(not isinstance(r, int) or isinstance(r, bool) for r in ranks):
                raise ValueError(_BAD_ARGUMENT)
            self.ranks = sorted(ranks)
        else:
            if not hasattr(ranks_or_comm, "Get_group") or not hasattr(ranks_or_comm, "Get_size"):
                raise ValueError(_BAD_ARGUMENT)
            self.mpi_comm = ranks_or_comm

    def _invalidate(self) -> None:
        self.process_set_id = None

    def size(self) -> int | None:
        """Number of ranks in the set.

        Returns:
            The member count, or None while the set is not registered.

        Raises:
            ValueError: accord is not initialized.
        """
        if self.process_set_id is None:
            return None
        return len(queries.process_set_members(self.process_set_id))

    def rank(self) -> int | None:
        """This process's rank within the set.

        Returns:
            Its index among the set's members (ascending global ranks), or None while the set
            is not registered.

        Raises:
            ValueError: this process is not in the set, or accord is not initialized.
        """
        if self.process_set_id is None:
            return None
        members = queries.process_set_members(self.process_set_id)
        me = queries.rank()
        if me not in members:
            raise ValueError("Process is not part of provided process set.")
        return members.index(me)

    def included(self) -> bool | None:
        """Whether this process belongs to the set.

        Returns:
            True or False; None while the set is not registered (as in Horovod: an unregistered
            set has no members yet, whatever ranks it names).

        Raises:
            ValueError: the engine is not initialized.
        """
        if self.process_set_id is None:
            return None
        return queries.rank() in queries.process_set_members(self.process_set_id)

    def __str__(self) -> str:
        return (f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, "
                f"mpi_comm={self.mpi_comm})")

    __repr__ = __str__


def _is_iterable(value: Any) -> bool:
    try:
        iter(value)
    except TypeError:
        return False
    return True


def _ranks_of_comm(comm: Any) -> list[int]:
    """Global ranks (in the job's world communicator) of an mpi4py communicator's members."""
    from mpi4py import MPI  # only reached when the user passed an mpi4py communicator

    group = comm.Get_group()
    world = MPI.COMM_WORLD.Get_group()
    ranks = MPI.Group.Translate_ranks(group, list(range(group.Get_size())), world)
    return sorted(int(r) for r in ranks)


global_process_set = ProcessSet([])
global_process_set.process_set_id = engine.GLOBAL_ID

# Sets registered through this module, so shutdown can invalidate them (id -> object).
_registered: dict[int, ProcessSet] = {}


def set_id_of(process_set: ProcessSet) -> int:
    """The registered id of ``process_set``.

    Raises:
        InvalidArgumentError (a ValueError and a RuntimeError): the set is not registered
            (never passed to init or add_process_set, or removed since).
    """
    if process_set.process_set_id is None:
        raise InvalidArgumentError(with_hint(
            f"{process_set} is not registered",
            "pass it to hvd.init(process_sets=[...]) or hvd.add_process_set() first, on every rank"))
    return process_set.process_set_id


def register_at_init(process_sets: Sequence[ProcessSet], first: bool) -> None:
    """Give every set passed to ``init`` its id; the global set gets its ranks (init-time only).
    Every rank's sets are registered on every rank (:mod:`accord.frontend.set_union`: ranks may
    pass different ones, e.g. sets from a split MPI communicator).

    Raises:
        ValueError: an entry duplicates an earlier one or the global set (Horovod's message);
            accord stays initialized, as Horovod does.
    """
    global_process_set.process_set_id = engine.GLOBAL_ID
    global_process_set.ranks = list(range(queries.size()))
    for ps in process_sets:
        if ps.ranks is None and ps.mpi_comm is not None:
            ps.ranks = _ranks_of_comm(ps.mpi_comm)
    ids = register_init_sets([ps.ranks or [] for ps in process_sets], first)
    for index, (ps, set_id) in enumerate(zip(process_sets, ids)):
        if set_id is None:
            ps._invalidate()
            raise duplicate_error(index, ps)
        ps.process_set_id = set_id
        _registered[set_id] = ps


def forget_all() -> None:
    """Invalidate every registered set (shutdown)."""
    for ps in _registered.values():
        ps._invalidate()
    _registered.clear()


def add_process_set(process_set: ProcessSet | Sequence[int]) -> ProcessSet:
    """Register a new process set after ``init`` and return it (collective over every rank).

    Every rank must call it, with the same ranks, in the same order as its other
    ``add_process_set`` calls; the set then has a controller of its own on its members.

    Args:
        process_set: a :class:`ProcessSet`, or the global ranks of the new set.

    Returns:
        The registered set, with its ``process_set_id``; pass it as ``process_set=``.

    Raises:
        ValueError: accord is not initialized, the ranks are invalid, or a set with the same
            ranks already exists ("Attempted to add a duplicate process set: ...").
        NotImplementedError: the set was built from an MPI communicator.
    """
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.ranks is None and process_set.mpi_comm is not None:
        raise NotImplementedError(
            "Dynamically adding process sets defined by an MPI communicator is not implemented. "
            "Please build the process set via a list of ranks.")
    assert process_set.ranks is not None
    queries.topology()  # raises the not-initialized ValueError first
    if engine.find_process_set(process_set.ranks) is not None:
        raise ValueError(f"Attempted to add a duplicate process set: {process_set}")
    process_set.process_set_id = engine.add_process_set(sorted(process_set.ranks))
    _registered[process_set.process_set_id] = process_set
    return process_set


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister ``process_set`` (collective); return whether it was removed.

    The global set and sets that are not registered are left alone (returns False).

    Args:
        process_set: a set :func:`add_process_set` returned; every rank must call.

    Returns:
        True when the set was removed, False when there was nothing to remove.

    Raises:
        ValueError: accord is not initialized while the set still has an id.
    """
    set_id = process_set.process_set_id
    if set_id is None or set_id == engine.GLOBAL_ID:
        return False
    queries.topology()  # raises the not-initialized ValueError before anything changes
    process_set._invalidate()
    _registered.pop(set_id, None)
    if set_id not in engine.process_sets():
        return False
    engine.remove_process_set(set_id)
    return True
