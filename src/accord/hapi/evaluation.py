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

from accord.errors import with_hint
from accord.hapi.callbacks import CallbackList
from accord.hapi.state import ModelState
from accord.hapi.steps import split_batch, to_numpy
from accord.hapi.world import World

__all__ = ["EVAL_METRICS", "eval_loop", "no_samples_error", "predict_loop"]

EVAL_METRICS = "accord.hapi.eval.metrics"  # the name of the end-of-evaluation allreduce


def no_samples_error(what: str, loader: Any, size: int) -> ValueError:
    """The error for an evaluation over no (labelled) sample; ``loader`` reads ``what``."""
    length = len(loader.dataset) if hasattr(loader.dataset, "__len__") else "?"
    why = "" if length in (0, "?") else ", and none of its batches has a label"
    return ValueError(with_hint(
        f"{what} gives no sample to evaluate on any of the {size} rank(s) (its length is "
        f"{length}{why}): the loss and metrics are means over the samples, undefined over none",
        f"pass a non-empty {what} of (inputs..., label) samples; with one DataLoader per rank, "
        "at least one rank's must yield a batch"))


def eval_loop(state: ModelState, eval_batch: Callable[[Sequence[Any], Any], Any], loader: Any,
              cbks: CallbackList, log_freq: int, what: str = "eval_data") -> dict[str, Any]:
    """Evaluate on this rank's ``loader`` (over ``what``) with ``eval_batch(inputs, label)``
    (``Model.eval_batch``, which accumulates into ``state.meters``); returns the global logs
    (same on every rank).

    Raises:
        ValueError: no rank evaluated a labelled sample while there is a loss or metric to report
            (every rank raises: the decision is taken on the summed count).
    """
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
    # Paddle's Model.evaluate raises here too (a KeyError: with no batch its logs never get a
    # "loss" or metric entry), and returns {} only when it has nothing to report; a loss of 0.0 over 0
    # samples would read as a perfect model. The count is the sum over ranks, so a rank whose shard is
    # empty still reports the global means, and either every rank raises or none does.
    if final["samples"] == 0 and state.meters.all():
        raise no_samples_error(what, loader, state.world.size)
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
