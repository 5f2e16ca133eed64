"""Where every parameter element lives in a sharded optimizer: buckets and per-rank spans (pure).

The parameters that require grad are cut into *buckets*, runs of consecutive parameters of one
optimizer parameter group and one dtype, taken in reverse order (the order backward produces
their gradients, so the first bucket is ready first) and closed once they reach ``bucket_bytes``.
A bucket is one flat buffer; each rank owns one contiguous ``[start, end)`` span of it, the
spans balanced to within one element. The engine's reducescatter splits a tensor's dim 0 the
same way (``split_rows``: lower ranks get the extra element), so one reducescatter of a
bucket's flat gradient hands every rank exactly its span; and balancing every bucket balances
the whole shard by bytes, whatever the sizes of the tensors.

Why not one span per rank over the whole flat model: the buckets that backward fills first
would all belong to the last rank, so every early bucket would be a reduce to one rank, not a
reducescatter, and the traffic could not spread over the ranks while backward runs.

Nothing here talks to other ranks: every rank computes the same layout from the same parameter
list (:mod:`accord.torch.zero.checks` makes sure the lists are the same).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

# The engine's reducescatter rule: the layout must agree with it.
from accord.comm.base_communicator import split_rows


@dataclass(frozen=True)
class ParamInfo:
    """What the layout needs to know of one parameter (in the optimizer's order)."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    group: int  # index of its optimizer parameter group

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Slot:
    """One parameter's place in its bucket: elements ``[offset, offset + numel)``."""

    param: int  # index into the layout's parameter list
    offset: int
    numel: int


@dataclass(frozen=True)
class Piece:
    """Part of a parameter inside a rank's span: parameter elements ``[start, end)`` sit at
    ``shard_offset`` in that rank's shard of the bucket."""

    param: int
    start: int
    end: int
    shard_offset: int


@dataclass(frozen=True)
class Bucket:
    """A flat buffer of consecutive parameters of one group and dtype."""

    index: int
    group: int
    dtype: torch.dtype
    slots: tuple[Slot, ...]
    numel: int
    spans: tuple[tuple[int, int], ...]  # per rank of the set: [start, end) in the bucket

    @property
    def params(self) -> tuple[int, ...]:
        return tuple(s.param for s in self.slots)

    def pieces(self, rank: int) -> list[Piece]:
        """The parts of parameters that fall in ``rank``'s span, in bucket order."""
        start, end = self.spans[rank]
        out = []
        for slot in self.slots:
            lo, hi = max(start, slot.offset), min(end, slot.offset + slot.numel)
            if lo < hi:
                out.append(Piece(slot.param, lo - slot.offset, hi - slot.offset, lo - start))
        return out


@dataclass(frozen=True)
class Layout:
    """Buckets over ``params`` for a set of ``world`` ranks."""

    params: tuple[ParamInfo, ...]
    buckets: tuple[Bucket, ...]
    world: int

    def bucket_of(self) -> dict[int, Bucket]:
        """Parameter index -> the bucket holding it."""
        return {slot.param: b for b in self.buckets for slot in b.slots}

    def shard_numel(self, rank: int) -> int:
        """Elements ``rank`` owns over every bucket."""
        return sum(end - start for b in self.buckets for start, end in [b.spans[rank]])

    def shard_bytes(self, rank: int) -> int:
        """Bytes of parameters ``rank`` owns (what its optimizer state scales with)."""
        return sum((b.spans[rank][1] - b.spans[rank][0]) * _itemsize(b.dtype) for b in self.buckets)


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def plan_layout(params: Sequence[ParamInfo], world: int, bucket_bytes: int) -> Layout:
    """Cut ``params`` into buckets of at most ``bucket_bytes`` (a parameter larger than that gets
    a bucket of its own) and split every bucket into ``world`` balanced spans.

    Raises:
        ValueError: ``world`` < 1 or ``bucket_bytes`` < 1.
    """
    if world < 1:
        raise ValueError(f"a layout needs at least one rank, got world={world}")
    if bucket_bytes < 1:
        raise ValueError(f"bucket size must be positive, got {bucket_bytes} bytes")
    buckets: list[Bucket] = []
    current: list[int] = []

    def close() -> None:
        if not current:
            return
        first = params[current[0]]
        slots, offset = [], 0
        for i in current:
            slots.append(Slot(i, offset, params[i].numel))
            offset += params[i].numel
        spans, start = [], 0
        for rows in split_rows(offset, world):
            spans.append((start, start + rows))
            start += rows
        buckets.append(Bucket(len(buckets), first.group, first.dtype, tuple(slots), offset, tuple(spans)))
        current.clear()

    used = 0
    for i in reversed(range(len(params))):
        info = params[i]
        size = info.numel * _itemsize(info.dtype)
        if current:
            head = params[current[0]]
            if head.group != info.group or head.dtype != info.dtype or used + size > bucket_bytes:
                close()
                used = 0
        current.append(i)
        used += size
    close()
    return Layout(tuple(params), tuple(buckets), world)
