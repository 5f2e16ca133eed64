"""The evaluation and prediction loops of ``Model``: every sample counted once, over all ranks.

Ranks read contiguous, unpadded shards that may differ in length, so there is no collective
inside these loops: evaluation sums every meter's state over the ranks once, at the end (exact
global loss and metrics), and prediction gathers every rank's outputs in rank order, which
restores dataset order.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import torch

from accord.hapi.callbacks import CallbackList
from accord.hapi.state import ModelState
from accord.hapi.steps import split_batch, to_numpy
from accord.hapi.world import World

__all__ = ["EVAL_METRICS", "eval_loop", "predict_loop"]

EVAL_METRICS = "accord.hapi.eval.metrics"  # the name of the end-of-evaluation allreduce


def eval_loop(state: ModelState, eval_batch: Callable[[Sequence[Any], Any], Any], loader: Any,
              cbks: CallbackList, log_freq: int) -> dict[str, Any]:
    """Evaluate on this rank's ``loader`` with ``eval_batch(inputs, label)`` (``Model.eval_batch``,
    which accumulates into ``state.meters``); returns the global logs (same on every rank)."""
    state.sync_once()
    state.meters.reset()
    steps = len(loader)
    cbks.on_eval_begin({"steps": steps, "metrics": state.metrics_names()})
    for step, batch in enumerate(loader):
        cbks.on_eval_batch_begin(step, {})
        inputs, label = split_batch(batch)
        eval_batch(inputs, label)
        logs: dict[str, Any] = {"step": step + 1}
        # Shards may differ in length: no collective inside the loop; alone, show progress.
        if not state.world.distributed and ((step + 1) % log_freq == 0 or step + 1 == steps):
            logs.update(state.logs(None))
        cbks.on_eval_batch_end(step, logs)
    final = state.logs(EVAL_METRICS)
    cbks.on_eval_end({**final, "steps": steps})
    return final


def predict_loop(world: World, predict_batch: Callable[[Sequence[Any]], list[torch.Tensor]],
                 loader: Any, cbks: CallbackList, batch_size: int,
                 stack_outputs: bool) -> np.ndarray | list[Any]:
    """The outputs of ``predict_batch`` (``Model.predict_batch``) for every sample of every
    rank's shard, gathered over ``world`` in dataset order."""
    cbks.on_predict_begin({"steps": len(loader)})
    parts: list[list[torch.Tensor]] = []
    for step, batch in enumerate(loader):
        cbks.on_predict_batch_begin(step, {})
        outputs = predict_batch(split_batch(batch)[0])
        parts.append([o.detach().cpu() for o in outputs])
        cbks.on_predict_batch_end(step, {"step": step + 1})
    local = [torch.cat([p[i] for p in parts]) for i in range(len(parts[0]))] if parts else None
    gathered = world.allgather_rows(local, "accord.hapi.predict")
    arrays = [to_numpy(t) for t in gathered or []]
    cbks.on_predict_end({"samples": arrays[0].shape[0] if arrays else 0})
    if not stack_outputs:
        arrays = [np.split(a, range(batch_size, a.shape[0], batch_size)) for a in arrays]
    if not arrays:  # no rank had any sample
        return np.empty((0,))
    return arrays[0] if len(arrays) == 1 else arrays
