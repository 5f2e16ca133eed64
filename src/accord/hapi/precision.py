"""Paddle's ``amp_level`` for ``Model.prepare``: O0 (full precision) or O1 (autocast).

O1 runs eligible operations in bfloat16 on the CPU and in float16 on CUDA, where a GradScaler
also scales the loss so small float16 gradients do not underflow; weights stay float32.
"""
from __future__ import annotations

import contextlib
from typing import Any

import torch

from accord.errors import with_hint

__all__ = ["LEVELS", "amp_settings", "autocast"]

LEVELS = ("O0", "O1")


def amp_settings(amp_level: str | dict[str, Any], device: torch.device) -> tuple[torch.dtype | None, bool]:
    """(autocast dtype, or None for O0; whether to scale the loss) for ``amp_level`` on ``device``.

    ``amp_level`` is "O0", "O1", or ``{"level": "O1", "dtype": "bfloat16" | "float16"}``.

    Raises:
        ValueError: an unknown level (O2, pure half-precision weights, is not supported), or a
            dtype autocast cannot use (not bfloat16 or float16).
    """
    opts = dict(amp_level) if isinstance(amp_level, dict) else {"level": amp_level}
    level = str(opts.get("level", "O1")).upper()
    if level not in LEVELS:
        raise ValueError(with_hint(f"amp_level {level!r} is not supported (known: {', '.join(LEVELS)})",
                                   "use 'O0' (full precision) or 'O1' (autocast: bfloat16 on CPU, "
                                   "float16 with loss scaling on GPU)"))
    if level == "O0":
        return None, False
    dtype = _half_dtype(opts.get("dtype", torch.bfloat16 if device.type == "cpu" else torch.float16))
    return dtype, dtype == torch.float16 and device.type == "cuda"


def _half_dtype(dtype: Any) -> torch.dtype:
    """``dtype`` (a torch dtype or its name) if autocast can run in it, else a ValueError."""
    found = getattr(torch, dtype, None) if isinstance(dtype, str) else dtype
    if found not in (torch.bfloat16, torch.float16):
        raise ValueError(with_hint(f"amp_level dtype {dtype!r} is not a half-precision type",
                                   "use dtype 'bfloat16' or 'float16' (or leave it out: bfloat16 "
                                   "on CPU, float16 on GPU)"))
    return found


def autocast(dtype: torch.dtype | None, device: torch.device) -> Any:
    """``torch.autocast`` for ``dtype`` on ``device``, or a no-op context when ``dtype`` is None."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)
