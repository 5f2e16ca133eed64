"""One batch of a ``Model``: split it into inputs and label, move it to the device, and run a
training step (backward and optimizer step, with loss scaling when a GradScaler is in use), an
evaluation step or a prediction.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import torch
from torch import nn

from accord.errors import with_hint
from accord.hapi.precision import autocast

if TYPE_CHECKING:
    from accord.hapi.model import Model

__all__ = ["backward_and_step", "eval_step", "first_output", "is_distributed_optimizer",
           "predict_step", "rows_of", "split_batch", "to_device", "to_label", "to_numpy", "train_step"]


def is_distributed_optimizer(optimizer: Any) -> bool:
    """True for an ``accord.torch.DistributedOptimizer`` (duck-typed: no torch frontend import)."""
    return hasattr(optimizer, "synchronize") and hasattr(optimizer, "skip_synchronize")


def split_batch(batch: Any) -> tuple[tuple[Any, ...], Any]:
    """A batch is ``(inputs..., label)``; a single tensor or 1-tuple is inputs without label."""
    if isinstance(batch, (tuple, list)):
        if len(batch) == 1:
            return (batch[0],), None
        return tuple(batch[:-1]), batch[-1]
    return (batch,), None


def first_output(outputs: Any) -> torch.Tensor:
    """The output metrics are computed on: the first of several."""
    return outputs[0] if isinstance(outputs, (tuple, list)) else outputs


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A CPU numpy copy (bfloat16, which numpy lacks, as float32)."""
    t = t.detach().cpu()
    return (t.float() if t.dtype == torch.bfloat16 else t).numpy()


def to_device(value: Any, device: torch.device, network: nn.Module) -> Any:
    """Move a tensor to ``device``; floating inputs take the network's parameter dtype."""
    if not torch.is_tensor(value):
        return value
    if value.is_floating_point():
        param = next((p for p in network.parameters() if p.is_floating_point()), None)
        dtype = param.dtype if param is not None else torch.float32
        return value.to(device, dtype=dtype, non_blocking=True)
    return value.to(device, non_blocking=True)


def to_label(label: Any, device: torch.device, network: nn.Module) -> Any:
    """Like :func:`to_device`; integer class indices become int64 (what losses want)."""
    label = to_device(label, device, network)
    if torch.is_tensor(label) and not label.is_floating_point() and label.dtype != torch.bool:
        label = label.long()
    return label


def rows_of(label: Any, inputs: Any = None) -> int:
    """Samples in a batch: the label's length, else the first input's."""
    if torch.is_tensor(label):
        return int(label.shape[0])
    if label is not None:
        return len(label)
    return int(inputs[0].shape[0])


def backward_and_step(loss: torch.Tensor, optimizer: torch.optim.Optimizer, scaler: Any) -> None:
    """``loss.backward()`` then ``optimizer.step()``; with a GradScaler, scale the loss and
    unscale the (already averaged) gradients before stepping, without a second allreduce."""
    if scaler is None:
        loss.backward()
        optimizer.step()
        return
    scaler.scale(loss).backward()
    if is_distributed_optimizer(optimizer):
        optimizer.synchronize()
        scaler.unscale_(optimizer)
        with optimizer.skip_synchronize():
            scaler.step(optimizer)
    else:
        scaler.step(optimizer)
    scaler.update()


def _loss_of(model: Model, outputs: Any, label: Any) -> torch.Tensor:
    loss = model._loss(outputs, label)
    return loss.mean() if loss.dim() else loss


def train_step(model: Model, inputs: Sequence[Any], label: Any, loss_scale: float | None = None) -> float:
    """``Model.train_batch``; the gradient comes from ``loss * loss_scale`` when a scale is given
    (weighted shares: see :mod:`accord.hapi.training`), while metrics see the unscaled loss.

    Raises:
        RuntimeError: the model has no optimizer or loss. ValueError: the batch has no label.
    """
    optimizer = model._optimizer
    if optimizer is None or model._loss is None:
        raise RuntimeError(with_hint("training needs an optimizer and a loss",
                                     "call model.prepare(optimizer, loss, metrics) first"))
    if label is None:
        raise ValueError(with_hint("training batches have no label (a single element per sample)",
                                   "pass (X, y) arrays, or a Dataset whose items are (inputs..., label)"))
    model.network.train()
    inputs = [to_device(x, model.device, model.network) for x in inputs]
    label = to_label(label, model.device, model.network)
    optimizer.zero_grad(set_to_none=True)
    with autocast(model._amp_dtype, model.device):
        outputs = model._forward(*inputs)
        loss = _loss_of(model, outputs, label)
    backward_and_step(loss if loss_scale is None else loss * loss_scale, optimizer, model._scaler)
    model._meters.track(first_output(outputs), loss, label, rows_of(label))
    return float(loss.detach())


@torch.no_grad()
def eval_step(model: Model, inputs: Sequence[Any], label: Any) -> float | None:
    """``Model.eval_batch``: forward without gradients, accumulate loss and metrics."""
    model.network.eval()
    inputs = [to_device(x, model.device, model.network) for x in inputs]
    label = to_label(label, model.device, model.network)
    with autocast(model._amp_dtype, model.device):
        outputs = model._forward(*inputs)
        loss = _loss_of(model, outputs, label) if model._loss is not None and label is not None else None
    rows = int(label.shape[0]) if torch.is_tensor(label) else int(inputs[0].shape[0])
    if label is not None:
        model._meters.track(first_output(outputs), loss, label, rows)
    return None if loss is None else float(loss)


@torch.no_grad()
def predict_step(model: Model, inputs: Sequence[Any]) -> list[torch.Tensor]:
    """``Model.predict_batch``: the outputs as a list, one tensor per output."""
    model.network.eval()
    with autocast(model._amp_dtype, model.device):
        outputs = model._forward(*[to_device(x, model.device, model.network) for x in inputs])
    return list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
