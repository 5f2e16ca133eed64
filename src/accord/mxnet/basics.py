"""Horovod's MXNet basics on accord's session: who-am-I queries, build flags and the timeline.
Queries before ``init()`` raise Horovod's ValueError (``init``/``shutdown``: :mod:`.lifecycle`)."""
from __future__ import annotations

from typing import Any, Sequence

from accord.engine import session

NOT_INITIALIZED = "Horovod has not been initialized; use hvd.init()."


def topology() -> Any:
    """This rank's :class:`~accord.runtime.topology.Topology`.

    Raises:
        ValueError: not initialized (Horovod's message).
    """
    if not session.is_initialized():
        raise ValueError(NOT_INITIALIZED)
    return session.topology()


def is_initialized() -> bool:
    """True between ``init()`` and ``shutdown()``."""
    return session.is_initialized()


def size() -> int:
    """Number of ranks in the job."""
    return int(topology().size)


def local_size() -> int:
    """Number of ranks on this host."""
    return int(topology().local_size)


def cross_size() -> int:
    """Number of hosts that run a rank with this rank's local rank."""
    return int(topology().cross_size)


def rank() -> int:
    """This process's global rank."""
    return int(topology().rank)


def local_rank() -> int:
    """This process's rank among the ranks on its host."""
    return int(topology().local_rank)


def cross_rank() -> int:
    """Index of this host among the hosts with this local rank."""
    return int(topology().cross_rank)


def is_homogeneous() -> bool:
    """True when every host runs the same number of ranks."""
    return bool(topology().homogeneous)


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Write a chrome://tracing timeline of the engine to ``file_path`` (rank 0)."""
    topology()
    session.start_timeline(file_path, mark_cycles)


def stop_timeline() -> None:
    """Finish and close the timeline file."""
    topology()
    session.stop_timeline()


def members(set_id: int) -> tuple[int, ...]:
    """Global ranks of a registered process set.

    Raises:
        ValueError: not initialized, or no set has that id.
    """
    topology()
    try:
        return session.process_sets()[set_id]
    except KeyError:
        raise ValueError("Process set does not exist or has not been registered.") from None


def find_set(ranks: Sequence[int]) -> int | None:
    """Id of the registered set with exactly ``ranks``, or None."""
    wanted = tuple(sorted(ranks))
    return next((i for i, m in session.process_sets().items() if m == wanted), None)
