"""MXNet's 2-bit gradient compression with residual (error feedback), vectorised in torch.

Algorithm (per element, threshold ``t > 0``, residual ``r`` kept by the sender between rounds)::

    r += g
    if r >= t:    send +t, r -= t
    elif r <= -t: send -t, r += t
    else:         send 0,  r unchanged

so what is not sent now is sent in a later round. Arithmetic is float32 with ``t`` rounded to
float32 first, as MXNet stores it, so results match MXNet bit for bit.

Wire format (MXNet's ``quantize_2bit`` / ``dequantize_2bit`` layout): a float32 tensor of
``ceil(n / 16)`` words, each holding 16 elements at 2 bits each. Element ``i`` lives in word
``i // 16``, in byte ``(i % 16) // 4`` of that word *in memory order* (byte 0 = lowest address),
and within the byte at bits 7-6 for ``i % 4 == 0``, 5-4 for 1, 3-2 for 2 and 1-0 for 3. Codes:
``11`` = +t, ``10`` = -t, ``00`` = 0 (``01`` never written; read back as 0). Padding elements of
the last word are ``00``. The words are bit patterns, not numbers (some are NaNs): copy them,
never add or average them.
"""
from __future__ import annotations

import math
import struct
from typing import Any, Hashable, Mapping

import torch

__all__ = [
    "TwoBitCompression",
    "compress",
    "compressed_size",
    "create_compression",
    "decompress",
]

VALUES_PER_WORD = 16
_SHIFTS = (6, 4, 2, 0)  # bit offset of elements 0..3 of a byte
_POS, _NEG = 3, 2  # codes 0b11 and 0b10


def _float32(value: float) -> float:
    """``value`` rounded to the nearest float32 (so comparisons agree in any precision)."""
    return struct.unpack("f", struct.pack("f", value))[0]


def _check_threshold(threshold: float) -> float:
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) \
            or not math.isfinite(threshold) or _float32(threshold) <= 0:
        raise ValueError(
            f"2-bit compression needs a finite threshold > 0; got {threshold!r}.\n"
            "HINT: pass e.g. {'type': '2bit', 'threshold': 0.5} (MXNet's default is 0.5)."
        )
    return _float32(float(threshold))


def compressed_size(original_size: int) -> int:
    """Number of float32 words that carry ``original_size`` values (16 per word)."""
    return (original_size + VALUES_PER_WORD - 1) // VALUES_PER_WORD


def compress(grad: torch.Tensor, residual: torch.Tensor, threshold: float) -> torch.Tensor:
    """Quantize ``grad`` (plus the carried ``residual``) to 2 bits per value.

    Args:
        grad: floating tensor of any shape (computed as float32).
        residual: float32, contiguous, same number of elements; updated in place.
        threshold: ``t > 0``.
    Returns:
        A 1-D float32 tensor of :func:`compressed_size` words on ``grad``'s device.
    Raises:
        ValueError: bad threshold, dtypes, sizes or a non-contiguous residual.
    """
    t = _check_threshold(threshold)
    if not grad.is_floating_point():
        raise ValueError(
            f"2-bit compression needs a floating gradient; got dtype {grad.dtype}.\n"
            "HINT: compress only floating-point gradients; send integer tensors uncompressed."
        )
    if residual.dtype != torch.float32 or not residual.is_contiguous():
        raise ValueError(
            f"the residual must be a contiguous float32 tensor; got dtype {residual.dtype}, "
            f"contiguous={residual.is_contiguous()}.\n"
            "HINT: create it with torch.zeros(grad.numel(), dtype=torch.float32)."
        )
    if residual.numel() != grad.numel():
        raise ValueError(
            f"the residual has {residual.numel()} elements but the gradient has {grad.numel()} "
            f"(shape {tuple(grad.shape)}).\n"
            "HINT: keep one residual per key, sized like that key's gradient."
        )
    n = grad.numel()
    r = residual.view(-1)
    r.add_(grad.reshape(-1).to(device=r.device, dtype=torch.float32))
    pos = r >= t
    neg = r <= -t
    # r - t where positive, r + t where negative, r - 0 (= r exactly) elsewhere.
    r.sub_(pos.to(torch.float32) - neg.to(torch.float32), alpha=t)
    words = compressed_size(n)
    codes = torch.zeros(words * VALUES_PER_WORD, dtype=torch.uint8, device=r.device)
    codes[:n] = pos.to(torch.uint8) * _POS + neg.to(torch.uint8) * _NEG
    codes = codes.view(-1, 4)
    packed = (codes[:, 0] << _SHIFTS[0]) | (codes[:, 1] << _SHIFTS[1]) \
        | (codes[:, 2] << _SHIFTS[2]) | codes[:, 3]
    # Reinterpreting the bytes (not converting them) keeps MXNet's memory layout on any host.
    return packed.view(torch.float32)


