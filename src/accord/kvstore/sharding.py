"""Which parameter server holds which part of a key (MXNet's ``EncodeDefaultKey`` rule).

- A key with fewer than ``bound`` elements (MXNET_KVSTORE_BIGARRAY_BOUND, default 1e6) lives
  whole on one server: ``(key * 9973) % num_servers`` for int keys, as MXNet; str keys use the
  CRC-32 of their UTF-8 bytes in place of the int (stable across processes, unlike ``hash``).
- A key with ``bound`` or more elements is split over *all* servers into contiguous pieces of
  the flattened array: piece ``i`` ends at ``round(n / S * (i + 1))`` (rounding half away from
  zero, as C's ``round``), so sizes differ by at most one. Empty pieces (only when n < S) are
  not sent.
- Beyond MXNet, a server's piece larger than ``chunk`` elements (ACCORD_KVSTORE_CHUNK_ELEMENTS)
  travels as several consecutive chunks, each its own message and its own entry on the server:
  a chunk is hashed, merged and updated while the next one is still on the wire, and no message
  is so large that every receive maps fresh memory from the kernel.

Torch-free: workers and servers both use it.
"""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

__all__ = ["Part", "partition", "wire_key"]


@dataclass(frozen=True)
class Part:
    """One piece of a key: which server, which index, and its element range ``[start, stop)``."""

    server: int
    index: int
    start: int
    stop: int

    @property
    def size(self) -> int:
        """Number of elements in this piece."""
        return self.stop - self.start


def wire_key(key: int | str) -> str:
    """A key as the servers see it: ``"i:<int>"`` or ``"s:<str>"`` (int 3 and str "3" differ)."""
    return f"s:{key}" if isinstance(key, str) else f"i:{int(key)}"


def _home(key: int | str, num_servers: int) -> int:
    number = zlib.crc32(key.encode("utf-8")) if isinstance(key, str) else int(key)
    return (number * 9973) % num_servers


def _round_half_away(x: float) -> int:
    return int(math.floor(x + 0.5))


def partition(key: int | str, numel: int, num_servers: int, bound: int,
              chunk: int | None = None) -> list[Part]:
    """The pieces of ``key`` (``numel`` elements) over ``num_servers`` servers, in order.

    Args:
        chunk: largest piece in elements (None: no limit).
    Raises:
        ValueError: ``num_servers`` < 1, a negative ``numel`` or a ``chunk`` < 1.
    """
    if num_servers < 1 or numel < 0 or (chunk is not None and chunk < 1):
        raise ValueError(f"cannot partition {numel} elements over {num_servers} servers "
                         f"in chunks of {chunk}")
    if numel < bound or num_servers == 1:
        spans = [(_home(key, num_servers), 0, numel)]
    else:
        spans = []
        for i in range(num_servers):
            start = _round_half_away(numel / num_servers * i)
            stop = _round_half_away(numel / num_servers * (i + 1))
            if stop > start:
                spans.append((i, start, stop))
    parts: list[Part] = []
    for server, start, stop in spans:
        step = (stop - start) if chunk is None else chunk
        while True:
            end = min(stop, start + max(step, 1))
            parts.append(Part(server, len(parts), start, end))
            start = end
            if start >= stop:
                break
    return parts
