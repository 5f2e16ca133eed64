"""Horovod's basics: ``init``/``shutdown``, who-am-I queries, build flags, timeline.

``init``/``shutdown`` sit above the rest of the facade (they register the ``ProcessSet`` views
and reset :mod:`accord.torch.gateway`'s handles); the queries raise Horovod's
``ValueError('Horovod has not been initialized; use hvd.init().')`` before ``init()``.
"""
from __future__ import annotations

import atexit
from typing import Any

from accord.engine import session
from accord.engine.sets import sets_given_at_init
from accord.errors import with_hint
from accord.frontend import backend_flags
from accord.frontend.backend_flags import gloo_enabled, mpi_enabled
from accord.frontend.build_flags import ccl_built, cuda_built, ddl_built, gloo_built, mpi_built, nccl_built, rocm_built
from accord.runtime import admission
from accord.torch import gateway
from accord.torch import process_sets as ps_module
from accord.torch.gateway import NOT_INITIALIZED, is_initialized, rank, size

__all__ = ["NOT_INITIALIZED", "init", "shutdown", "is_initialized", "size", "rank", "local_size",
           "local_rank", "cross_size", "cross_rank", "is_homogeneous", "mpi_built", "mpi_enabled",
           "mpi_threads_supported", "gloo_built", "gloo_enabled", "nccl_built", "cuda_built",
           "rocm_built", "ddl_built", "ccl_built", "start_timeline", "stop_timeline"]

_atexit_registered = False
_topology = gateway.topology


def init(comm: Any = None, process_sets: Any = None) -> None:
    """Start accord (meet the other ranks, start the engine); a no-op when already initialized.

    Args:
        comm: None (every rank), a list of ranks (must be every rank: accord runs one job per
            set of processes), or an mpi4py communicator spanning every rank.
        process_sets: None, ``"dynamic"`` (accepted for compatibility: sets may always be
            added later), or a list of :class:`~accord.torch.ProcessSet` to register now.
    Raises:
        ValueError: a duplicate process set (accord stays initialized, as Horovod does).
            NotImplementedError: ``comm`` names a subset.
        RendezvousError: the ranks could not meet.
    """
    process_sets = sets_given_at_init(process_sets)
    if session.is_initialized():
        if process_sets:  # as Horovod: each init(process_sets=...) resolves (and checks) its sets
            ps_module._register_at_init(process_sets, first=False)
        return
    global _atexit_registered
    if not _atexit_registered:  # like Horovod: leave the job cleanly when the script ends
        atexit.register(shutdown)
        _atexit_registered = True
    gateway.reset()
    admission.join_if_new()  # a worker added to a running elastic job: wait for its place
    session.init()
    try:
        _check_comm(comm)
    except BaseException:
        shutdown()
        raise
    # A duplicate set raises ValueError with accord left initialized, as in Horovod (whose core
    # is up by then): the script may call init again with a valid list.
    ps_module._register_at_init(process_sets, first=True)


def _check_comm(comm: Any) -> None:
    if comm is None:
        return
    n = session.topology().size
    if hasattr(comm, "Get_size"):
        covered = comm.Get_size() == n
    else:
        try:
            covered = sorted(int(r) for r in comm) == list(range(n))
        except TypeError:
            raise ValueError("Invalid type of argument comm. Expected list of rank integers or "
                             "mpi4py.MPI.Comm object.") from None
    if not covered:
        raise NotImplementedError(with_hint(
            f"init(comm=...) with a subset of the {n} ranks is not supported",
            "start only the ranks you need, or use init() and a ProcessSet for the subset"))


def shutdown() -> None:
    """Stop the engine and leave the job; ``init()`` works again afterwards. Idempotent."""
    try:
        session.shutdown()
    finally:
        ps_module._invalidate_all()
        gateway.reset()


def local_size() -> int:
    """Number of ranks on this host."""
    return _topology().local_size


def cross_size() -> int:
    """Number of hosts that run a rank with this rank's local rank."""
    return _topology().cross_size


def local_rank() -> int:
    """This process's rank among the ranks on its host."""
    return _topology().local_rank


def cross_rank() -> int:
    """Index of this host among the hosts with this local rank."""
    return _topology().cross_rank


def is_homogeneous() -> bool:
    """True when every host runs the same number of ranks."""
    return _topology().homogeneous


# --- build and runtime flags (what this installation can do; the same for every frontend) ----

def mpi_threads_supported() -> bool:
    """Whether MPI allows calls from several threads (only meaningful when MPI is enabled).

    Raises:
        ValueError: MPI is not enabled, or accord is not initialized.
    """
    if not mpi_enabled():
        raise ValueError("Horovod MPI is not enabled; Please make sure it's installed and enabled.")
    _topology()
    return backend_flags.mpi_threads_supported()


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Start writing a chrome://tracing timeline of the engine to ``file_path`` (rank 0)."""
    if not session.is_initialized():
        raise ValueError(NOT_INITIALIZED)
    session.start_timeline(file_path, mark_cycles)


def stop_timeline() -> None:
    """Finish and close the timeline file."""
    if not session.is_initialized():
        raise ValueError(NOT_INITIALIZED)
    session.stop_timeline()
