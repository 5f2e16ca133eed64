"""Reduction plans, encode/decode and scaling, checked without any process group."""
import numpy as np
import pytest
import torch

from accord.comm import dtypes
from accord.comm.base_communicator import normalize_ranks, split_rows
from accord.comm.ops import ReduceOp as Op
from accord.errors import BackendError

GLOO_LIKE = {(dt, op) for dt in (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8,
                                 torch.uint8, torch.int32, torch.int64) for op in dtypes.LIBRARY_OPS}


def native(dtype, op):
    return (dtype, op) in GLOO_LIKE


def only_f32(dtype, op):
    return dtype in (torch.float32, torch.int64)


@pytest.mark.parametrize("dtype,op,expected", [
    (torch.float32, Op.SUM, dtypes.ReducePlan(Op.SUM)),
    (torch.float32, Op.AVERAGE, dtypes.ReducePlan(Op.SUM, average=True)),
    (torch.bool, Op.SUM, dtypes.ReducePlan(Op.MAX, view_as=torch.uint8)),
    (torch.bool, Op.MAX, dtypes.ReducePlan(Op.MAX, view_as=torch.uint8)),
    (torch.bool, Op.MIN, dtypes.ReducePlan(Op.MIN, view_as=torch.uint8)),
    (torch.bool, Op.PRODUCT, dtypes.ReducePlan(Op.MIN, view_as=torch.uint8)),
    (torch.complex64, Op.SUM, dtypes.ReducePlan(Op.SUM, view_real=True)),
    (torch.complex64, Op.AVERAGE, dtypes.ReducePlan(Op.SUM, average=True, view_real=True)),
    (torch.complex64, Op.PRODUCT, dtypes.ReducePlan(Op.PRODUCT, gather=True)),
    (torch.int16, Op.SUM, dtypes.ReducePlan(Op.SUM, cast_to=torch.int32)),
    (torch.uint16, Op.MAX, dtypes.ReducePlan(Op.MAX, cast_to=torch.int32)),
    (torch.uint32, Op.PRODUCT, dtypes.ReducePlan(Op.PRODUCT, cast_to=torch.int64)),
    (torch.uint64, Op.SUM, dtypes.ReducePlan(Op.SUM, view_as=torch.int64)),
    (torch.uint64, Op.MIN, dtypes.ReducePlan(Op.MIN, view_as=torch.int64, flip_sign=True)),
    (torch.int8, Op.AVERAGE, dtypes.ReducePlan(Op.SUM, average=True, cast_to=torch.int64)),
    (torch.int64, Op.AVERAGE, dtypes.ReducePlan(Op.SUM, average=True)),
    (torch.float8_e4m3fn, Op.MAX, dtypes.ReducePlan(Op.MAX, cast_to=torch.float32)),
])
def test_plans_on_a_gloo_like_library(dtype, op, expected):
    assert dtypes.plan_reduction(dtype, op, native) == expected


def test_plans_fall_back_to_wider_types():
    assert dtypes.plan_reduction(torch.bfloat16, Op.SUM, only_f32).cast_to == torch.float32
    assert dtypes.plan_reduction(torch.int8, Op.MAX, only_f32).cast_to == torch.int64
    assert dtypes.plan_reduction(torch.complex32, Op.SUM, only_f32) == dtypes.ReducePlan(
        Op.SUM, view_real=True, cast_to=torch.float32)


@pytest.mark.parametrize("dtype,op,words", [
    (torch.bool, Op.AVERAGE, "mean of booleans"),
    (torch.complex64, Op.MIN, "not ordered"),
    (torch.complex128, Op.MAX, "not ordered"),
    (torch.uint64, Op.AVERAGE, "64 bits"),
    (torch.quint8, Op.SUM, "not a number type"),
])
def test_meaningless_pairs_refused(dtype, op, words):
    with pytest.raises(ValueError, match=words) as info:
        dtypes.plan_reduction(dtype, op, native)
    assert str(dtype) in str(info.value) and "\nHINT: " in str(info.value)


def test_adasum_refused():
    with pytest.raises(BackendError, match="Adasum"):
        dtypes.plan_reduction(torch.float32, Op.ADASUM, native)


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
@pytest.mark.parametrize("dtype,op", [
    (torch.bool, Op.SUM), (torch.complex64, Op.SUM), (torch.complex32, Op.SUM), (torch.uint64, Op.MIN),
    (torch.uint16, Op.SUM), (torch.int8, Op.AVERAGE), (torch.bfloat16, Op.SUM),
])
def test_encode_decode_round_trip(dtype, op):
    plan = dtypes.plan_reduction(dtype, op, only_f32 if dtype in (torch.bfloat16, torch.complex32) else native)
    if dtype == torch.bool:
        original = torch.tensor([True, False, True])
    elif dtype.is_complex:
        original = torch.tensor([1.5 - 2j, 0.25j]).to(dtype)
    elif dtype == torch.uint64:
        original = torch.tensor([0, 2**63 + 5, 7], dtype=torch.uint64)
    else:
        original = torch.tensor([3, 100, 7]).to(dtype)
    back = dtypes.decode(dtypes.encode(original.clone(), plan), plan, dtype)
    assert back.dtype == dtype
    if dtype.is_complex:  # equal() is not implemented for complex32
        back, original = torch.view_as_real(back), torch.view_as_real(original)
    assert back.equal(original)


