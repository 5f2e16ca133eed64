"""Fusion: pack ready allreduces that can share one collective into one flat buffer.

On Gloo a collective has a fixed cost of about a millisecond, so 160 small gradients reduced
one by one take 10x longer than the same bytes in one buffer (benchmarks/fusion_threshold.py). Requests
are grouped by everything the reduction depends on (:class:`FusionKey`), in ready order (the
same on every rank), and cut into batches of at most ``threshold`` bytes. Buffers are kept and
reused across cycles: a fresh 64 MB allocation costs more page faults than the copy itself.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import torch

from accord.engine.request import Op, Request

_GROW_ALIGN = 1 << 20  # bytes; grow buffers in whole MiB so small size changes do not reallocate


class FusionKey(NamedTuple):
    """Requests with equal keys may be reduced together in one buffer."""

    process_set: int
    device: str
    dtype: str  # on the wire
    reduce_op: int
    prescale: float
    postscale: float


def fusion_key(request: Request) -> FusionKey:
    """The key of an allreduce request, straight from its signature (cheap: no tensor calls)."""
    sig = request.signature
    return FusionKey(sig.process_set, sig.device, sig.wire_dtype, sig.reduce_op, sig.prescale,
                     sig.postscale)


def plan_work(ready: Sequence[Request], threshold: int) -> list[list[Request]]:
    """Split ready requests into work items executed in order.

    Allreduces with equal :class:`FusionKey` share a batch (placed where its first member was)
    until adding one more would pass ``threshold`` bytes; every other op is a one-request item.
    ``threshold`` 0 disables fusion. The result is identical on ranks given identical input.
    """
    items: list[list[Request]] = []
    open_batches: dict[FusionKey, tuple[list[Request], int]] = {}  # key -> (batch, bytes)
    for req in ready:
        if req.op is not Op.ALLREDUCE or threshold <= 0:
            items.append([req])
            continue
        key = fusion_key(req)
        batch, size = open_batches.get(key, (None, 0))
        if batch is None or size + req.nbytes > threshold:
            batch, size = [], 0
            items.append(batch)
        batch.append(req)
        open_batches[key] = (batch, size + req.nbytes)
    return items


class FusionBuffers:
    """One reusable flat buffer per (device, dtype), grown on demand, never shrunk."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[str, torch.dtype], torch.Tensor] = {}
        self.allocations = 0  # how many times a buffer was (re)allocated; tests watch it

    def get(self, device: torch.device | str, dtype: torch.dtype, numel: int) -> torch.Tensor:
        """A contiguous 1-D tensor of exactly ``numel`` elements, viewing the kept buffer."""
        key = (str(device), dtype)
        buf = self._buffers.get(key)
        if buf is None or buf.numel() < numel:
            item = torch.empty((), dtype=dtype).element_size()
            want = -(-numel * item // _GROW_ALIGN) * _GROW_ALIGN // item
            buf = torch.empty(max(want, numel), dtype=dtype, device=device)
            self._buffers[key] = buf
            self.allocations += 1
        return buf[:numel]

    def owns(self, tensor: torch.Tensor) -> bool:
        """True when ``tensor`` shares memory with one of the kept buffers."""
        ptr = tensor.untyped_storage().data_ptr()
        return any(b.untyped_storage().data_ptr() == ptr for b in self._buffers.values())

    def clear(self) -> None:
        """Drop every buffer (engine shutdown)."""
        self._buffers.clear()


class StagingBuffers:
    """Small buffers with one extra element, kept per (device, dtype, size): a planned cycle's
    lone request travels in one with its control value (:mod:`accord.engine.cycle.plan`). Reusing
    ready-made views spares the tensor operations of slicing a fusion buffer every cycle, which
    for a small request cost as much as the copies."""

    _KEEP = 8  # a job plans few distinct lone shapes at a time

    def __init__(self) -> None:
        self._staged: dict[tuple[str, torch.dtype, int], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def get(self, device: torch.device, dtype: torch.dtype, numel: int
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(whole buffer of ``numel + 1``, view of its first ``numel``, view of its last element)."""
        key = (str(device), dtype, numel)
        staged = self._staged.get(key)
        if staged is None:
            if len(self._staged) >= self._KEEP:
                self._staged.clear()
            buf = torch.empty(numel + 1, dtype=dtype, device=device)
            staged = self._staged[key] = (buf, buf[:numel], buf[numel:])
        return staged

    def clear(self) -> None:
        """Drop every buffer (engine shutdown)."""
        self._staged.clear()


def pack(tensors: Sequence[torch.Tensor], buffer: torch.Tensor) -> None:
    """Copy ``tensors`` back to back into the 1-D ``buffer`` (exactly their total size)."""
    # One torch.cat call copies everything in C++; the Python loop is the fallback for
    # non-contiguous tensors (a flat view of them does not exist).
    if all(t.is_contiguous() for t in tensors):
        torch.cat([t.view(-1) for t in tensors], out=buffer)
        return
    pos = 0
    for t in tensors:
        n = t.numel()
        buffer[pos:pos + n].view(t.shape).copy_(t)
        pos += n


def unpack(buffer: torch.Tensor, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """1-D views of ``buffer``, one per packed tensor (the inverse of :func:`pack`)."""
    return list(torch.split(buffer, [t.numel() for t in tensors]))


def copy_out(parts: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
    """Copy each 1-D part into its output (one fused call when every output is contiguous)."""
    if not outputs:
        return
    if all(o.is_contiguous() for o in outputs):
        torch._foreach_copy_([o.view(-1) for o in outputs], list(parts))
        return
    for p, o in zip(parts, outputs):
        o.copy_(p.view(o.shape))


def adjacent_span(tensors: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """A 1-D view covering ``tensors`` when they already lie back to back, in this order, in one
    storage (e.g. gradients allocated as views of one flat buffer); else None.

    Such a batch is reduced where it lies: no packing, no copying out.
    """
    first = tensors[0]
    storage = first.untyped_storage()
    base, pos, total = storage.data_ptr(), first.data_ptr(), 0
    for t in tensors:  # stops at the first gap, so the usual (scattered) case costs little
        if t.data_ptr() != pos or not t.is_contiguous() or t.untyped_storage().data_ptr() != base:
            return None
        n = t.numel()
        pos += n * t.element_size()
        total += n
    return torch.empty(0, dtype=first.dtype, device=first.device).set_(
        storage, first.storage_offset(), (total,), (1,))
