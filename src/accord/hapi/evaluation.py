"""The evaluation and prediction loops of ``Model``: every sample counted once, over all ranks.

Ranks read contiguous, unpadded shards that may differ in length, so there is no collective
inside these loops: evaluation sums every meter's state over the ranks once, at the end (exact
global loss and metrics), and prediction gathers every rank's outputs in rank order, which
restores dataset order.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from accord.hapi.callbacks import CallbackList
from accord.hapi.steps import split_batch, to_numpy

if TYPE_CHECKING:
    from accord.hapi.model import Model

__all__ = ["EVAL_METRICS", "eval_loop", "predict_loop"]

EVAL_METRICS = "accord.hapi.eval.metrics"  # the name of the end-of-evaluation allreduce


def eval_loop(model: Model, loader: Any, cbks: CallbackList, log_freq: int) -> dict[str, Any]:
    """Evaluate ``model`` on this rank's ``loader``; returns the global logs (same on every rank)."""
    model._sync_once()
    model._meters.reset()
    steps = len(loader)
    cbks.on_eval_begin({"steps": steps, "metrics": model.metrics_names()})
    for step, batch in enumerate(loader):
        cbks.on_eval_batch_begin(step, {})
        inputs, label = split_batch(batch)
        model.eval_batch(inputs, label)
        logs: dict[str, Any] = {"step": step + 1}
        # Shards may differ in length: no collective inside the loop; alone, show progress.
        if not model.world.distributed and ((step + 1) % log_freq == 0 or step + 1 == steps):
            logs.update(model._logs(None))
        cbks.on_eval_batch_end(step, logs)
    final = model._logs(EVAL_METRICS)
    cbks.on_eval_end({**final, "steps": steps})
    return final


def predict_loop(model: Model, loader: Any, cbks: CallbackList, batch_size: int,
                 stack_outputs: bool) -> np.ndarray | list[Any]:
    """The network's outputs for every sample of every rank's shard, in dataset order."""
    cbks.on_predict_begin({"steps": len(loader)})
    parts: list[list[torch.Tensor]] = []
    for step, batch in enumerate(loader):
        cbks.on_predict_batch_begin(step, {})
        outputs = model.predict_batch(split_batch(batch)[0])
        parts.append([o.detach().cpu() for o in outputs])
        cbks.on_predict_batch_end(step, {"step": step + 1})
    local = [torch.cat([p[i] for p in parts]) for i in range(len(parts[0]))] if parts else None
    gathered = model.world.allgather_rows(local, "accord.hapi.predict")
    arrays = [to_numpy(t) for t in gathered or []]
    cbks.on_predict_end({"samples": arrays[0].shape[0] if arrays else 0})
    if not stack_outputs:
        arrays = [np.split(a, range(batch_size, a.shape[0], batch_size)) for a in arrays]
    if not arrays:  # no rank had any sample
        return np.empty((0,))
    return arrays[0] if len(arrays) == 1 else arrays
