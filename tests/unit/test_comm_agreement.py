"""Argument checks every rank agrees on, driven with hand-made headers (no processes)."""
import pytest
import torch

from accord.comm import agreement
from accord.comm.dtypes import dtype_code
from accord.errors import MismatchError

pytestmark = pytest.mark.timeout(10)


def test_shape_hash_tells_shapes_apart():
    assert agreement.shape_hash(()) == 0
    assert agreement.shape_hash((3,)) == 4  # (0 * 1000003 + 3 + 1)
    assert agreement.shape_hash((2, 3)) == (3 * 1000003 + 4) % (2**61 - 1)
    assert agreement.shape_hash((2, 3)) != agreement.shape_hash((3, 2))


def test_header_layout():
    work = torch.zeros(5, 2, 3, dtype=torch.float64)
    assert agreement.header(True, work, 5) == [1, dtype_code(torch.float64), 3, agreement.shape_hash((2, 3)), 5]
    assert agreement.header(False, work, 1, 4)[0] == 0
    assert agreement.header(False, work, 1, 4)[4:] == [1, 4]


def test_check_root():
    agreement.check_root(1, 2, (4, 7))
    for bad in (2, -1, 1.0):
        with pytest.raises(ValueError, match=r"HINT: pass a communicator rank between 0 and 1") as info:
            agreement.check_root(bad, 2, (4, 7))
        assert "global ranks [4, 7]" in str(info.value)


def test_scatter_problem():
    ok = [torch.zeros(2, 3), torch.zeros(1, 3)]
    assert agreement.scatter_problem(ok, 2) == ""
    assert agreement.scatter_problem(ok, 3) == "expected a list of 3 tensors, got list of length 2"
    assert agreement.scatter_problem(None, 2) == "expected a list of 2 tensors, got NoneType"
    assert "at least one dimension" in agreement.scatter_problem([torch.zeros(2), torch.tensor(1.0)], 2)
    assert "differ in dtype or shape" in agreement.scatter_problem([torch.zeros(2, 3), torch.zeros(2, 4)], 2)
    assert "differ in dtype or shape" in agreement.scatter_problem(
        [torch.zeros(2), torch.zeros(2, dtype=torch.int32)], 2)


def test_alltoall_splits():
    work = torch.zeros(6, 2)
    assert agreement.alltoall_splits(work, None, 3) == ("", [2, 2, 2])
    assert agreement.alltoall_splits(work, [1, 0, 5], 3) == ("", [1, 0, 5])
    assert agreement.alltoall_splits(work, torch.tensor([3, 3]), 2) == ("", [3, 3])
    for splits, size in ((None, 4), ([1, 2], 3), ([7, -1], 2), ([1, 1], 2)):
        problem, sizes = agreement.alltoall_splits(work, splits, size)
        assert problem and sizes == [0] * size
    problem, _ = agreement.alltoall_splits(torch.tensor(1.0), None, 2)
    assert "scalar" in problem


def _no_exchange(values):
    raise AssertionError("no full-shape exchange expected")


def test_check_headers_accepts_agreeing_ranks():
    a, b = torch.zeros(2, 3), torch.zeros(5, 3)
    headers = [agreement.header(True, a, 2), agreement.header(True, b, 5)]
    agreement.check_headers("allgather", a, headers, "", (0, 1), 0, _no_exchange)


def test_check_headers_names_the_ranks_with_bad_arguments():
    a = torch.zeros(4)
    headers = [agreement.header(True, a, 2, 2), agreement.header(False, a, 0, 0)]
    with pytest.raises(ValueError, match=r"alltoall: invalid arguments on ranks \[5\]; here \(rank 5\): oops"):
        agreement.check_headers("alltoall", a, headers, "oops", (2, 5), 1, _no_exchange)


def test_check_headers_reports_every_rank_shape_on_mismatch():
    mine, theirs = torch.zeros(1, 3), torch.zeros(1, 2, 2, dtype=torch.int32)
    headers = [agreement.header(True, mine, 1), agreement.header(True, theirs, 1)]
    asked = []

    def exchange(values):  # what the allgather of full shapes would return
        asked.append(values)
        return [values, [dtype_code(torch.int32), 1, 2, 2]]

    with pytest.raises(MismatchError) as info:
        agreement.check_headers("allgather", mine, headers, "", (0, 3), 0, exchange)
    assert asked == [[dtype_code(torch.float32), 1, 3, -1]]  # padded to the largest rank
    text = str(info.value)
    assert "rank 0 sent float32 [1, 3], rank 3 sent int32 [1, 2, 2]" in text and "HINT:" in text


def test_normalize_ranks():
    assert agreement.normalize_ranks([3, 1], 4) == (1, 3)
    for bad in ([], [1, 1], [4], [-1]):
        with pytest.raises(ValueError, match="HINT:"):
            agreement.normalize_ranks(bad, 4)
