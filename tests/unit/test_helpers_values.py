"""The precision helpers themselves (tests/helpers/values.py): inputs really use every bit of
their dtype, and the reduction bound separates a correct wire from a narrowed one."""
import numpy as np
import pytest
import torch
from helpers.values import bits_equal, random_values, reduce_tolerance, to_tensor, within


@pytest.mark.parametrize("dtype, narrower", [(torch.float32, (torch.float16, torch.bfloat16)),
                                             (torch.float64, (torch.float32, torch.float16, torch.bfloat16))])
def test_float_inputs_are_not_representable_in_a_narrower_dtype(dtype, narrower):
    x = to_tensor(random_values("k", (1000,), dtype), dtype)
    for small in narrower:
        kept = (x.to(small).to(dtype) == x).float().mean().item()
        assert kept < 0.01, f"{kept:.1%} of {dtype} inputs survive a trip through {small}"


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int32, torch.int64, torch.uint64])
def test_integer_inputs_are_random_bits(dtype):
    x = random_values("k", (4000,), dtype)
    bits = np.unpackbits(x.view(np.uint8))
    assert 0.45 < bits.mean() < 0.55  # every bit position is used, about half set
    assert x.dtype == torch.empty(0, dtype=dtype).numpy().dtype


def test_values_are_reproducible_per_key():
    assert np.array_equal(random_values([1, 2], (5,), "float32"), random_values([1, 2], (5,), "float32"))
    assert not np.array_equal(random_values("a|0", (5,), "float32"), random_values("a|1", (5,), "float32"))


def test_bits_equal_is_exact():
    want = random_values("b", (6,), torch.float32)
    t = to_tensor(want, torch.float32)
    assert bits_equal(t, want, torch.float32)
    assert not bits_equal(t.to(torch.bfloat16).float(), want, torch.float32)
    assert not bits_equal(torch.tensor([-0.0]), np.array([0.0]), torch.float32)
    assert not bits_equal(t.double(), want, torch.float32)  # dtype counts
    c = random_values("c", (3,), torch.complex128)
    assert bits_equal(to_tensor(c, torch.complex128), c, torch.complex128)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_sum_bound_holds_for_float32_and_catches_a_bf16_wire(n):
    ins = [random_values(f"s{r}", (4096,), torch.float32) for r in range(n)]
    exact = np.sum(ins, axis=0)
    bound = reduce_tolerance(ins, "sum", torch.float32)
    summed = to_tensor(ins[0], torch.float32)
    for x in ins[1:]:
        summed = summed + to_tensor(x, torch.float32)  # rounds at every step, in float32
    assert within(summed, exact, bound)
    narrowed = sum(to_tensor(x, torch.float32).to(torch.bfloat16).float() for x in ins)
    assert not within(narrowed, exact, bound)
    # ...but that same narrowed sum is within the bound for a bf16 wire
    assert within(narrowed, exact, reduce_tolerance(ins, "sum", torch.float32, wire=torch.bfloat16))


def test_min_max_and_integers_allow_no_error():
    ins = [random_values(f"m{r}", (8,), torch.float16) for r in range(3)]
    assert reduce_tolerance(ins, "max", torch.float16) == 0.0
    assert reduce_tolerance([np.arange(3)] * 2, "sum", torch.int32) == 0.0
