"""Values a KVStore accepts (torch tensors and numpy arrays) and the per-key facts it keeps.

A value's *kind* (numpy or torch) and device are remembered at ``init`` so that ``pull`` without
``out`` returns the same kind. Internally stores work on torch tensors; numpy arrays are wrapped
without a copy where numpy allows it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from accord.errors import with_hint

__all__ = ["KeyInfo", "check_value", "info_of", "numpy_dtype", "reduce", "to_tensor", "write"]

OPS = ("sum", "max", "min")


@dataclass(frozen=True)
class KeyInfo:
    """What a store knows about one key from its ``init``."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    kind: str  # "numpy" or "torch"
    device: torch.device
    param_only: bool = False

    @property
    def numel(self) -> int:
        """Number of elements."""
        n = 1
        for d in self.shape:
            n *= d
        return n


def is_value(x: Any) -> bool:
    """True for a torch tensor or a numpy array."""
    return isinstance(x, (torch.Tensor, np.ndarray))


def check_value(x: Any, key: Any, what: str) -> None:
    """Raise TypeError unless ``x`` is a tensor or an array."""
    if not is_value(x):
        raise TypeError(with_hint(
            f"{what} for key {key!r} got a {type(x).__name__}, not a torch tensor or numpy array",
            "pass a torch.Tensor or numpy.ndarray (or a list of them, one per device)"))


def info_of(x: Any, param_only: bool = False) -> KeyInfo:
    """The :class:`KeyInfo` of an ``init`` value."""
    if isinstance(x, np.ndarray):
        dtype = torch.from_numpy(np.empty(0, dtype=x.dtype)).dtype
        return KeyInfo(tuple(x.shape), dtype, "numpy", torch.device("cpu"), param_only)
    return KeyInfo(tuple(x.shape), x.dtype, "torch", x.device, param_only)


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype of a torch dtype (bfloat16 has none: raises TypeError)."""
    return torch.empty(0, dtype=dtype).numpy().dtype


def to_tensor(x: Any) -> torch.Tensor:
    """``x`` as a torch tensor, sharing memory with a numpy array where possible."""
    if isinstance(x, torch.Tensor):
        return x.detach()
    if not x.flags.writeable or not x.dtype.isnative:
        x = np.array(x, dtype=x.dtype.newbyteorder("=")) if not x.dtype.isnative else np.array(x)
    return torch.from_numpy(x)


def write(out: Any, src: torch.Tensor) -> None:
    """Copy ``src`` into ``out`` (a tensor or a writable numpy array), converting dtype/device."""
    if isinstance(out, torch.Tensor):
        with torch.no_grad():  # parameters (leaves that require grad) are valid outputs
            out.copy_(src.reshape(out.shape))
    else:
        np.copyto(out, src.detach().cpu().numpy().reshape(out.shape), casting="unsafe")


def reduce(values: Sequence[Any], op: str, device: torch.device, dtype: torch.dtype,
           mean: bool = False, private: bool = True) -> torch.Tensor:
    """Merge one key's per-device values on ``device`` in ``dtype``: sum, max or min.

    Args:
        mean: divide the sum by the number of values (``param_only`` keys).
        private: the result must not share memory with any input (it may be modified).
    """
    tensors = [to_tensor(v) for v in values]
    first = tensors[0].to(device=device, dtype=dtype)
    if len(tensors) == 1:
        if private and (first.data_ptr() == tensors[0].data_ptr()):
            first = first.clone()
        return first
    merged = first if first.data_ptr() != tensors[0].data_ptr() else first.clone()
    for t in tensors[1:]:
        t = t.to(device=device, dtype=dtype)
        if op == "sum":
            merged.add_(t)
        elif op == "max":
            torch.maximum(merged, t, out=merged)
        else:
            torch.minimum(merged, t, out=merged)
    if mean and op == "sum":
        if merged.is_floating_point():
            merged.div_(len(tensors))
        else:
            merged.floor_divide_(len(tensors))
    return merged


def check_op(op: Any) -> str:
    """Normalise a push reduction ('sum', 'max', 'min'; any case)."""
    name = str(op).lower() if isinstance(op, str) else getattr(op, "name", str(op)).lower()
    if name not in OPS:
        raise ValueError(with_hint(f"push op must be one of {list(OPS)}, got {op!r}",
                                   "use op='sum' (gradients), or 'max'/'min' for statistics"))
    return name