def test_uint64_flip_preserves_unsigned_order():
    values = torch.tensor([1, 2**63 - 1, 2**63, 2**64 - 1], dtype=torch.uint64)
    plan = dtypes.plan_reduction(torch.uint64, Op.MAX, native)
    wire = dtypes.encode(values, plan)
    assert wire.argsort().tolist() == [0, 1, 2, 3]  # signed order of the wire = unsigned order


def test_integer_average_truncates_toward_zero():
    wire = torch.tensor([7, -7, 8, -8, 0])
    dtypes.divide_(wire, 3)
    assert wire.tolist() == [2, -2, 2, -2, 0]
    floats = torch.tensor([1.0, -2.0])
    dtypes.divide_(floats, 4)
    assert floats.tolist() == [0.25, -0.5]


def test_scale_semantics():
    ints = torch.tensor([7, -7, 3], dtype=torch.int32)
    dtypes.scale_(ints, 0.5)
    assert ints.tolist() == [3, -3, 1] and ints.dtype == torch.int32
    longs = torch.tensor([7, -7, 3])
    dtypes.scale_(longs, 0.5)
    assert longs.tolist() == [3, -3, 1] and longs.dtype == torch.int64
    floats = torch.tensor([1.0, 2.0])
    dtypes.scale_(floats, 0.5)
    assert floats.tolist() == [0.5, 1.0]
    halves = torch.tensor([1.0, 3.0], dtype=torch.float16)
    dtypes.scale_(halves, 0.25)
    assert halves.tolist() == [0.25, 0.75]
    flags = torch.tensor([True])
    dtypes.scale_(flags, 1.0)
    with pytest.raises(ValueError, match="bool"):
        dtypes.scale_(flags, 2.0)


def test_dtype_codes_round_trip():
    for dtype in dtypes.DTYPES:
        assert dtypes.dtype_from_code(dtypes.dtype_code(dtype)) == dtype
    assert dtypes.dtype_code(torch.quint8) == -1


@pytest.mark.parametrize("rows,size", [(5, 2), (5, 3), (2, 3), (0, 2), (6, 3)])
def test_split_rows_gives_lower_ranks_the_extra(rows, size):
    expected = [len(part) for part in np.array_split(np.arange(rows), size)]
    assert split_rows(rows, size) == expected


def test_normalize_ranks():
    assert normalize_ranks([2, 0], 3) == (0, 2)
    for bad in ([], [0, 0], [3], [-1]):
        with pytest.raises(ValueError, match="HINT"):
            normalize_ranks(bad, 3)


def test_empty_tensor_with_zero_stride_becomes_empty_bytes():
    import numpy as np
    import torch

    from accord.comm.base_communicator import _as_bytes

    empty = torch.from_numpy(np.zeros(0, np.float32))
    assert _as_bytes(empty).dtype == torch.uint8 and _as_bytes(empty).numel() == 0
    assert _as_bytes(torch.arange(3, dtype=torch.int16)).numel() == 6


def test_newer_float8_and_packed_float4_have_codes_and_float4_is_not_reduced():
    for name in ("float8_e8m0fnu", "float4_e2m1fn_x2"):
        dt = getattr(torch, name, None)
        if dt is None:
            continue
        assert dtypes.dtype_from_code(dtypes.dtype_code(dt)) is dt
    if hasattr(torch, "float4_e2m1fn_x2"):
        with pytest.raises(ValueError, match="(?s)4-bit.*HINT"):
            dtypes.plan_reduction(torch.float4_e2m1fn_x2, Op.SUM, lambda d, o: True)
    if hasattr(torch, "float8_e8m0fnu"):
        plan = dtypes.plan_reduction(torch.float8_e8m0fnu, Op.MAX, lambda d, o: d == torch.float32)
        assert plan.cast_to == torch.float32


def test_fresh_result_tensors_get_huge_page_advice_only_when_large():
    import sys

    from accord.comm import memory

    big = memory.empty((3 << 20,), torch.float32)  # 12 MB
    assert big.shape == (3 << 20,) and big.dtype == torch.float32 and big.is_contiguous()
    small = torch.empty(1024)
    assert memory.advise_huge_pages(small) is False
    import os
    if sys.platform.startswith("linux") and os.path.exists("/sys/kernel/mm/transparent_hugepage"):
        assert memory.advise_huge_pages(torch.empty(3 << 20)) is True
    src = torch.arange(12.0).reshape(3, 4).t()  # non-contiguous
    copy = memory.clone(src)
    assert copy.is_contiguous() and torch.equal(copy, src) and copy.data_ptr() != src.data_ptr()
