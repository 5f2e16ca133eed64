"""Stage 2's flat gradient buffers, one per bucket and backward pass, reused across steps.

A bucket's buffer lives from its first gradient until its reducescatter is collected. A new one
per bucket and step leaves the freed ones to the allocator, which keeps much of them: measured
on the 26 M MLP, a rank's RSS grew to ~930 MB over 8 steps that way, ~830 MB with reuse. So a
collected buffer is kept and handed, zeroed, to the next pass of a bucket of its size: at most
as many are kept as were ever in flight at once.
"""
from __future__ import annotations

import torch


class PassBuffers:
    """Flat buffers for one bucket's pass: taken, lent to the engine, then kept for reuse."""

    def __init__(self) -> None:
        self._lent: dict[int, torch.Tensor] = {}  # bucket index -> the buffer its reduction reads
        self.spares: list[torch.Tensor] = []

    def take(self, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A zeroed flat buffer of ``numel`` elements (a spare one when there is one)."""
        for k, spare in enumerate(self.spares):
            if spare.numel() == numel and spare.dtype == dtype and spare.device == device:
                del self.spares[k]
                return spare.zero_()
        return torch.zeros(numel, dtype=dtype, device=device)

    def lend(self, bucket: int, flat: torch.Tensor) -> None:
        """``flat`` is what bucket ``bucket``'s reduction now in flight reads."""
        self._lent[bucket] = flat

    def returned(self, bucket: int, result: torch.Tensor) -> None:
        """Bucket ``bucket``'s reduction is collected with ``result``: keep its buffer as a spare,
        unless ``result`` is a view of it (then it is still in use)."""
        flat = self._lent.pop(bucket, None)
        if flat is not None and result.untyped_storage().data_ptr() != flat.untyped_storage().data_ptr():
            self.spares.append(flat)
