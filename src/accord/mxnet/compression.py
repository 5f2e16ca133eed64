"""Gradient compression for ``DistributedTrainer(compression=...)``: accord's engine compressors
under Horovod's names (``hvd.Compression.none``, ``.fp16``, and accord's ``.bf16``).

The engine applies them to the torch views of the gradients while it moves the data (a cast
into the fusion buffer and back, no extra pass), so the NDArrays keep their dtype.
"""
from __future__ import annotations

from accord.engine.compression import BF16Compressor, Compression, Compressor, FP16Compressor, NoneCompressor

__all__ = ["BF16Compressor", "Compression", "Compressor", "FP16Compressor", "NoneCompressor"]
