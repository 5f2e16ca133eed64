"""The rank harness itself: results in order, failures reported, hangs killed."""
import pytest
from helpers.ranks import RanksFailed, run_ranks


def _sum_ranks(rank, size):
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    return t.item()


def _fail_on_one(rank, size):
    if rank == 1:
        raise ValueError("boom on rank 1")
    return rank


def _hang(rank, size):
    import time

    time.sleep(1000)


def test_results_in_rank_order():
    assert run_ranks(_sum_ranks, 3) == [6.0, 6.0, 6.0]


def test_failure_names_rank():
    with pytest.raises(RanksFailed, match="boom on rank 1"):
        run_ranks(_fail_on_one, 2, init="none")


def test_hang_is_killed_with_stacks():
    with pytest.raises(RanksFailed, match="timed out") as info:
        run_ranks(_hang, 2, init="none", timeout=10)  # ranks must have started to dump stacks
    assert "_hang" in str(info.value)
