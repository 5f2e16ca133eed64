"""Gradient compression applied around a collective: ``compress(t) -> (t, ctx)`` / ``decompress``.

The engine compresses a request's tensor when it is submitted and decompresses the collective's
result into the output, so every rank sends the narrower dtype over the wire. Only floating
tensors are cast; integer and bool tensors pass through unchanged. ``Compression.fp16`` etc. are
Horovod's names (``hvd.Compression.fp16``).
"""
from __future__ import annotations

from typing import Any

import torch


class Compressor:
    """Interface: turn a tensor into what goes on the wire, and back."""

    name = "compressor"
    # True when decompress(t, None) is t itself: lets the engine skip per-tensor calls.
    passthrough = False

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """Return the tensor to communicate and whatever ``decompress`` needs.

        Args:
            tensor: the tensor a collective is about to send.

        Returns:
            ``(wire_tensor, ctx)``: what travels, and what :meth:`decompress` needs back.
        """
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        """Undo ``compress`` on the collective's result.

        Args:
            tensor: the collective's result, in the wire dtype.
            ctx: what :meth:`compress` returned beside the wire tensor.

        Returns:
            The result in the original form (dtype) of the compressed tensor.
        """
        raise NotImplementedError


def decompress_into(compression: Any, tensor: torch.Tensor, ctx: Any, out: torch.Tensor) -> None:
    """Write the decompressed ``tensor`` into ``out``: straight from the wire dtype for the
    built-in casts (no full-size temporary), through ``decompress`` for any other compressor."""
    into = getattr(compression, "decompress_into", None)
    if into is not None:
        into(tensor, ctx, out)
        return
    value = compression.decompress(tensor, ctx)
    if value is not out:
        out.copy_(value)


def deferred_cast(compression: Any, tensor: torch.Tensor) -> torch.dtype | None:
    """The dtype the engine may cast ``tensor`` to while it moves the data, in place of
    ``compression.compress`` (one pass over the data instead of three: cast, send, cast back);
    None when ``compression`` is not a plain built-in cast or leaves ``tensor`` unchanged."""
    if (not isinstance(compression, type) or not issubclass(compression, _CastCompressor)
            or compression.compress.__func__ is not _CastCompressor.compress.__func__):
        return None  # a user's subclass with its own compress() must run it
    wire = compression.wire
    if tensor.layout == torch.strided and tensor.is_floating_point() and tensor.dtype != wire:
        return wire
    return None


class NoneCompressor(Compressor):
    """Send tensors unchanged."""

    name = "none"
    passthrough = True

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor


class _CastCompressor(Compressor):
    """Cast floating tensors wider than ``wire`` to ``wire``; remember the original dtype."""

    wire: torch.dtype = torch.float16
    passthrough = True

    @classmethod
    def compress(cls, tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        # Complex and already-narrow tensors are left alone: a cast would lose data or gain nothing.
        if tensor.is_floating_point() and tensor.dtype != cls.wire:
            return tensor.to(cls.wire), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor if ctx is None else tensor.to(ctx)

    @classmethod
    def compress_into(cls, tensor: torch.Tensor, buffer: torch.Tensor | None) -> tuple[torch.Tensor, Any]:
        """As :meth:`compress`, writing into ``buffer`` when it fits (else a new one).

        Reusing one wire buffer per gradient spares a fresh allocation every step: large ones
        come from mmap and page-fault on first touch, which costs more than the cast itself.
        """
        if not tensor.is_floating_point() or tensor.dtype == cls.wire:
            return tensor, None
        if (buffer is None or buffer.shape != tensor.shape or buffer.dtype != cls.wire
                or buffer.device != tensor.device):
            buffer = torch.empty(tensor.shape, dtype=cls.wire, device=tensor.device)
        buffer.copy_(tensor)
        return buffer, tensor.dtype

    @staticmethod
    def decompress_into(tensor: torch.Tensor, ctx: Any, out: torch.Tensor) -> None:
        """Cast the wire tensor straight into ``out`` (``copy_`` converts)."""
        if tensor is not out:
            out.copy_(tensor)


class FP16Compressor(_CastCompressor):
    """Send floating tensors as float16 (halves the bytes; ~3 significant digits)."""

    name = "fp16"
    wire = torch.float16


class BF16Compressor(_CastCompressor):
    """Send floating tensors as bfloat16 (float32's range, ~2 significant digits)."""

    name = "bf16"
    wire = torch.bfloat16


class Compression:
    """Horovod's names for the built-in compressors: ``Compression.none/.fp16/.bf16``."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
