"""Paddle's ``amp_level`` for ``Model.prepare``: O0 (full precision), O1 (autocast) or O2
(half-precision weights with float32 master weights).

- O1 runs eligible operations in bfloat16 on the CPU and in float16 on CUDA, where a GradScaler
  also scales the loss so small float16 gradients do not underflow; weights stay float32.
- O2 is Paddle's ``amp.decorate(level='O2')``: the network's parameters (and floating buffers)
  are cast to the half dtype, except those of normalization layers (BatchNorm, SyncBatchNorm,
  InstanceNorm, LayerNorm, GroupNorm, RMSNorm), which stay float32; the optimizer updates float32
  master copies of the half parameters and the half parameters are refreshed from them after
  every step (:mod:`accord.hapi.master_weights`). Gradients, and so their allreduce, are half.
  The forward pass still runs under autocast in the same dtype (so half and float32 layers mix),
  and on CUDA with float16 a GradScaler scales the loss and unscales the master gradients.

The dtype defaults to bfloat16 on the CPU and float16 on CUDA, for O1 and O2 alike.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch

from accord.errors import with_hint

__all__ = ["LEVELS", "AmpSettings", "amp_settings", "autocast"]

LEVELS = ("O0", "O1", "O2")


@dataclass(frozen=True)
class AmpSettings:
    """One resolved ``amp_level``.

    Attributes:
        level: "O0", "O1" or "O2".
        dtype: the half dtype (autocast's, and the weights' under O2), or None for O0.
        scale_loss: whether a GradScaler scales the loss (float16 on CUDA).
    """

    level: str
    dtype: torch.dtype | None
    scale_loss: bool

    @property
    def half_weights(self) -> bool:
        """True under O2: the network's weights are half, the optimizer's are float32 masters."""
        return self.level == "O2"


def amp_settings(amp_level: str | dict[str, Any], device: torch.device) -> AmpSettings:
    """Resolve ``amp_level`` for ``device``.

    ``amp_level`` is "O0", "O1", "O2", or ``{"level": "O1" | "O2", "dtype": "bfloat16" | "float16"}``.

    Raises:
        ValueError: an unknown level, or a dtype autocast cannot use (not bfloat16 or float16).
    """
    opts = dict(amp_level) if isinstance(amp_level, dict) else {"level": amp_level}
    level = str(opts.get("level", "O1")).upper()
    if level not in LEVELS:
        raise ValueError(with_hint(f"amp_level {level!r} is not supported (known: {', '.join(LEVELS)})",
                                   "use 'O0' (full precision), 'O1' (autocast: bfloat16 on CPU, "
                                   "float16 with loss scaling on GPU) or 'O2' (half weights with "
                                   "float32 master weights)"))
    if level == "O0":
        return AmpSettings("O0", None, False)
    dtype = _half_dtype(opts.get("dtype", torch.bfloat16 if device.type == "cpu" else torch.float16))
    return AmpSettings(level, dtype, dtype == torch.float16 and device.type == "cuda")


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
