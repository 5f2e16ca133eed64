"""Horovod's who-am-I queries, for every frontend: ``size``, ``rank``, the local and cross
coordinates, ``is_homogeneous``, and the members of a process set. Before ``init()`` they raise
Horovod's ``ValueError('Horovod has not been initialized; use hvd.init().')``."""
from __future__ import annotations

from accord import engine
from accord.runtime.topology import Topology

NOT_INITIALIZED = "Horovod has not been initialized; use hvd.init()."


def topology() -> Topology:
    """This rank's place in the job.

    Raises:
        ValueError: accord is not initialized (Horovod's message).
    """
    if not engine.is_initialized():
        raise ValueError(NOT_INITIALIZED)
    return engine.topology()


def is_initialized() -> bool:
    """Whether accord's engine is running in this process.

    Returns:
        True between ``init()`` and ``shutdown()``, False before and after.
    """
    return engine.is_initialized()


def size() -> int:
    """Number of ranks in the job.

    Returns:
        The job's size (after an elastic reset, the current one).

    Raises:
        ValueError: ``init()`` has not been called (Horovod's message).
    """
    return topology().size


def rank() -> int:
    """This process's global rank.

    Returns:
        0 to ``size() - 1``.

    Raises:
        ValueError: before ``init()``.
    """
    return topology().rank


def local_size() -> int:
    """Number of ranks on this host.

    Returns:
        How many of the job's ranks share this host.

    Raises:
        ValueError: the engine is not initialized.
    """
    return topology().local_size


def local_rank() -> int:
    """This process's rank among the ranks on its host.

    Returns:
        0 to ``local_size() - 1`` (the GPU index to pin, by convention).

    Raises:
        ValueError: when called before ``hvd.init()``.
    """
    return topology().local_rank


def cross_size() -> int:
    """Number of hosts that run a rank with this rank's local rank.

    Returns:
        The size of this rank's cross communicator (hosts, when the job is homogeneous).

    Raises:
        ValueError: accord has not been started with ``init()``.
    """
    return topology().cross_size


def cross_rank() -> int:
    """Index of this host among the hosts with this local rank.

    Returns:
        0 to ``cross_size() - 1``.

    Raises:
        ValueError: no ``init()`` yet (Horovod's error).
    """
    return topology().cross_rank


def is_homogeneous() -> bool:
    """Whether the job is homogeneous.

    Returns:
        True when every host runs the same number of ranks.

    Raises:
        ValueError: accord is not running yet.
    """
    return topology().homogeneous


def process_set_members(set_id: int) -> tuple[int, ...]:
    """Global ranks of a registered process set.

    Args:
        set_id: the set's id, as ``add_process_set`` returned it (0 is the global set).

    Returns:
        The members' global ranks, ascending.

    Raises:
        ValueError: accord is not initialized, or no set has that id (Horovod's messages).
    """
    if not engine.is_initialized():
        raise ValueError(NOT_INITIALIZED)
    try:
        return engine.process_set_members(set_id)
    except ValueError:
        raise ValueError("Process set does not exist or has not been registered.") from None

