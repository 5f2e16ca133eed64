"""The gloo backend on 2 and 3 real ranks: every collective x op x dtype x process set.

All checks for one world size run inside one set of ranks (a rank costs ~1 s to start); see
tests/helpers/comm_checks.py for what is checked and how expected values are computed.
"""
import pytest
from helpers import groups
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
    import torch.distributed as dist

    from accord.comm import ReduceOp, get_backend
    from accord.errors import RankFailedError

    comm = groups.create(get_backend("gloo"), range(size))
    store = dist.distributed_c10d._get_default_store()
    if rank == 1:
        # Leave once rank 0 has its group too: Gloo's mesh is set up on both sides, and a peer
        # that exits while the other side still connects fails that side's constructor instead
        store.wait(["peer-leaves/created/0"])
        return "left"  # exits without joining the allreduce below
    store.set("peer-leaves/created/0", "1")
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



class _GlooOfTorch24:
    """A Gloo group as torch 2.4 has it: no list reduce_scatter (refused before sending anything),
    and a tensor reduce_scatter that sums whatever op it is given."""

    def __init__(self, group):
        self._group = group

    def __getattr__(self, name):
        return getattr(self._group, name)

    def reduce_scatter(self, *args, **kwargs):
        raise RuntimeError("ProcessGroupGloo does not support reduce_scatter")

    def _reduce_scatter_base(self, out, tensor, options):
        import torch.distributed as dist

        options.reduceOp = dist.ReduceOp.SUM
        return self._group._reduce_scatter_base(out, tensor, options)


def _reduce_scatter_as_on_torch_2_4(rank, size):
    from helpers.comm_checks import Checks, check_reductions

    from accord.comm import get_backend

    comm = groups.create(get_backend("gloo"), range(size))
    comm.group = _GlooOfTorch24(comm.group)
    checks = Checks(comm, "gloo as on torch 2.4")
    check_reductions(checks)
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
