"""shm_reduce: how a list of tensors is cut into chunk pieces, and rank-ordered combining."""
import pytest
import torch

from accord.comm.ops import ReduceOp
from accord.comm.shm.reduce import chunk_pieces, combine

pytestmark = pytest.mark.timeout(10)


def test_pieces_cover_every_element_once_in_order():
    sizes = [0, 5, 0, 12, 3, 0]
    chunks, total = chunk_pieces(sizes, 4)
    assert total == 20 and len(chunks) == 5
    seen = []
    for _c, pieces in enumerate(chunks):
        offsets = []
        for i, lo, hi, at in pieces:
            assert sizes[i] > 0 and 0 <= lo < hi <= sizes[i] and 0 <= at and at + hi - lo <= 4
            seen += [(i, e) for e in range(lo, hi)]
            offsets.append((at, at + hi - lo))
        # pieces of one chunk fill it back to back from offset 0
        assert offsets[0][0] == 0 and all(a[1] == b[0] for a, b in zip(offsets, offsets[1:]))
    assert seen == [(i, e) for i, n in enumerate(sizes) for e in range(n)]


def test_empty_input_still_has_one_chunk():
    assert chunk_pieces([0, 0], 8) == ([[]], 0)


@pytest.mark.parametrize("op, fn", [(ReduceOp.SUM, lambda a, b: a + b), (ReduceOp.MAX, torch.maximum),
                                    (ReduceOp.PRODUCT, lambda a, b: a * b)])
def test_combine_reduces_slots_in_rank_order(op, fn):
    bank = [torch.arange(6.0) + r for r in range(3)]
    out = torch.empty(4)
    combine(out, bank, 1, 5, op, 3)
    assert torch.equal(out, fn(fn(bank[0][1:5], bank[1][1:5]), bank[2][1:5]))
    combine(out, bank, 2, 6, op, 1)  # one rank: a copy
    assert torch.equal(out, bank[0][2:6])
