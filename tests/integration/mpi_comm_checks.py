"""The communicator check suite over the mpi backend. Started by mpirun from test_comm_mpi.py:

    mpirun --allow-run-as-root --oversubscribe -np 3 python tests/integration/mpi_comm_checks.py

Ranks come from MPI alone (no torch.distributed). Prints one summary line per rank and every
failure; exits 1 when any check failed on this rank.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/


def main() -> int:
    import torch

    torch.set_num_threads(1)
    from mpi4py import MPI

    from accord.comm import get_backend
    from helpers.comm_checks import run_checks

    world = MPI.COMM_WORLD
    count, failures = run_checks(get_backend("mpi"), world.Get_rank(), world.Get_size())
    for failure in failures:
        print(failure, flush=True)
    print(f"rank {world.Get_rank()}: {count} checks, {len(failures)} failures", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
