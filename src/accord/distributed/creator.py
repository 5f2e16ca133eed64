"""What torch calls to make an accord process group: the default group starts accord (or joins
the session ``hvd.init()`` started), a sub-group becomes a process set of its members.

torch calls the creator on the group's members only (``new_group``, ``new_subgroups``,
``DeviceMesh``): a sub-group is an engine process set that only its members register
(:func:`accord.engine.add_private_process_set`) and that progresses independently of the others.
Destroying a group removes its set; destroying the default group shuts accord down if this
group started it. torch calls ``shutdown()`` on the groups it destroys from 2.5 on; before, its
``destroy_process_group`` shuts down NCCL backends only (``_shutdown_backend``), so
:func:`_shut_down_when_destroyed` makes it call ``shutdown()`` on accord's groups too.
"""
from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch.distributed.distributed_c10d as c10d

from accord import engine
from accord.distributed.process_group import AccordProcessGroup
from accord.distributed.settings import engine_overrides
from accord.errors import RendezvousError, with_hint
from accord.runtime.bootstrap import GivenGroup


def create_process_group(options: Any, backend_options: Any = None) -> AccordProcessGroup:
    """Make the process group torch asks for (the creator registered with ``extended_api``).

    Args:
        options: torch's ``_DistributedBackendOptions`` (store, group_rank, group_size, timeout,
            group_id, global_ranks_in_group).
        backend_options: ``pg_options`` of the call (accepted, unused).
    Raises:
        RendezvousError: the ranks could not meet, or the group disagrees with the job accord
            already runs.
    """
    _shut_down_when_destroyed()
    rank, size = int(options.group_rank), int(options.group_size)
    timeout: timedelta = options.timeout
    name = str(options.group_id)
    members = [int(r) for r in options.global_ranks_in_group]
    if not members:  # the default group
        return _default_group(options.store, rank, size, timeout, name)
    me = engine.topology().rank
    if members[rank] != me:
        raise RendezvousError(with_hint(
            f"process group {name!r} over ranks {members} says this is its rank {rank}, but this "
            f"process is global rank {me}", "create groups with torch.distributed.new_group"))
    set_id = engine.add_private_process_set(members, name, timeout.total_seconds())
    return AccordProcessGroup(set_id, members, rank, timeout, name, on_shutdown=_remove_set)


def _default_group(store: Any, rank: int, size: int, timeout: timedelta, name: str) -> AccordProcessGroup:
    started = not engine.is_initialized()
    if started:
        engine.init(given=GivenGroup(store, rank, size), overrides=engine_overrides(timeout.total_seconds()))
    topology = engine.topology()
    if (topology.rank, topology.size) != (rank, size):
        raise RendezvousError(with_hint(
            f"init_process_group gave rank {rank} of {size}, but accord already runs this process "
            f"as rank {topology.rank} of {topology.size} (hvd.init())",
            "pass the same rank and world size as the job accord runs (or leave them to env://)"))
    return AccordProcessGroup(engine.GLOBAL_ID, list(range(size)), rank, timeout, name,
                              on_shutdown=_shut_down_engine if started else None)


def _shut_down_engine(group: AccordProcessGroup) -> None:
    engine.shutdown()


def _remove_set(group: AccordProcessGroup) -> None:
    if not engine.is_initialized():
        return
    try:
        engine.process_set_members(group.set_id)
    except ValueError:
        return  # gone with an engine that was shut down and started again
    engine.remove_process_set(group.set_id)


def _shut_down_when_destroyed() -> None:
    """On a torch whose ``destroy_process_group`` leaves Python groups alone (before 2.5: it
    calls ``_shutdown_backend(pg)``, which shuts down NCCL only), make that call shut accord's
    groups down as well; a no-op on later torch and when already done."""
    torch_shutdown = getattr(c10d, "_shutdown_backend", None)
    if torch_shutdown is None or getattr(torch_shutdown, "_accord", False):
        return

    def shutdown_backend(pg: Any) -> None:
        if isinstance(pg, AccordProcessGroup):
            pg.shutdown()
        else:
            torch_shutdown(pg)

    shutdown_backend._accord = True  # type: ignore[attr-defined]
    c10d._shutdown_backend = shutdown_backend
