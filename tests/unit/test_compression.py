"""Compressors: what they cast, what they pass through, and the round trip."""
import numpy as np
import pytest
import torch

from accord.engine.compression import (BF16Compressor, Compression, FP16Compressor,
                                       NoneCompressor)

pytestmark = pytest.mark.timeout(10)


def test_horovod_names():
    assert Compression.none is NoneCompressor
    assert Compression.fp16 is FP16Compressor
    assert Compression.bf16 is BF16Compressor


def test_none_is_identity():
    t = torch.randn(4)
    c, ctx = Compression.none.compress(t)
    assert c is t and Compression.none.decompress(c, ctx) is t


@pytest.mark.parametrize("comp,wire,rtol", [(FP16Compressor, torch.float16, 1e-3),
                                            (BF16Compressor, torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_floating_tensors_are_cast_and_restored(comp, wire, rtol, dtype):
    values = np.linspace(-3.0, 3.0, 11)
    t = torch.tensor(values, dtype=dtype)
    c, ctx = comp.compress(t)
    assert c.dtype == wire and ctx == dtype
    back = comp.decompress(c, ctx)
    assert back.dtype == dtype
    np.testing.assert_allclose(back.numpy(), values, rtol=rtol, atol=rtol)


@pytest.mark.parametrize("comp", [FP16Compressor, BF16Compressor])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8, torch.bool])
def test_non_floating_tensors_pass_through(comp, dtype):
    t = torch.ones(3, dtype=dtype)
    c, ctx = comp.compress(t)
    assert c is t and ctx is None and comp.decompress(c, ctx) is t


def test_already_narrow_tensor_is_not_copied():
    t = torch.ones(3, dtype=torch.float16)
    c, ctx = FP16Compressor.compress(t)
    assert c is t and ctx is None
