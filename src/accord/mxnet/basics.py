"""Horovod's MXNet basics on accord's session: ``init``/``shutdown``, who-am-I queries, build
flags and the timeline. Queries before ``init()`` raise Horovod's ValueError."""
from __future__ import annotations

import atexit
from typing import Any, Sequence

from accord import config
from accord.comm.build_flags import (ccl_built, cuda_built, ddl_built, gloo_built, mpi_built,  # noqa: F401
                                     nccl_built, rocm_built)
from accord.engine import session
from accord.errors import with_hint

NOT_INITIALIZED = "Horovod has not been initialized; use hvd.init()."

_atexit_registered = False


def topology() -> Any:
    """This rank's :class:`~accord.runtime.topology.Topology`.

    Raises:
        ValueError: not initialized (Horovod's message).
    """
    if not session.is_initialized():
        raise ValueError(NOT_INITIALIZED)
    return session.topology()


def init(comm: Any = None, process_sets: Any = None) -> None:
    """Join the job and start accord's engine; a no-op when already initialized.

    Args:
        comm: None, or a list of every rank (accord runs one job per set of processes).
        process_sets: None, ``"dynamic"`` (sets may always be added later), or a list of
            :class:`~accord.mxnet.ProcessSet` to register now.
    Raises:
        ValueError: a duplicate process set. NotImplementedError: ``comm`` names a subset.
        RendezvousError: the ranks could not meet.
    """
    from accord.mxnet import process_sets as sets

    if isinstance(process_sets, str):
        if process_sets.lower() != "dynamic":
            raise ValueError(with_hint(f"process_sets={process_sets!r} is not understood",
                                       "pass None, 'dynamic' or a list of hvd.ProcessSet"))
        process_sets = []
    if session.is_initialized():
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
        sets.register_at_init(list(process_sets or []))
    except BaseException:
        shutdown()
        raise


def shutdown() -> None:
    """Stop the engine and leave the job; ``init()`` works again afterwards. Idempotent."""
    from accord.mxnet import process_sets as sets

    try:
        session.shutdown()
    finally:
        sets.forget_all()


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


def _cpu_backend() -> str:
    if session.is_initialized():
        return session.backend_name("cpu")
    return str(config.get("ACCORD_CPU_BACKEND")).lower()


def mpi_enabled() -> bool:
    """True when CPU collectives run over MPI."""
    return _cpu_backend() == "mpi"


def mpi_threads_supported() -> bool:
    """Whether MPI allows calls from several threads.

    Raises:
        ValueError: MPI is not enabled (as in Horovod).
    """
    if not mpi_enabled():
        raise ValueError("Horovod MPI is not enabled; Please make sure it's installed and enabled.")
    from mpi4py import MPI

    return bool(MPI.Query_thread() == MPI.THREAD_MULTIPLE)


def gloo_enabled() -> bool:
    """True when CPU collectives run over Gloo or the shared memory that Gloo sets up."""
    return _cpu_backend() in ("gloo", "shm", "auto")


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
