"""Fusion planning, packing arithmetic and buffer reuse (no processes)."""
import numpy as np
import pytest
import torch

from accord.comm.base_communicator import split_rows
from accord.comm.ops import ReduceOp
from accord.engine.cycle.execute import wire_reduction
from accord.engine.cycle.fusion import FusionBuffers, adjacent_span, copy_out, pack, plan_work, unpack
from accord.engine.request import Op, Request

pytestmark = pytest.mark.timeout(10)


def ar(name, n, dtype=torch.float32, **kw):
    return Request(name, Op.ALLREDUCE, torch.zeros(n, dtype=dtype), **kw)


def names(items):
    return [[r.name for r in item] for item in items]


def test_batches_group_by_key_and_respect_threshold():
    reqs = [ar("a", 10), ar("b", 10, torch.float64), ar("c", 10), ar("d", 10),
            Request("x", Op.BROADCAST, torch.zeros(3), root_rank=0),
            ar("e", 10, reduce_op=ReduceOp.MAX), ar("f", 10, prescale_factor=2.0), ar("g", 10)]
    # float32 SUM tensors are 40 bytes: a threshold of 120 bytes fits three of them
    items = plan_work(reqs, threshold=120)
    assert names(items) == [["a", "c", "d"], ["b"], ["x"], ["e"], ["f"], ["g"]]
    assert names(plan_work(reqs, threshold=80)) == [["a", "c"], ["b"], ["d", "g"], ["x"], ["e"], ["f"]]


def test_threshold_zero_disables_fusion_and_oversized_requests_go_alone():
    reqs = [ar("a", 10), ar("b", 10)]
    assert names(plan_work(reqs, threshold=0)) == [["a"], ["b"]]
    assert names(plan_work([ar("big", 100), ar("s", 1)], threshold=40)) == [["big"], ["s"]]


def test_process_sets_and_devices_are_separate_groups():
    reqs = [ar("a", 4), ar("b", 4, process_set_id=1), ar("c", 4)]
    assert names(plan_work(reqs, threshold=1 << 20)) == [["a", "c"], ["b"]]


@pytest.mark.parametrize("contiguous", [True, False])
def test_pack_unpack_roundtrip(contiguous):
    a = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    b = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    b = b.contiguous() if contiguous else b.t()  # the fallback path copies strided tensors
    c = torch.tensor(7.0)
    bufs = FusionBuffers()
    buf = bufs.get("cpu", torch.float32, 6 + 12 + 1)
    pack([a, b, c], buf)
    expected = np.concatenate([a.numpy().ravel(), b.numpy().ravel(), [7.0]])
    np.testing.assert_array_equal(buf.numpy(), expected)
    views = unpack(buf, [a, b, c])
    for t, v in zip([a, b, c], views):
        assert v.dim() == 1 and v.numel() == t.numel()
        np.testing.assert_array_equal(v.numpy(), t.numpy().ravel())
    outs = [torch.zeros_like(t) for t in (a, b, c)]
    if not contiguous:
        outs[1] = torch.zeros(3, 4).t()  # a strided output too
    copy_out(views, outs)
    for t, o in zip([a, b, c], outs):
        np.testing.assert_array_equal(o.numpy(), t.numpy())


def test_adjacent_span_only_for_back_to_back_tensors_in_order():
    flat = torch.arange(10, dtype=torch.float32)
    a, b, c = flat[0:3], flat[3:7].view(2, 2), flat[7:10]
    span = adjacent_span([a, b, c])
    assert span is not None and span.shape == (10,) and span.data_ptr() == flat.data_ptr()
    span.mul_(2)  # the span is the user's memory: no copy was made
    assert flat.tolist() == [2.0 * i for i in range(10)]
    bc = adjacent_span([b, c])
    assert bc.shape == (7,) and bc.data_ptr() == b.data_ptr()
    assert adjacent_span([a, c]) is None  # gap
    assert adjacent_span([b, a]) is None  # wrong order: every rank must pack in ready order
    assert adjacent_span([torch.zeros(3), torch.zeros(3)]) is None  # separate storages
    assert adjacent_span([flat[0:4].view(2, 2).t(), flat[4:6]]) is None  # strided


def test_buffers_are_reused_and_grow_only_when_needed():
    bufs = FusionBuffers()
    first = bufs.get("cpu", torch.float32, 1000)
    ptr = first.data_ptr()
    for n in (10, 1000, 200_000):  # 800 KB still fits the first MiB
        assert bufs.get("cpu", torch.float32, n).data_ptr() == ptr
    assert bufs.allocations == 1 and bufs.owns(first[5:])
    big = bufs.get("cpu", torch.float32, 300_000)
    assert bufs.allocations == 2 and big.numel() == 300_000
    assert bufs.get("cpu", torch.float32, 10).data_ptr() == big.data_ptr()
    bufs.get("cpu", torch.float64, 10)
    assert bufs.allocations == 3
    assert not bufs.owns(torch.zeros(3))


def test_average_rules():
    # scale_ itself (prescale/postscale) is tested with accord.comm.dtypes.
    assert wire_reduction(ReduceOp.AVERAGE, torch.float32, 3.0, 4) == (ReduceOp.SUM, 0.75)
    assert wire_reduction(ReduceOp.AVERAGE, torch.int32, 1.0, 4) == (ReduceOp.AVERAGE, 1.0)
    assert wire_reduction(ReduceOp.MAX, torch.float32, 2.0, 4) == (ReduceOp.MAX, 2.0)


def test_even_splits_give_lower_ranks_the_extra_rows():
    assert split_rows(7, 3) == [3, 2, 2]
    assert split_rows(2, 3) == [1, 1, 0]
