"""Test inputs every rank can rebuild for every other rank, and comparisons.

Two kinds of input:

- :func:`int_data`: small integers, exact in any dtype (for logic: matching, routing, shapes).
- :func:`random_values`: what precision checks need. Floating values carry the full mantissa
  of their dtype (float32 values are not representable in float16/bfloat16, float64 values
  not in float32), integer values are random bits over the whole range. A wire that narrows a
  dtype, even for one element, changes them.

Copies (broadcast, allgather, alltoall, scatter, gather) are compared bit for bit
(:func:`bits_equal`); reductions within :func:`reduce_tolerance`, a bound derived from the
dtype's rounding unit, the number of ranks and the inputs' magnitudes.
"""
from __future__ import annotations

import zlib
from typing import Sequence

import numpy as np


def int_data(seed: int, rank: int, shape: tuple, dtype: str = "float32") -> np.ndarray:
    """Small integers (-4..4) from (seed, rank): sums and products stay exact in any dtype."""
    rng = np.random.default_rng([seed, rank])
    return rng.integers(-4, 5, size=shape).astype(dtype)


def close(a, b, tol: float = 0.0) -> None:
    """Assert ``a`` equals ``b`` within ``tol`` (absolute and relative), compared in float64."""
    np.testing.assert_allclose(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64),
                               rtol=tol, atol=tol)


def _torch_dtype(dtype):
    import torch

    return getattr(torch, dtype) if isinstance(dtype, str) else dtype


def _rng(key: str | int | Sequence[int]) -> np.random.Generator:
    if isinstance(key, str):
        key = zlib.crc32(key.encode())
    return np.random.default_rng(key)


def random_values(key: str | int | Sequence[int], shape: tuple, dtype, spread: int = 3) -> np.ndarray:
    """Full-precision random input for ``dtype`` (a torch dtype or its name) from ``key``.

    Floating dtypes: normal values times a power of two in 2**-spread..2**spread (products
    over many ranks want ``spread=0``, or float16 overflows), rounded to ``dtype``,
    returned as float64 (bfloat16 has no numpy type; the values are exact in ``dtype``).
    Complex: both parts so. Integers: uniform random bits over the whole range, in the numpy
    dtype. bool: random. Use :func:`to_tensor` to make the tensor.
    """
    import torch

    dtype = _torch_dtype(dtype)
    rng = _rng(key)
    if dtype == torch.bool:
        return rng.integers(0, 2, size=shape).astype(bool)
    if dtype.is_complex:
        part = torch.float32 if dtype == torch.complex64 else torch.float64
        return (random_values([*_key_ints(key), 1], shape, part, spread)
                + 1j * random_values([*_key_ints(key), 2], shape, part, spread))
    if dtype.is_floating_point:
        raw = rng.standard_normal(size=shape) * np.exp2(rng.integers(-spread, spread + 1, size=shape))
        return torch.from_numpy(np.asarray(raw, dtype=np.float64)).to(dtype).double().numpy()
    info = np.iinfo(torch.empty(0, dtype=dtype).numpy().dtype)
    return rng.integers(int(info.min), int(info.max), size=shape, endpoint=True, dtype=info.dtype)


def _key_ints(key) -> list[int]:
    if isinstance(key, str):
        return [zlib.crc32(key.encode())]
    if isinstance(key, int):
        return [key]
    return [int(k) for k in key]


def to_tensor(array: np.ndarray, dtype):
    """A new tensor of ``dtype`` holding ``array`` (exact when the values fit ``dtype``)."""
    import torch

    dtype = _torch_dtype(dtype)
    if dtype in (torch.float16, torch.bfloat16):
        return torch.from_numpy(np.array(array, dtype=np.float64)).to(dtype)
    return torch.from_numpy(np.array(array)).to(dtype)  # a copy: collectives write in place


def rounding_unit(dtype) -> float:
    """The machine epsilon of a floating (or complex) dtype: 2**-(mantissa bits)."""
    import torch

    dtype = _torch_dtype(dtype)
    if dtype.is_complex:
        dtype = torch.float32 if dtype == torch.complex64 else torch.float64
    return float(torch.finfo(dtype).eps)


def reduce_tolerance(inputs: Sequence[np.ndarray], op: str, dtype, wire=None) -> np.ndarray | float:
    """Elementwise bound on |result - exact| for a floating reduction of ``inputs`` (one per
    rank) by ``op`` (``sum``, ``average``, ``product``, ``min``, ``max``) computed in ``dtype``.

    With n ranks a sum rounds at most n times (n - 1 additions and the final cast), each time
    by at most half an epsilon of the sum of magnitudes; the bound allows a full epsilon each
    (any summation order, any intermediate precision at least ``dtype``'s). A product: n
    relative roundings of the result. min/max pick an input: 0 (bit-exact). ``wire``: a
    narrower dtype the data travels in (compression), whose rounding of every input and of
    every partial result counts instead. Integer and bool dtypes: 0.
    """
    import torch

    dtype = _torch_dtype(dtype)
    if not (dtype.is_floating_point or dtype.is_complex) or op in ("min", "max"):
        return 0.0
    n = len(inputs)
    eps = max(rounding_unit(dtype), rounding_unit(wire) if wire is not None else 0.0)
    steps = n + 1 if wire is not None else n  # the wire cast of every input adds one rounding
    mags = np.stack([np.abs(np.asarray(a)) for a in inputs])
    tiny = float(torch.finfo(dtype if not dtype.is_complex else torch.float64).tiny)
    if op == "product":
        # complex products round each part of up to two terms: a few epsilons more per step
        per_step = 4 * eps if dtype.is_complex else eps
        return steps * per_step * np.prod(mags, axis=0) + tiny
    total = mags.sum(axis=0) * (2 if dtype.is_complex else 1)
    bound = steps * eps * total + tiny
    return bound / n if op == "average" else bound


def bits_equal(actual, expected: np.ndarray, dtype) -> bool:
    """True when tensor ``actual`` holds exactly ``expected``'s values in ``dtype``, bit for bit
    (-0.0 differs from 0.0; the same NaN bits compare equal)."""
    import torch

    dtype = _torch_dtype(dtype)
    want = to_tensor(expected, dtype)
    if tuple(actual.shape) != tuple(want.shape) or actual.dtype != dtype:
        return False
    if dtype == torch.bool:
        return bool(torch.equal(actual, want))
    raw = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64, 16: torch.int64}
    size = dtype.itemsize
    a, w = actual.detach().cpu().contiguous(), want.contiguous()
    if size == 16:  # complex128: compare as pairs of int64
        a, w = torch.view_as_real(a), torch.view_as_real(w)
        size = 8
    return bool(torch.equal(a.view(raw[size]), w.view(raw[size])))


def within(actual, expected: np.ndarray, bound) -> bool:
    """True when every |actual - expected| <= bound (compared in float64 / complex128)."""
    import torch

    wide = actual.detach().cpu()
    wide = wide.to(torch.complex128 if wide.is_complex() else torch.float64).numpy()
    if wide.shape != np.shape(expected):
        return False
    return bool(np.all(np.abs(wide - expected) <= bound))
