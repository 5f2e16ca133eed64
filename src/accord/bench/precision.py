"""Mixed-precision levels of ``accord-bench train`` (the names are apex's).

- ``O0``: float32 everywhere.
- ``O1``: ``torch.autocast`` (bfloat16 on CPU; float16 with a GradScaler on CUDA, or bfloat16
  with ``--amp-dtype bf16``); weights and gradients stay float32.
- ``O2``: the model itself in half precision (its gradients, and so the allreduce, are half);
  float32 master weights that the optimizer updates, copied back into the model after each
  step; a GradScaler with float16.
"""
from __future__ import annotations

import contextlib
from typing import Any, ContextManager, Iterable

import torch
from torch import nn


def half_dtype(amp_dtype: str, device_type: str) -> torch.dtype:
    """``auto`` is bfloat16 on CPU (fast there) and float16 on CUDA (NVIDIA's AMP recipe)."""
    if amp_dtype == "auto":
        return torch.bfloat16 if device_type == "cpu" else torch.float16
    return {"bf16": torch.bfloat16, "fp16": torch.float16}[amp_dtype]


class Precision:
    """Applies one AMP level to a model, its inputs, backward and the optimizer step."""

    def __init__(self, level: str, amp_dtype: str, device_type: str) -> None:
        self.level = level
        self.device_type = device_type
        self.half = half_dtype(amp_dtype, device_type)
        uses_fp16 = level != "O0" and self.half == torch.float16 and device_type == "cuda"
        self.scaler = torch.amp.GradScaler(device_type) if uses_fp16 else None
        self.masters: list[torch.Tensor] = []
        self._model_params: list[torch.Tensor] = []

    @property
    def compute_dtype(self) -> str:
        """What the report calls this level's arithmetic, e.g. "float32" or "bfloat16"."""
        return "float32" if self.level == "O0" else str(self.half).replace("torch.", "")

    def prepare(self, model: nn.Module) -> nn.Module:
        """O2: cast the model to half and keep float32 master copies of its parameters."""
        if self.level == "O2":
            model = model.to(self.half)
            self._model_params = [p for p in model.parameters() if p.requires_grad]
            self.masters = [p.detach().float().clone().requires_grad_(True) for p in self._model_params]
        return model

    def optimizer_params(self, model: nn.Module) -> Iterable[torch.Tensor]:
        """What the stepping optimizer updates: master weights under O2, else the model's."""
        return self.masters if self.level == "O2" else model.parameters()

    def inputs(self, x: torch.Tensor) -> torch.Tensor:
        """Cast floating inputs to the model's dtype under O2."""
        return x.to(self.half) if self.level == "O2" and x.is_floating_point() else x

    def autocast(self) -> ContextManager[Any]:
        """``torch.autocast`` under O1; nothing otherwise."""
        if self.level == "O1":
            return torch.autocast(self.device_type, dtype=self.half)
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        """Backward, with loss scaling when float16 needs it."""
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """Apply the (already reduced) gradients: through the master weights under O2."""
        if self.level == "O2":
            for master, p in zip(self.masters, self._model_params):
                master.grad = None if p.grad is None else p.grad.float()
        if self.scaler is not None:
            self.scaler.step(optimizer)
            self.scaler.update()
        else:
            optimizer.step()
        if self.level == "O2":
            with torch.no_grad():
                torch._foreach_copy_(self._model_params, self.masters)
