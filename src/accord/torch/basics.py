"""Horovod's basics: ``init``/``shutdown``, who-am-I queries, build flags, timeline.

Everything here delegates to :mod:`accord.engine.session`; the queries raise Horovod's
``ValueError('Horovod has not been initialized; use hvd.init().')`` before ``init()``.
"""
from __future__ import annotations

import atexit
import importlib.util
from typing import Any, Sequence

import torch

from accord import config
from accord.engine import session
from accord.engine.request import Handle, Request
from accord.errors import with_hint

NOT_INITIALIZED = "Horovod has not been initialized; use hvd.init()."

# Set by hvd.elastic.run: the job may grow, so optimizers hook gradients even with one rank.
elastic_mode = False
_atexit_registered = False


def _topology():
    if not session.is_initialized():
        raise ValueError(NOT_INITIALIZED)
    return session.topology()


def init(comm: Any = None, process_sets: Any = None) -> None:
    """Start accord (meet the other ranks, start the engine); a no-op when already initialized.

    Args:
        comm: None (every rank), a list of ranks (must be every rank: accord runs one job per
            set of processes), or an mpi4py communicator spanning every rank.
        process_sets: None, ``"dynamic"`` (accepted for compatibility: sets may always be
            added later), or a list of :class:`~accord.torch.ProcessSet` to register now.
    Raises:
        ValueError: a duplicate process set. NotImplementedError: ``comm`` names a subset.
        RendezvousError: the ranks could not meet.
    """
    from accord.torch import handles, process_sets as ps_module

    if isinstance(process_sets, str):
        if process_sets.lower() != "dynamic":
            raise ValueError(with_hint(f"process_sets={process_sets!r} is not understood",
                                       "pass None, 'dynamic' or a list of hvd.ProcessSet"))
        process_sets = []
    process_sets = list(process_sets or [])
    if session.is_initialized():
        return
    global _atexit_registered
    if not _atexit_registered:  # like Horovod: leave the job cleanly when the script ends
        atexit.register(shutdown)
        _atexit_registered = True
    handles.reset()
    session.init()
    try:
        _check_comm(comm)
        ps_module._register_at_init(process_sets)
    except BaseException:
        shutdown()
        raise


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
    from accord.torch import handles, process_sets as ps_module

    try:
        session.shutdown()
    finally:
        ps_module._invalidate_all()
        handles.reset()


def is_initialized() -> bool:
    """True between ``init()`` and ``shutdown()``."""
    return session.is_initialized()


def size() -> int:
    """Number of ranks in the job."""
    return _topology().size


def local_size() -> int:
    """Number of ranks on this host."""
    return _topology().local_size


def cross_size() -> int:
    """Number of hosts that run a rank with this rank's local rank."""
    return _topology().cross_size


def rank() -> int:
    """This process's global rank."""
    return _topology().rank


def local_rank() -> int:
    """This process's rank among the ranks on its host."""
    return _topology().local_rank


def cross_rank() -> int:
    """Index of this host among the hosts with this local rank."""
    return _topology().cross_rank


def is_homogeneous() -> bool:
    """True when every host runs the same number of ranks."""
    return _topology().homogeneous


# --- build and runtime flags (what this installation can do) -----------------------------------

def _cpu_backend() -> str:
    """The CPU backend in use (after init) or configured (before; ``auto`` is then unresolved)."""
    if session.is_initialized():
        return session.backend_name("cpu")
    return str(config.get("ACCORD_CPU_BACKEND")).lower()


def mpi_built() -> bool:
    """True when mpi4py is installed (accord's ``mpi`` backend can be used)."""
    return importlib.util.find_spec("mpi4py") is not None


def mpi_enabled() -> bool:
    """True when CPU collectives run over MPI (ACCORD_CPU_BACKEND=mpi)."""
    return _cpu_backend() == "mpi"


def mpi_threads_supported() -> bool:
    """Whether MPI allows calls from several threads (only meaningful when MPI is enabled)."""
    if not mpi_enabled():
        raise ValueError("Horovod MPI is not enabled; Please make sure it's installed and enabled.")
    _topology()
    from mpi4py import MPI

    return MPI.Query_thread() == MPI.THREAD_MULTIPLE


