"""shm_reduce: how a list of tensors is cut into chunk pieces, and rank-ordered combining."""
import pytest
import torch

from accord.comm.ops import ReduceOp
from accord.comm.shm.reduce import chunk_pieces, combine, reduction_stages

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


def _two_ranks(inputs: list[list[torch.Tensor]], per: int, op: ReduceOp, in_place: bool,
               postscale: float = 1.0, wire: torch.dtype | None = None) -> list[list[torch.Tensor]]:
    """Both ranks' reduction stages over one shared set of slots, in pipeline order: every
    rank copies chunk c in, then every rank reduces it (bank c % 2, as the communicator does)."""
    dtype = wire or inputs[0][0].dtype
    areas = [[torch.zeros(per, dtype=dtype) for _ in range(3)] for _ in range(2)]
    pieces, _ = chunk_pieces([t.numel() for t in inputs[0]], per)
    outs = [ins if in_place else [torch.empty_like(t) for t in ins] for ins in inputs]
    stages = [reduction_stages(inputs[r], outs[r], pieces, areas, r, 2, per, op, True, True,
                               torch.empty(per, dtype=dtype), in_place, postscale) for r in range(2)]
    for c in range(len(pieces)):
        for r in range(2):
            stages[r][0](c, c % 2)
        for r in range(2):
            stages[r][1](c, c % 2)
    return outs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int32])
@pytest.mark.parametrize("op", [ReduceOp.SUM, ReduceOp.PRODUCT])
def test_two_ranks_in_place_reduce_matches_rank_order_bit_for_bit(dtype, op):
    """Two ranks reducing into their own inputs (``out op= peer``): the same bits on both ranks
    as ``slot_0 op slot_1``, over pieces that straddle chunks, and as the scratch path."""
    gen = torch.Generator().manual_seed(7)
    sizes = [5, 0, 13, 1, 9, 30]

    def values(n: int) -> torch.Tensor:
        if dtype.is_floating_point:
            return (torch.randn(n, generator=gen) * 3).to(dtype)
        return torch.randint(-50, 50, (n,), generator=gen, dtype=dtype)

    inputs = [[values(n) for n in sizes] for _ in range(2)]
    fn = torch.add if op == ReduceOp.SUM else torch.mul
    want = [fn(a, b) for a, b in zip(*inputs)]
    scratch_path = _two_ranks([[t.clone() for t in ins] for ins in inputs], 8, op, in_place=False)
    in_place = _two_ranks([[t.clone() for t in ins] for ins in inputs], 8, op, in_place=True)
    for r in range(2):
        for got, other, expected in zip(in_place[r], scratch_path[r], want):
            assert torch.equal(got.view(torch.uint8), expected.view(torch.uint8))
            assert torch.equal(other.view(torch.uint8), expected.view(torch.uint8))


@pytest.mark.parametrize("dtype, wire", [(torch.float32, None), (torch.bfloat16, None), (torch.float16, None),
                                         (torch.float32, torch.bfloat16)])
def test_postscale_in_the_stages_has_the_bits_of_scaling_afterwards(dtype, wire):
    """A postscale applied chunk by chunk (in place, through the scratch, and cast from a
    narrower wire) gives the bits of reducing first and scaling the outputs afterwards."""
    gen = torch.Generator().manual_seed(11)
    sizes = [7, 19, 0, 3, 25]
    inputs = [[(torch.randn(n, generator=gen) * 5).to(dtype) for n in sizes] for _ in range(2)]
    narrow = [[t.to(wire) if wire else t for t in ins] for ins in inputs]
    want = [torch.add(a, b).to(dtype) * 0.5 for a, b in zip(*narrow)]
    paths = [_two_ranks([[t.clone() for t in ins] for ins in inputs], 8, ReduceOp.SUM, False, 0.5, wire)]
    if wire is None:
        paths.append(_two_ranks([[t.clone() for t in ins] for ins in inputs], 8, ReduceOp.SUM, True, 0.5))
    for outs in paths:
        for r in range(2):
            for got, expected in zip(outs[r], want):
                assert got.dtype == dtype and torch.equal(got.view(torch.uint8), expected.view(torch.uint8))
