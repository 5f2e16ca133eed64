"""2-bit compression against an element-by-element numpy reference of MXNet's algorithm."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from accord.kvstore.gradient_compression import (
    TwoBitCompression,
    compress,
    compressed_size,
    create_compression,
    decompress,
)

pytestmark = pytest.mark.timeout(60)


def ref_quantize(grad: np.ndarray, residual: np.ndarray, threshold: float) -> np.ndarray:
    """MXNet's quantize_2bit, one element at a time; returns the packed float32 words.

    Layout: element i -> word i//16, byte (i%16)//4 of the word in memory order, bits 7-6 / 5-4 /
    3-2 / 1-0 for i%4 = 0..3; 0b11 = +t, 0b10 = -t, 0b00 = 0.
    """
    t = np.float32(threshold)
    n = grad.size
    out = bytearray(4 * ((n + 15) // 16))
    g = grad.reshape(-1).astype(np.float32)
    r = residual.reshape(-1)
    for i in range(n):
        r[i] = np.float32(r[i] + g[i])
        byte = (i // 16) * 4 + (i % 16) // 4
        shift = 6 - 2 * (i % 4)
        if r[i] >= t:
            out[byte] |= 0b11 << shift
            r[i] = np.float32(r[i] - t)
        elif r[i] <= -t:
            out[byte] |= 0b10 << shift
            r[i] = np.float32(r[i] + t)
    return np.frombuffer(bytes(out), dtype=np.float32)


def ref_dequantize(packed: np.ndarray, threshold: float, n: int) -> np.ndarray:
    t = np.float32(threshold)
    raw = packed.tobytes()
    out = np.zeros(n, dtype=np.float32)
    for i in range(n):
        code = (raw[(i // 16) * 4 + (i % 16) // 4] >> (6 - 2 * (i % 4))) & 0b11
        out[i] = t if code == 0b11 else (-t if code == 0b10 else 0)
    return out


def _bits(x) -> np.ndarray:
    arr = x.numpy() if isinstance(x, torch.Tensor) else x
    return np.ascontiguousarray(arr).view(np.uint32)


def test_hand_computed_word():
    grad = torch.zeros(17)
    grad[:4] = torch.tensor([1.0, -1.0, 0.3, 0.0])
    grad[5] = 0.7  # element 5: byte 1, bits 5-4
    grad[16] = -2.0  # the 17th value starts a second word
    residual = torch.zeros(17)
    packed = compress(grad, residual, 0.5)
    assert packed.dtype == torch.float32 and packed.shape == (2,)
    assert packed.view(torch.uint8).tolist() == [0b11100000, 0b00110000, 0, 0, 0b10000000, 0, 0, 0]
    expected_res = np.zeros(17, dtype=np.float32)
    expected_res[[0, 1, 2, 5, 16]] = [0.5, -0.5, 0.3, np.float32(0.7) - np.float32(0.5), -1.5]
    np.testing.assert_array_equal(residual.numpy(), expected_res)
    expected = np.zeros(17, dtype=np.float32)
    expected[[0, 1, 5, 16]] = [0.5, -0.5, 0.5, -0.5]
    np.testing.assert_array_equal(decompress(packed, 0.5, 17).numpy(), expected)


@pytest.mark.parametrize("size", [1, 15, 16, 17, 33, 100, 257])
@pytest.mark.parametrize("threshold", [0.5, 0.1, 2.0])
def test_matches_reference_over_rounds(size, threshold):
    rng = np.random.default_rng(size * 7 + int(threshold * 10))
    res_t = torch.zeros(size)
    res_np = np.zeros(size, dtype=np.float32)
    for _ in range(6):  # the residual carries what was not sent into the next rounds
        g = rng.normal(0, threshold, size=size).astype(np.float32)
        packed = compress(torch.from_numpy(g.copy()), res_t, threshold)
        expected = ref_quantize(g, res_np, threshold)
        assert packed.numel() == compressed_size(size) == (size + 15) // 16
        np.testing.assert_array_equal(_bits(packed), _bits(expected))
        np.testing.assert_array_equal(res_t.numpy(), res_np)
        np.testing.assert_array_equal(
            decompress(packed, threshold, size).numpy(), ref_dequantize(expected, threshold, size)
        )


def test_error_feedback_conserves_the_sum():
    """Over rounds, sent values + final residual == sum of gradients (up to float rounding)."""
    rng = np.random.default_rng(1)
    comp = TwoBitCompression(threshold=0.25)
    total_grad = np.zeros((4, 9), dtype=np.float64)
    total_sent = np.zeros((4, 9), dtype=np.float64)
    for _ in range(20):
        g = torch.from_numpy(rng.normal(0, 0.1, size=(4, 9)).astype(np.float32))
        total_grad += g.numpy()
        out = comp.decompress(comp.compress("w", g), g.shape)
        assert out.shape == (4, 9)
        total_sent += out.numpy()
    residual = comp.residual("w", torch.zeros(36)).numpy().reshape(4, 9)
    np.testing.assert_allclose(total_sent + residual, total_grad, atol=1e-5)
    assert np.abs(residual).max() < 1.0  # what is not sent stays small: it is sent later


def test_threshold_is_float32_and_edges():
    t = 0.1  # not representable: MXNet compares against float32(0.1)
    g = torch.tensor([np.float32(0.1), -np.float32(0.1), np.nextafter(np.float32(0.1), np.float32(0))])
    res = torch.zeros(3)
    packed = compress(g, res, t)
    np.testing.assert_array_equal(decompress(packed, t, 3).numpy(),
                                  np.array([0.1, -0.1, 0.0], dtype=np.float32))
    np.testing.assert_array_equal(res.numpy()[:2], [0.0, 0.0])


def test_out_devices_and_shapes():
    g = torch.ones(2, 10)
    res = torch.zeros(20)
    packed = compress(g, res, 1.0)
    out = torch.full((2, 10), 7.0)
    assert decompress(packed, 1.0, 20, out=out) is out
    assert torch.equal(out, torch.ones(2, 10))
    g16 = torch.ones(20, dtype=torch.bfloat16) * 2
    assert torch.equal(decompress(compress(g16, torch.zeros(20), 1.0), 1.0, 20), torch.ones(20))


def test_errors():
    with pytest.raises(ValueError, match="threshold > 0"):
        compress(torch.ones(3), torch.zeros(3), 0.0)
    with pytest.raises(ValueError, match="residual has 4 elements"):
        compress(torch.ones(3), torch.zeros(4), 0.5)
    with pytest.raises(ValueError, match="float32"):
        compress(torch.ones(3), torch.zeros(3, dtype=torch.float64), 0.5)
    with pytest.raises(ValueError, match="contiguous"):
        compress(torch.ones(3), torch.zeros(3, 2).t()[0], 0.5)
    with pytest.raises(ValueError, match="floating"):
        compress(torch.ones(3, dtype=torch.int64), torch.zeros(3), 0.5)
    with pytest.raises(ValueError, match="cannot hold 17 values"):
        decompress(torch.zeros(1), 0.5, 17)
    comp = TwoBitCompression()
    comp.compress(1, torch.ones(5))
    with pytest.raises(ValueError, match="HINT: a key keeps one shape"):
        comp.compress(1, torch.ones(6))
    comp.reset(1)
    comp.compress(1, torch.ones(6))


def test_create_compression_params():
    comp = create_compression({"type": "2bit", "threshold": 0.25})
    assert comp.get_params() == {"type": "2bit", "threshold": 0.25}
    assert create_compression({"type": "2bit"}).threshold == 0.5  # MXNet's default
    with pytest.raises(ValueError, match=r"known: \['2bit'\]"):
        create_compression({"type": "1bit"})
    with pytest.raises(ValueError, match="unknown gradient compression parameter"):
        create_compression({"type": "2bit", "thresh": 1})
    with pytest.raises(ValueError, match="HINT:"):
        create_compression({"threshold": 1})



@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu_bitwise():
    g = torch.randn(1000)
    res_cpu, res_gpu = torch.zeros(1000), torch.zeros(1000, device="cuda")
    for _ in range(3):
        p_cpu = compress(g, res_cpu, 0.5)
        p_gpu = compress(g.cuda(), res_gpu, 0.5)
        assert p_gpu.is_cuda
        assert torch.equal(p_gpu.cpu().view(torch.int32), p_cpu.view(torch.int32))
        assert torch.equal(res_gpu.cpu(), res_cpu)
        assert torch.equal(decompress(p_gpu, 0.5, 1000).cpu(), decompress(p_cpu, 0.5, 1000))