def gloo_built() -> bool:
    """True: Gloo comes with torch.distributed."""
    return bool(torch.distributed.is_available() and torch.distributed.is_gloo_available())


def gloo_enabled() -> bool:
    """True when CPU collectives run over Gloo, or over shared memory that Gloo sets up (the
    default on one host); False under ACCORD_CPU_BACKEND=mpi or another library."""
    return _cpu_backend() in ("gloo", "shm", "auto")


def nccl_built() -> int:
    """NCCL's version code (e.g. 21803) when torch has NCCL and CUDA, else 0 (as in Horovod)."""
    try:
        if not (torch.cuda.is_available() and torch.distributed.is_nccl_available()):
            return 0
        major, minor, patch = torch.cuda.nccl.version()[:3]
    except Exception:  # a CPU-only torch raises various errors here
        return 0
    # NCCL_VERSION_CODE: 2.9 and later use five digits for major.minor.patch
    if (major, minor) >= (2, 9):
        return major * 10000 + minor * 100 + patch
    return major * 1000 + minor * 100 + patch


def cuda_built() -> bool:
    """True when torch was built with CUDA."""
    return torch.version.cuda is not None


def rocm_built() -> bool:
    """True when torch was built with ROCm."""
    return getattr(torch.version, "hip", None) is not None


def ddl_built() -> bool:
    """False: IBM DDL is not supported."""
    return False


def ccl_built() -> bool:
    """False: oneCCL is not supported."""
    return False


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


# --- what the rest of accord.torch uses ---------------------------------------------------------

def enqueue(request: Request) -> Handle:
    """Submit a request to the engine.

    Raises:
        HorovodInternalError: accord is not initialized (as Horovod raises from its ops).
    """
    return enqueue_group((request,))[0]


def require_initialized() -> None:
    """Raise what Horovod's collectives raise before init.

    Raises:
        HorovodInternalError: accord is not initialized.
    """
    if not session.is_initialized():
        from accord.errors import CollectiveError

        raise CollectiveError(NOT_INITIALIZED)


def enqueue_group(requests: Sequence[Request]) -> list[Handle]:
    """Submit the requests of one (grouped) call: all of them, or none if one is refused.

    Raises:
        HorovodInternalError: accord is not initialized (as Horovod raises from its ops).
        ValueError: a request is invalid or its name is in flight (nothing was submitted).
    """
    require_initialized()
    return session.engine().enqueue_many(requests)


def poll(handle: Handle) -> bool:
    """Whether an engine handle has completed (nudging the engine to start its cycle if not)."""
    return session.poll(handle)


def wait(handle: Handle) -> Any:
    """Wait for an engine handle; return its result or raise its error."""
    return session.synchronize(handle)


def process_set_members(set_id: int) -> tuple[int, ...]:
    """Global ranks of a registered process set."""
    if not session.is_initialized():
        raise ValueError(NOT_INITIALIZED)
    try:
        return session.process_sets()[set_id]
    except KeyError:
        raise ValueError("Process set does not exist or has not been registered.") from None


def find_process_set(ranks: Sequence[int]) -> int | None:
    """Id of the registered set with exactly ``ranks`` (sorted), or None."""
    wanted = tuple(sorted(ranks))
    for set_id, members in session.process_sets().items():
        if members == wanted:
            return set_id
    return None


def add_process_set_ranks(ranks: Sequence[int]) -> int:
    """Register a set (collective) and return its id."""
    if not session.is_initialized():
        raise ValueError(NOT_INITIALIZED)
    return session.add_process_set(sorted(ranks))


def remove_process_set_id(set_id: int) -> bool:
    """Unregister a set (collective); False when it was not registered."""
    if not session.is_initialized():
        raise ValueError(NOT_INITIALIZED)
    if set_id not in session.process_sets():
        return False
    session.remove_process_set(set_id)
    return True


def join(device: int = -1) -> int:
    """Horovod's join (see :func:`accord.torch.join`): block until every rank has joined,
    serving the others' collectives meanwhile; return the rank that joined last."""
    if not session.is_initialized():
        raise ValueError(NOT_INITIALIZED)
    return session.engine().join(device)
