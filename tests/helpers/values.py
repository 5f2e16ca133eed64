"""Test inputs every rank can rebuild for every other rank, and exact comparisons."""
from __future__ import annotations

import numpy as np


def int_data(seed: int, rank: int, shape: tuple, dtype: str = "float32") -> np.ndarray:
    """Small integers (-4..4) from (seed, rank): sums and products stay exact in any dtype."""
    rng = np.random.default_rng([seed, rank])
    return rng.integers(-4, 5, size=shape).astype(dtype)


def close(a, b, tol: float = 0.0) -> None:
    """Assert ``a`` equals ``b`` within ``tol`` (absolute and relative), compared in float64."""
    np.testing.assert_allclose(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64),
                               rtol=tol, atol=tol)
