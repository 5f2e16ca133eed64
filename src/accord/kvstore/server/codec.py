"""2-bit dequantization in numpy, for parameter servers (which do not import torch).

Reads the wire format written by :func:`accord.kvstore.gradient_compression.compress`
(MXNet's layout): ``ceil(n / 16)`` float32 words; element ``i`` sits in byte ``i // 4`` of the
buffer, at bits 7-6, 5-4, 3-2, 1-0 for ``i % 4`` = 0..3; code ``11`` is +t, ``10`` is -t, anything
else 0.
"""
from __future__ import annotations

import struct
from typing import Any

import numpy as np

__all__ = ["dequantize_2bit", "packed_words"]

_SHIFTS = np.array([6, 4, 2, 0], dtype=np.uint8)


def packed_words(n: int) -> int:
    """Float32 words that carry ``n`` 2-bit values."""
    return (n + 15) // 16


def dequantize_2bit(packed: Any, threshold: float, n: int) -> np.ndarray:
    """``n`` float32 values in {-t, 0, +t} from a packed buffer (bytes-like or array).

    Raises:
        ValueError: the buffer is shorter than ``packed_words(n)`` words, or ``n`` < 0.
    """
    raw = np.frombuffer(packed, dtype=np.uint8)
    need = packed_words(n) * 4
    if n < 0 or raw.size < need:
        raise ValueError(f"{raw.size} bytes of 2-bit data cannot hold {n} values (need {need})")
    # float32(t): the sender compares against t rounded to float32 and sends exactly that.
    t = struct.unpack("f", struct.pack("f", float(threshold)))[0]
    codes = ((raw[:need, None] >> _SHIFTS) & 3).reshape(-1)[:n]
    out = np.zeros(n, dtype=np.float32)
    out[codes == 3] = t
    out[codes == 2] = -t
    return out
