"""The gloo backend on 2 and 3 real ranks: every collective x op x dtype x process set.

All checks for one world size run inside one set of ranks (a rank costs ~1 s to start); see
tests/helpers/comm_checks.py for what is checked and how expected values are computed.
"""
import pytest
from helpers.ranks import run_ranks


def _gloo_checks(rank, size):
    from helpers.comm_checks import run_checks

    from accord.comm import get_backend

    return run_checks(get_backend("gloo"), rank, size)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("size", [2, 3])
def test_gloo_collectives(size):
    results = run_ranks(_gloo_checks, size, timeout=80)
    failures = [f for _, fails in results for f in fails]
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:60])
    counts = [n for n, _ in results]
    assert min(counts) > 250, counts  # every rank really ran the suite


def _peer_leaves(rank, size):
    import torch

    from accord.comm import ReduceOp, get_backend
    from accord.errors import RankFailedError

    comm = get_backend("gloo").create(range(size))
    if rank == 1:
        return "left"  # exits without joining the allreduce below
    try:
        comm.allreduce(torch.ones(4), ReduceOp.SUM)
    except RankFailedError as exc:
        return f"RankFailedError: {exc}"
    return "no error"


@pytest.mark.timeout(60)
def test_lost_peer_raises_rank_failed():
    results = run_ranks(_peer_leaves, 2, timeout=45, env={"ACCORD_COLLECTIVE_TIMEOUT": "5"})
    assert results[1] == "left"
    assert results[0].startswith("RankFailedError: allreduce failed on rank 0 (gloo"), results[0]
    assert "HINT:" in results[0] and "ACCORD_COLLECTIVE_TIMEOUT" in results[0]



def _reduce_scatter_as_on_torch_2_4(rank, size):
    import torch.distributed as dist
    from helpers.comm_checks import Checks, check_reductions

    from accord.comm import get_backend, torch_backend

    comm = get_backend("gloo").create(range(size))
    real_list_form, real_tensor_form = dist.reduce_scatter, torch_backend._reduce_scatter_single

    def refuse(*args, **kwargs):  # no list form before torch 2.7: refused before sending anything
        raise RuntimeError("ProcessGroupGloo does not support reduce_scatter")

    def always_sum(out, tensor, op, group):  # torch 2.4's Gloo reduce_scatter_tensor ignores op
        return real_tensor_form(out, tensor, op=dist.ReduceOp.SUM, group=group)

    dist.reduce_scatter, torch_backend._reduce_scatter_single = refuse, always_sum
    try:
        checks = Checks(comm, "gloo as on torch 2.4")
        check_reductions(checks)
    finally:
        dist.reduce_scatter, torch_backend._reduce_scatter_single = real_list_form, real_tensor_form
    return checks.count, checks.failures, comm._uneven_reduce_scatter


@pytest.mark.timeout(90)
def test_reduce_scatter_is_right_with_torch_2_4s_gloo():
    """Uneven parts padded to the equal-parts form; MIN/MAX/PRODUCT kept away from a library
    reduce-scatter that sums whatever op it is given."""
    results = run_ranks(_reduce_scatter_as_on_torch_2_4, 3, timeout=80)
    failures = [f for _, fails, _ in results for f in fails]
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:40])
    assert min(count for count, _, _ in results) > 100
    assert [uses_list_form for _, _, uses_list_form in results] == [False] * 3
