"""Compressors: what they cast, what they pass through, and the round trip."""
import numpy as np
import pytest
import torch

from accord.engine.compression import BF16Compressor, Compression, FP16Compressor, NoneCompressor

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


@pytest.mark.parametrize("comp", [FP16Compressor, BF16Compressor])
def test_compress_into_reuses_a_fitting_buffer_and_matches_compress(comp):
    from accord.engine.compression import decompress_into

    t = torch.linspace(-5.0, 5.0, 37)
    first, ctx = comp.compress_into(t, None)
    assert first.dtype == comp.wire and ctx == torch.float32
    assert torch.equal(first, comp.compress(t)[0])
    t2 = t * 2
    again, _ = comp.compress_into(t2, first)
    assert again is first and torch.equal(again, comp.compress(t2)[0])
    # A buffer of another shape is not used (a new one is made).
    other, _ = comp.compress_into(t[:5], first)
    assert other is not first and other.shape == (5,)
    # Integer tensors and tensors already in the wire dtype pass through.
    ints = torch.arange(4)
    assert comp.compress_into(ints, None) == (ints, None)
    # decompress_into casts straight into the output, equal to decompress.
    out = torch.full_like(t2, -1.0)
    decompress_into(comp, again, torch.float32, out)
    assert torch.equal(out, comp.decompress(again, torch.float32))


def test_decompress_into_falls_back_to_decompress_for_other_compressors():
    from accord.engine.compression import Compressor, decompress_into

    class Negate(Compressor):
        @staticmethod
        def compress(tensor):
            return -tensor, None

        @staticmethod
        def decompress(tensor, ctx):
            return -tensor

    out = torch.zeros(3)
    decompress_into(Negate, torch.tensor([1.0, 2.0, 3.0]), None, out)
    assert out.tolist() == [-1.0, -2.0, -3.0]
