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
    """True between ``init()`` and ``shutdown()``."""
    return engine.is_initialized()


def size() -> int:
    """Number of ranks in the job."""
    return topology().size


def rank() -> int:
    """This process's global rank."""
    return topology().rank


def local_size() -> int:
    """Number of ranks on this host."""
    return topology().local_size


def local_rank() -> int:
    """This process's rank among the ranks on its host."""
    return topology().local_rank


def cross_size() -> int:
    """Number of hosts that run a rank with this rank's local rank."""
    return topology().cross_size


def cross_rank() -> int:
    """Index of this host among the hosts with this local rank."""
    return topology().cross_rank


def is_homogeneous() -> bool:
    """True when every host runs the same number of ranks."""
    return topology().homogeneous


def process_set_members(set_id: int) -> tuple[int, ...]:
    """Global ranks of a registered process set.

    Raises:
        ValueError: accord is not initialized, or no set has that id (Horovod's messages).
    """
    if not engine.is_initialized():
        raise ValueError(NOT_INITIALIZED)
    try:
        return engine.process_set_members(set_id)
    except ValueError:
        raise ValueError("Process set does not exist or has not been registered.") from None

