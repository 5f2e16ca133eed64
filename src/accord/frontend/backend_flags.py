"""Which library carries CPU collectives in this job: Horovod's ``mpi_enabled()``,
``gloo_enabled()`` and ``mpi_threads_supported()``, for every frontend (what the installation
*could* use is :mod:`accord.frontend.build_flags`)."""
from __future__ import annotations

from accord import engine
from accord.frontend import queries, settings


def cpu_backend() -> str:
    """The CPU backend in use (after init) or configured (before; ``auto`` is then unresolved)."""
    if engine.is_initialized():
        return engine.backend_name("cpu")
    return settings.configured_cpu_backend()


def mpi_enabled() -> bool:
    """Whether CPU collectives run over MPI.

    Returns:
        True under ``ACCORD_CPU_BACKEND=mpi`` (configured, or in use after ``init()``).
    """
    return cpu_backend() == "mpi"


def gloo_enabled() -> bool:
    """Whether CPU collectives run over Gloo.

    Returns:
        True over Gloo, or over shared memory that Gloo sets up (the default on one
        host); False under ``ACCORD_CPU_BACKEND=mpi`` or another library.
    """
    return cpu_backend() in ("gloo", "shm", "auto")


def mpi_threads_supported() -> bool:
    """Whether MPI allows calls from several threads.

    Returns:
        True when MPI was initialized with ``MPI_THREAD_MULTIPLE``.

    Raises:
        ValueError: MPI is not enabled, or accord is not initialized (Horovod's messages).
    """
    if not mpi_enabled():
        raise ValueError("Horovod MPI is not enabled; Please make sure it's installed and enabled.")
    queries.topology()
    from accord.mpi_init import initialized_mpi

    MPI = initialized_mpi()  # noqa: N806 (mpi4py's module name)
    return bool(MPI.Query_thread() == MPI.THREAD_MULTIPLE)