def decompress(
    packed: torch.Tensor,
    threshold: float,
    original_size: int,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Turn packed words back into ``original_size`` float32 values in {-t, 0, +t}.

    Args:
        packed: the float32 words :func:`compress` returned (at least ``compressed_size`` of them).
        threshold: the ``t`` the sender used.
        original_size: number of values to recover.
        out: optional float32 tensor of ``original_size`` elements to write into.
    Returns:
        ``out`` (if given) or a new 1-D float32 tensor on ``packed``'s device.
    Raises:
        ValueError: bad threshold, dtype, too few words, or an ``out`` of the wrong size.
    """
    t = _check_threshold(threshold)
    if packed.dtype != torch.float32:
        raise ValueError(
            f"packed 2-bit data must be float32 words; got dtype {packed.dtype}.\n"
            "HINT: pass the tensor compress() returned, unchanged."
        )
    need = compressed_size(original_size)
    if original_size < 0 or packed.numel() < need:
        raise ValueError(
            f"{packed.numel()} packed words cannot hold {original_size} values (need {need}).\n"
            "HINT: pass the original number of elements of the gradient that was compressed."
        )
    raw = packed.reshape(-1)[:need].contiguous().view(torch.uint8)
    shifts = torch.tensor(_SHIFTS, dtype=torch.uint8, device=raw.device)
    codes = ((raw.unsqueeze(1) >> shifts) & 3).reshape(-1)[:original_size]
    values = (codes == _POS).to(torch.float32) - (codes == _NEG).to(torch.float32)
    values.mul_(t)
    if out is None:
        return values
    if out.numel() != original_size or out.dtype != torch.float32:
        raise ValueError(
            f"out must be a float32 tensor of {original_size} elements; got dtype {out.dtype} "
            f"with {out.numel()} elements.\n"
            "HINT: allocate out like the original gradient (torch.float32)."
        )
    out.view(-1).copy_(values)
    return out


class TwoBitCompression:
    """2-bit compression state of one sender: the threshold and one residual per key.

    Example::

        comp = TwoBitCompression(threshold=0.5)
        packed = comp.compress("w", grad)              # on the worker
        merged += comp.decompress(packed, grad.shape)   # on the receiver
    """

    type = "2bit"

    def __init__(self, threshold: float = 0.5) -> None:
        self.threshold = _check_threshold(threshold)
        self._residuals: dict[Hashable, torch.Tensor] = {}

    def residual(self, key: Hashable, like: torch.Tensor) -> torch.Tensor:
        """The residual of ``key`` (zeros the first time, sized and placed like ``like``)."""
        res = self._residuals.get(key)
        if res is None:
            res = torch.zeros(like.numel(), dtype=torch.float32, device=like.device)
        elif res.numel() != like.numel():
            raise ValueError(
                f"key {key!r} was compressed with {res.numel()} elements before and now has "
                f"{like.numel()} (shape {tuple(like.shape)}).\n"
                "HINT: a key keeps one shape; use a new key or call reset(key) first."
            )
        elif res.device != like.device:  # the gradient moved: keep its carried error
            res = res.to(like.device)
        self._residuals[key] = res
        return res

    def compress(self, key: Hashable, grad: torch.Tensor) -> torch.Tensor:
        """Quantize ``grad`` for ``key``, carrying that key's residual across calls."""
        return compress(grad, self.residual(key, grad), self.threshold)

    def decompress(self, packed: torch.Tensor, shape: torch.Size | tuple[int, ...] | int) -> torch.Tensor:
        """Recover a float32 tensor of ``shape`` (or of that many elements) from ``packed``."""
        dims = (shape,) if isinstance(shape, int) else tuple(shape)
        return decompress(packed, self.threshold, math.prod(dims)).view(dims)

    def reset(self, key: Hashable | None = None) -> None:
        """Forget the residual of ``key`` (every key when None)."""
        if key is None:
            self._residuals.clear()
        else:
            self._residuals.pop(key, None)

    def get_params(self) -> dict[str, Any]:
        """The parameters as ``set_gradient_compression`` takes them."""
        return {"type": self.type, "threshold": self.threshold}


def create_compression(params: Mapping[str, Any]) -> TwoBitCompression:
    """Build a compressor from MXNet-style ``{'type': '2bit', 'threshold': t}`` parameters.

    Raises:
        ValueError: a missing or unknown type, unknown keys or a bad threshold.
    """
    if not isinstance(params, Mapping) or "type" not in params:
        raise ValueError(
            f"gradient compression parameters must be a dict with a 'type'; got {params!r}.\n"
            "HINT: pass {'type': '2bit', 'threshold': 0.5}."
        )
    kind = params["type"]
    if kind != TwoBitCompression.type:
        raise ValueError(
            f"unknown gradient compression type {kind!r}; known: ['2bit'].\n"
            "HINT: use {'type': '2bit', 'threshold': t}."
        )
    extra = sorted(set(params) - {"type", "threshold"})
    if extra:
        raise ValueError(
            f"unknown gradient compression parameter(s) {extra} for type '2bit'.\n"
            "HINT: '2bit' takes only 'threshold'."
        )
    return TwoBitCompression(threshold=params.get("threshold", 0.5))
