"""MXNet 1.9's ``_split_input_slice`` restated for tests (the work_load_list rule): each share
rounded, the last takes what rounding left, every slice clipped at the batch's end. Returned as
(begin, end) pairs; an empty slice (begin >= end) is what MXNet refuses."""
from __future__ import annotations

from typing import Sequence


def mxnet_slice_bounds(batch_size: int, weights: Sequence[float]) -> list[tuple[int, int]]:
    """The (begin, end) rows of each share of a batch of ``batch_size`` under ``weights``."""
    total = sum(weights)
    sizes = [round(w * batch_size / total) for w in weights]
    if sum(sizes) < batch_size:
        sizes[-1] += batch_size - sum(sizes)
    out, start = [], 0
    for size in sizes:
        begin = int(min(start, batch_size))
        end = int(min(begin + size, batch_size))
        out.append((begin, end))
        start = end
    return out
