"""Communicators built the way the engine builds them, for tests that drive a backend directly.

Under accord's init the session builds them (:func:`accord.engine.build_communicator`); under a
plain ``init_process_group`` (run_ranks' default) the members meet on the default group's store,
with every rank's host name (ACCORD_HOSTNAME, else the system's) exchanged once.
"""
from __future__ import annotations

import itertools
import socket

_created = itertools.count()
_hostnames: tuple[str, ...] | None = None


def create(backend, ranks, timeout: float | None = None, rank: int | None = None):
    """``backend.create`` over ``ranks``: every rank calls it, in the same order; None elsewhere.
    Without accord's init or a default group (ranks from MPI alone), pass ``rank``: the members
    then get a store of their own process only, which the mpi backend does not use."""
    from accord import engine

    if engine.is_initialized():
        return engine.build_communicator(backend, ranks)
    import torch.distributed as dist

    n = next(_created)
    members = tuple(sorted(int(r) for r in ranks))
    me = dist.get_rank() if dist.is_initialized() else rank
    if me not in members:
        return None
    if not dist.is_initialized():
        from accord.comm.groups import GroupContext

        hosts = (socket.gethostname(),) * (max(members) + 1)
        return backend.create(GroupContext(dist.HashStore(), f"test{n}", members, me, hosts,
                                           60.0 if timeout is None else timeout))
    return backend.create(context(members, f"test{n}", timeout))


def context(members, key: str, timeout: float | None = None):
    """A :class:`~accord.comm.groups.GroupContext` over ``members`` on the default group's store."""
    import torch.distributed as dist

    from accord.comm.groups import GroupContext
    from accord.comm.settings import CommSettings

    settings = CommSettings.from_config()
    store = dist.distributed_c10d._get_default_store()
    return GroupContext(store, key, tuple(members), dist.get_rank(), _hosts(store, settings.hostname),
                        settings.collective_timeout if timeout is None else timeout)


def _hosts(store, hostname: str | None) -> tuple[str, ...]:
    global _hostnames
    if _hostnames is None:
        import torch.distributed as dist

        rank, size = dist.get_rank(), dist.get_world_size()
        store.set(f"test-hosts/{rank}", hostname or socket.gethostname())
        _hostnames = tuple(store.get(f"test-hosts/{r}").decode() for r in range(size))
    return _hostnames


def gloo_allreduce(store, members, rank: int, key: str, tensor) -> None:
    """Sum ``tensor`` in place over ``members`` on a private Gloo group met on ``store`` (a
    runtime's store: proves the ranks met there)."""
    import torch.distributed as dist

    from accord.comm.groups import GroupContext

    members = tuple(members)
    group = GroupContext(store, key, members, rank, ("?",) * (max(members) + 1), 30.0).gloo_group()
    options = dist.AllreduceOptions()
    options.reduceOp = dist.ReduceOp.SUM
    group.allreduce([tensor], options).wait()
