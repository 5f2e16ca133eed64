"""Precision end to end through the engine on every CPU backend: random full-mantissa inputs,
copies bit for bit, reductions within a bound derived from the dtype and the number of ranks,
Compression.none bit-exact, fp16/bf16 within their wire's bound (tests/helpers/precision_checks.py).

The mpi backend runs the same checks under mpirun (tests/integration/test_engine_mpi.py).
"""
import pytest
from helpers.ranks import run_ranks

pytestmark = pytest.mark.timeout(120)


def _checks(rank, size):
    from helpers.precision_checks import engine_precision_checks

    from accord.engine import session

    session.init()
    try:
        backend = type(session.communicator(0, "cpu")).__name__
        count, failures = engine_precision_checks(rank, size)
    finally:
        session.shutdown()
    return backend, count, failures


def _hosts_env(rank):
    """Ranks 0, 1 on hostA and 2, 3 on hostB (as a launcher sets them)."""
    host, local = divmod(rank, 2)
    return {"ACCORD_HOSTNAME": f"host{'AB'[host]}", "ACCORD_LOCAL_RANK": str(local), "ACCORD_LOCAL_SIZE": "2",
            "ACCORD_CROSS_RANK": str(host), "ACCORD_CROSS_SIZE": "2"}


@pytest.mark.parametrize("backend, nprocs, env, kind", [
    ("gloo", 3, {"ACCORD_CPU_BACKEND": "gloo"}, "TorchCommunicator"),
    ("shm", 3, {"ACCORD_CPU_BACKEND": "shm"}, "ShmCommunicator"),
    ("hierarchical", 4, {"ACCORD_HIERARCHICAL_ALLREDUCE": "1"}, "HierarchicalCommunicator"),
], ids=["gloo", "shm", "hierarchical"])
def test_engine_precision(backend, nprocs, env, kind):
    per_rank = _hosts_env if backend == "hierarchical" else None
    out = run_ranks(_checks, nprocs, init="accord", env=env, per_rank_env=per_rank, timeout=110)
    failures = [f for _, _, fails in out for f in fails]
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:40])
    assert {k for k, _, _ in out} == {kind}, out
    assert min(n for _, n, _ in out) > 200, [n for _, n, _ in out]  # every rank ran every check
