"""The sharded optimizer's layout (pure): buckets and per-rank spans."""
import pytest
import torch

from accord.comm.base_communicator import split_rows
from accord.torch.zero.layout import ParamInfo, plan_layout


def _infos(*shapes, dtype=torch.float32, group=0):
    return [ParamInfo(tuple(s), dtype, group) for s in shapes]


@pytest.mark.parametrize("world", [1, 2, 3, 4, 7])
def test_every_element_has_exactly_one_owner_and_spans_are_balanced(world):
    params = _infos((10, 3), (7,), (1,), (5, 5), (33,), ())
    layout = plan_layout(params, world, bucket_bytes=64)
    seen = {i: [0] * p.numel for i, p in enumerate(params)}
    for bucket in layout.buckets:
        sizes = [end - start for start, end in bucket.spans]
        assert max(sizes) - min(sizes) <= 1
        assert sizes == split_rows(bucket.numel, world)  # what the engine's reducescatter hands out
        assert bucket.spans[0][0] == 0 and bucket.spans[-1][1] == bucket.numel
        for rank in range(world):
            for piece in bucket.pieces(rank):
                for e in range(piece.start, piece.end):
                    seen[piece.param][e] += 1
    assert all(count == [1] * params[i].numel for i, count in seen.items())
    total = sum(p.numel for p in params)
    shards = [layout.shard_numel(r) for r in range(world)]
    assert sum(shards) == total
    # balanced per bucket, so at most one element per bucket apart overall
    assert max(shards) - min(shards) <= len(layout.buckets)


def test_buckets_follow_backward_order_and_respect_the_cap():
    params = _infos((100,), (100,), (100,), (300,))
    layout = plan_layout(params, 2, bucket_bytes=800)  # 200 float32 elements
    assert [b.params for b in layout.buckets] == [(3,), (2, 1), (0,)]  # last parameter first
    assert [b.numel for b in layout.buckets] == [300, 200, 100]  # an oversized tensor alone


def test_a_bucket_never_mixes_dtypes_or_groups():
    params = (_infos((4,), group=0) + _infos((4,), group=1) + _infos((4,), dtype=torch.float64, group=1)
              + _infos((4,), dtype=torch.float64, group=1))
    layout = plan_layout(params, 3, bucket_bytes=10**6)
    assert [(b.params, b.group, b.dtype) for b in layout.buckets] == [
        ((3, 2), 1, torch.float64), ((1,), 1, torch.float32), ((0,), 0, torch.float32)]


def test_shard_bytes_by_dtype_and_pieces_locate_the_shard():
    params = _infos((6,), dtype=torch.float64) + _infos((3,), dtype=torch.float16)
    layout = plan_layout(params, 2, bucket_bytes=10**6)
    assert layout.shard_bytes(0) == 2 * 2 + 3 * 8 and layout.shard_bytes(1) == 1 * 2 + 3 * 8
    wide = layout.buckets[1]
    assert [(p.param, p.start, p.end, p.shard_offset) for p in wide.pieces(1)] == [(0, 3, 6, 0)]


def test_a_bucket_smaller_than_the_world_leaves_empty_spans():
    layout = plan_layout(_infos((2,)), 4, bucket_bytes=64)
    assert layout.buckets[0].spans == ((0, 1), (1, 2), (2, 2), (2, 2))
    assert layout.buckets[0].pieces(3) == []


@pytest.mark.parametrize("world,cap", [(0, 10), (2, 0)])
def test_bad_arguments_are_refused(world, cap):
    with pytest.raises(ValueError, match="world|bucket"):
        plan_layout(_infos((3,)), world, cap)
