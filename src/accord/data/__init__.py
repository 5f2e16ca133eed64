"""accord.data: splitting batches and sampling datasets across ranks.

``DistributedSampler`` is loaded on first use so that ``import accord.data`` stays torch-free.
"""
from __future__ import annotations

from typing import Any

from accord.data.split import slice_bounds, split_batch

__all__ = ["DistributedSampler", "slice_bounds", "split_batch"]

# The modules other accord packages may import; the rest are this package's own
# (tests/unit/test_import_graph.py checks every import that crosses a package boundary).
PUBLIC_MODULES = ("samplers", "split")


def __getattr__(name: str) -> Any:
    if name == "DistributedSampler":
        from accord.data.samplers import DistributedSampler

        return DistributedSampler
    raise AttributeError(f"module 'accord.data' has no attribute {name!r}")
