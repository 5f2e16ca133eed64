"""Gradient compression for ``hvd.allreduce(..., compression=...)`` and ``DistributedOptimizer``:
``Compression.none``, ``Compression.fp16`` and (beyond Horovod) ``Compression.bf16``.

A compressor is a class (or object) with ``compress(tensor) -> (tensor, ctx)`` and
``decompress(tensor, ctx) -> tensor``; subclass :class:`Compressor` to write your own.
"""
from __future__ import annotations

from accord.engine import BF16Compressor, Compression, Compressor, FP16Compressor, NoneCompressor

__all__ = ["Compression", "Compressor", "NoneCompressor", "FP16Compressor", "BF16Compressor"]
