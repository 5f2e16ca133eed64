"""mpi4py's MPI module with MPI initialized, for every layer that talks to MPI.

mpi4py initializes MPI when imported unless the script set ``mpi4py.rc.initialize = False`` (as
Horovod's tests and MPI-interop code do, leaving it to Horovod's core). Then accord initializes
it, asking for ``MPI_THREAD_MULTIPLE`` as Horovod does, and finalizes it at exit. The engine's
own exit handler is registered after this one (once the rendezvous, which first needs MPI, is
done) and atexit runs the last registered first, so accord stops before MPI is finalized.
"""
from __future__ import annotations

import atexit
from typing import Any

from accord.errors import BackendError, with_hint


def initialized_mpi() -> Any:
    """``mpi4py.MPI``, initialized.

    Raises:
        ImportError: mpi4py (or its MPI library) is not installed.
        BackendError: MPI was already finalized in this process.
    """
    from mpi4py import MPI

    if MPI.Is_finalized():
        raise BackendError(with_hint("MPI was already finalized in this process",
                                     "finalize MPI only after hvd.shutdown(), or not at all"))
    if not MPI.Is_initialized():
        MPI.Init_thread(MPI.THREAD_MULTIPLE)
        atexit.register(_finalize, MPI)
    return MPI


def _finalize(mpi: Any) -> None:
    if mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()
