"""One batch of a ``Model``: split it into inputs and label, move it to the device, and run a
training step (backward and optimizer step, with loss scaling when a GradScaler is in use and
through float32 master weights under AMP O2), an evaluation step or a prediction.
"""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import torch
from torch import nn

from accord.errors import with_hint
from accord.hapi.precision import autocast
from accord.hapi.state import ModelState, is_distributed_optimizer

if TYPE_CHECKING:
    from accord.hapi.master_weights import MasterWeights

__all__ = ["backward_and_step", "eval_step", "first_output", "is_distributed_optimizer",
           "predict_step", "rows_of", "split_batch", "to_device", "to_label", "to_numpy", "train_step"]


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


def to_device(value: Any, device: torch.device, network: nn.Module, dtype: torch.dtype | None = None) -> Any:
    """Move a tensor to ``device``; floating inputs take ``dtype``, by default the dtype of the
    network's first floating parameter (the layer they meet first: under AMP O2 a half layer,
    or a normalization layer kept in float32; autocast reconciles the layers after it)."""
    if not torch.is_tensor(value):
        return value
    if value.is_floating_point():
        if dtype is None:
            param = next((p for p in network.parameters() if p.is_floating_point()), None)
            dtype = param.dtype if param is not None else torch.float32
        return value.to(device, dtype=dtype, non_blocking=True)
    return value.to(device, non_blocking=True)


def to_label(label: Any, device: torch.device, network: nn.Module, dtype: torch.dtype | None = None) -> Any:
    """Like :func:`to_device`; integer class indices become int64 (what losses want)."""
    label = to_device(label, device, network, dtype)
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


def backward_and_step(loss: torch.Tensor, optimizer: torch.optim.Optimizer, scaler: Any,
                      masters: MasterWeights | None = None) -> None:
    """``loss.backward()`` then ``optimizer.step()``.

    With a GradScaler the loss is scaled and the (already averaged) gradients unscaled before
    the step, which is skipped on inf/nan. With ``masters`` (AMP O2) the averaged half
    gradients are copied as float32 into the masters, which the optimizer steps, and the masters
    are then rounded back into the half parameters. A ``DistributedOptimizer`` is synchronized
    first and stepped without a second allreduce.
    """
    if scaler is None and masters is None:
        loss.backward()
        optimizer.step()
        return
    (loss if scaler is None else scaler.scale(loss)).backward()
    distributed = is_distributed_optimizer(optimizer)
    if distributed:
        optimizer.synchronize()
    if masters is not None:
        masters.grads_to_masters()
    with optimizer.skip_synchronize() if distributed else contextlib.nullcontext():
        if scaler is None:
            optimizer.step()
        else:
            scaler.step(optimizer)  # unscales the gradients the optimizer steps (the masters under O2)
    if scaler is not None:
        scaler.update()
    if masters is not None:
        masters.masters_to_params()


def _label_of(state: ModelState, label: Any) -> Any:
    """The label on the device. Under AMP O2 floating labels (regression targets) stay float32:
    the loss is computed in float32 (autocast), and rounding targets to half would bias it."""
    return to_label(label, state.device, state.network,
                    torch.float32 if state.masters is not None else None)


def _loss_of(state: ModelState, outputs: Any, label: Any) -> torch.Tensor:
    loss = state.loss(outputs, label)
    return loss.mean() if loss.dim() else loss


def train_step(state: ModelState, inputs: Sequence[Any], label: Any, loss_scale: float | None = None) -> float:
    """``Model.train_batch``; the gradient comes from ``loss * loss_scale`` when a scale is given
    (weighted shares: see :mod:`accord.hapi.training`), while metrics see the unscaled loss.

    Raises:
        RuntimeError: the model has no optimizer or loss. ValueError: the batch has no label.
    """
    optimizer = state.optimizer
    if optimizer is None or state.loss is None:
        raise RuntimeError(with_hint("training needs an optimizer and a loss",
                                     "call model.prepare(optimizer, loss, metrics) first"))
    if label is None:
        raise ValueError(with_hint("training batches have no label (a single element per sample)",
                                   "pass (X, y) arrays, or a Dataset whose items are (inputs..., label)"))
    state.network.train()
    inputs = [to_device(x, state.device, state.network) for x in inputs]
    label = _label_of(state, label)
    optimizer.zero_grad(set_to_none=True)
    if state.masters is not None:
        state.masters.zero_param_grads()
    with autocast(state.amp_dtype, state.device):
        outputs = state.forward(*inputs)
        loss = _loss_of(state, outputs, label)
    backward_and_step(loss if loss_scale is None else loss * loss_scale, optimizer, state.scaler,
                      state.masters)
    state.meters.track(first_output(outputs), loss, label, rows_of(label))
    return float(loss.detach())


@torch.no_grad()
def eval_step(state: ModelState, inputs: Sequence[Any], label: Any) -> float | None:
    """``Model.eval_batch``: forward without gradients, accumulate loss and metrics."""
    state.network.eval()
    inputs = [to_device(x, state.device, state.network) for x in inputs]
    label = _label_of(state, label)
    with autocast(state.amp_dtype, state.device):
        outputs = state.forward(*inputs)
        loss = _loss_of(state, outputs, label) if state.loss is not None and label is not None else None
    rows = int(label.shape[0]) if torch.is_tensor(label) else int(inputs[0].shape[0])
    if label is not None:
        state.meters.track(first_output(outputs), loss, label, rows)
    return None if loss is None else float(loss)


@torch.no_grad()
def predict_step(state: ModelState, inputs: Sequence[Any]) -> list[torch.Tensor]:
    """``Model.predict_batch``: the outputs as a list, one tensor per output."""
    state.network.eval()
    with autocast(state.amp_dtype, state.device):
        outputs = state.forward(*[to_device(x, state.device, state.network) for x in inputs])
    return list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
