"""The ``host`` backend (CUDA tensors staged through host memory) on real ranks, on the CPU.

The staging wrapper copies every tensor into host memory and back whatever its device, so
the whole communicator check suite (every collective x op x dtype, layouts, errors; expected
values from numpy, see tests/helpers/comm_checks.py) runs through it here on CPU tensors. The
same wrapper over CUDA tensors on one shared GPU is tested in tests/gpu/.
"""
import pytest
from helpers import groups
from helpers.ranks import run_ranks

pytestmark = pytest.mark.timeout(120)


def _staged_checks(rank, size, inner):
    import torch
    from helpers.comm_checks import run_checks

    from accord.comm import get_backend
    from accord.comm.host_staged import HostStagedBackend, HostStagedCommunicator
    from accord.comm.ops import ReduceOp

    backend = HostStagedBackend(get_backend(inner))
    count, failures = run_checks(backend, rank, size)
    # Results never alias the reused staging buffer: a later collective must not change them.
    comm = groups.create(backend, list(range(size)))
    assert isinstance(comm, HostStagedCommunicator) and comm.inner.backend_name == inner
    first = comm.allgather(torch.full((2,), float(rank)))
    comm.allreduce(torch.full((64,), 7.0), ReduceOp.SUM)
    want = torch.arange(size, dtype=torch.float32).repeat_interleave(2)
    if not torch.equal(first, want):
        failures.append(f"rank {rank}: allgather result changed by a later collective: {first}")
    t = torch.arange(10, dtype=torch.float64)[::2]  # a non-contiguous view, reduced in place
    comm.allreduce(t, ReduceOp.MAX)
    if not torch.equal(t, torch.arange(0, 10, 2, dtype=torch.float64)):
        failures.append(f"rank {rank}: in-place allreduce of a view gave {t}")
    comm.close()
    return count, failures


@pytest.mark.parametrize("inner,size", [("gloo", 2), ("shm", 3)])
def test_host_staged_collectives(inner, size):
    results = run_ranks(_staged_checks, size, inner, timeout=100)
    failures = [f for _, fails in results for f in fails]
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:60])
    assert min(n for n, _ in results) > 250  # every rank really ran the suite
