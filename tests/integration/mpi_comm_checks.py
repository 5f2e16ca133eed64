"""The communicator check suite over the mpi backend. Started by mpirun from test_comm_mpi.py:

    mpirun --allow-run-as-root --oversubscribe -np 3 python tests/integration/mpi_comm_checks.py

With ``--engine`` (from test_engine_mpi.py, with ACCORD_CPU_BACKEND=mpi) it runs the engine
precision checks (tests/helpers/precision_checks.py) through ``accord.engine.session`` instead.

Ranks come from MPI alone (no torch.distributed). Prints one summary line per rank and every
failure; exits 1 when any check failed on this rank.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/


def _comm_checks() -> tuple[str, int, list[str]]:
    from helpers.comm_checks import run_checks
    from mpi4py import MPI

    from accord.comm import get_backend

    world = MPI.COMM_WORLD
    return f"rank {world.Get_rank()}", *run_checks(get_backend("mpi"), world.Get_rank(), world.Get_size())


def _engine_checks() -> tuple[str, int, list[str]]:
    from helpers.precision_checks import engine_precision_checks

    from accord.engine import session

    session.init()
    try:
        where = f"rank {session.topology().rank} on {session.backend_name('cpu')}"
        return where, *engine_precision_checks(session.topology().rank, session.topology().size)
    finally:
        session.shutdown()


def main() -> int:
    import torch

    torch.set_num_threads(1)
    where, count, failures = _engine_checks() if "--engine" in sys.argv[1:] else _comm_checks()
    for failure in failures:
        print(failure, flush=True)
    print(f"{where}: {count} checks, {len(failures)} failures", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
