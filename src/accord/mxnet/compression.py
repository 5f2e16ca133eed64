"""Gradient compression for ``DistributedTrainer(compression=...)``, with Horovod's MXNet
interface: ``compress(ndarray) -> (ndarray, ctx)`` and ``decompress(ndarray, ctx) -> ndarray``.

``hvd.Compression.none`` and ``.fp16`` work on NDArrays as Horovod's do (``fp16`` casts floating
arrays to float16 and back, other dtypes pass unchanged). Inside ``DistributedTrainer`` the
built-in ones are not called: the trainer hands the engine its own compressor
(:func:`engine_compressor`), which casts while it moves the data (one pass, no extra NDArrays).
Any other compressor (a user's subclass of :class:`Compressor`) runs on the NDArrays, as in
Horovod. ``.bf16`` (accord's) exists only on the engine's side: MXNet 1.9.1 NDArrays have no
bfloat16.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from accord import engine
from accord.errors import with_hint


def _is_float(dtype: Any) -> bool:
    return np.issubdtype(np.dtype(dtype), np.floating)


class Compressor:
    """Interface: turn a gradient NDArray into what is allreduced, and back."""

    @staticmethod
    def compress(tensor: Any) -> tuple[Any, Any]:
        """Turn a gradient into what is allreduced.

        Args:
            tensor: the gradient NDArray.

        Returns:
            ``(compressed, ctx)``: the NDArray to allreduce, and whatever :meth:`decompress`
            needs (e.g. the original dtype).

        Raises:
            NotImplementedError: the interface itself compresses nothing.
        """
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        """Undo :meth:`compress` on the allreduced NDArray.

        Args:
            tensor: the allreduced NDArray.
            ctx: what :meth:`compress` returned with it.

        Returns:
            The gradient, back in its own dtype.

        Raises:
            NotImplementedError: in this interface class.
        """
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Allreduce gradients unchanged (the default)."""

    @staticmethod
    def compress(tensor: Any) -> tuple[Any, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        return tensor


class FP16Compressor(Compressor):
    """Allreduce floating gradients as float16; other dtypes pass unchanged."""

    @staticmethod
    def compress(tensor: Any) -> tuple[Any, Any]:
        if _is_float(tensor.dtype):
            return tensor.astype("float16", copy=False), tensor.dtype
        return tensor, tensor.dtype

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        if ctx is not None and _is_float(ctx):
            return tensor.astype(ctx, copy=False)
        return tensor


class BF16Compressor(Compressor):
    """Allreduce floating gradients as bfloat16 (accord's): applied by the engine only."""

    @staticmethod
    def compress(tensor: Any) -> tuple[Any, Any]:
        raise TypeError(with_hint(
            f"Compression.bf16 cannot cast an NDArray ({np.dtype(tensor.dtype).name} "
            f"{tuple(tensor.shape)}): MXNet 1.9.1 has no bfloat16 NDArrays",
            "pass it to DistributedTrainer(compression=...), where the engine casts, or use "
            "Compression.fp16 on NDArrays"))

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        return tensor


class Compression:
    """Horovod's names: ``Compression.none``, ``.fp16``, and accord's ``.bf16``."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor


# The engine's compressor doing the same on the wire, for each built-in NDArray compressor.
_ENGINE_FORM = {NoneCompressor: engine.NoneCompressor, FP16Compressor: engine.FP16Compressor,
                BF16Compressor: engine.BF16Compressor}


def engine_compressor(compression: Any) -> Any:
    """The engine compressor to hand the engine for ``compression``, or None when
    ``compression`` must run on the NDArrays themselves (a user's compressor).

    The engine's own compressors (``accord.engine.Compressor`` subclasses, on torch tensors) pass through.
    """
    for ours, theirs in _ENGINE_FORM.items():
        if compression is ours:
            return theirs
    kind = compression if isinstance(compression, type) else type(compression)
    if issubclass(kind, engine.Compressor):
        return compression
    return None


__all__ = ["BF16Compressor", "Compression", "Compressor", "FP16Compressor", "NoneCompressor",
           "engine_compressor"]
