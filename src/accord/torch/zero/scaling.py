"""Scaling a sharded optimizer's gradients: inf/nan agreement, global-norm clipping, GradScaler.

The averaged gradient exists only as shards, one per rank, so whatever looks at the whole
gradient (an inf check, a norm) looks at this rank's shards and agrees with the other ranks in
one small allreduce. The collectives are passed in (``allreduce``: a one-element tensor and an
op, reduced over the optimizer's process set), so nothing here knows the engine.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from accord.comm.ops import ReduceOp
from accord.errors import ConfigError, with_hint
from accord.torch.zero.layout import Layout

Allreduce = Callable[[torch.Tensor, ReduceOp], torch.Tensor]

# What torch.amp.GradScaler.step sets on an optimizer whose step does its own unscaling and
# skipping (``_step_supports_amp_scaling``), and deletes after the step.
SCALER_ATTRIBUTES = ("grad_scale", "found_inf")


def has_nonfinite(grads: Sequence[torch.Tensor | None]) -> bool:
    """Whether any floating-point gradient of ``grads`` holds an inf or a nan.

    A finite sum proves every element finite (an inf or a nan makes any sum inf or nan), and a
    sum is one read of the tensor where ``isfinite`` writes a mask first (on one CPU thread,
    13 M elements: about 3 ms against about 68 ms). Only a sum that is not finite, which large
    finite values can also give, is checked element by element.
    """
    for g in grads:
        if g is None or not g.is_floating_point() or not g.numel():
            continue
        if not bool(torch.isfinite(g.sum())) and bool((~torch.isfinite(g)).any()):
            return True
    return False


def agree_on_nonfinite(shard_grads: Sequence[torch.Tensor | None], layout: Layout, rank: int,
                       param_grads: Sequence[torch.Tensor | None], allreduce: Allreduce) -> None:
    """Make an inf/nan in any rank's reduced shard visible in every rank's ``p.grad`` (stage 1).

    A GradScaler checks the gradients it can reach (``p.grad``): the reduced values of this
    rank's span and local ones elsewhere, so an overflow in another rank's span could go unseen
    here, and this rank would step while the others skip (and wait for it). One one-element
    allreduce (Max) per step settles it: where any rank has a non-finite reduced value, every
    rank puts a nan into a gradient element it does not own (one it never steps with), and
    every scaler skips the step.

    Args:
        shard_grads: this rank's reduced gradient shards, one per bucket.
        layout: the buckets.
        rank: this rank's index in the set.
        param_grads: each layout parameter's ``.grad`` (views of the bucket buffers).
        allreduce: reduces a one-element tensor over the set.
    """
    mine = has_nonfinite(shard_grads)
    anywhere = float(allreduce(torch.tensor([1.0 if mine else 0.0]), ReduceOp.MAX)[0]) > 0
    if anywhere and not mine:
        _poison_unowned(layout, rank, param_grads)


def _poison_unowned(layout: Layout, rank: int, param_grads: Sequence[torch.Tensor | None]) -> None:
    """A nan in one gradient element ``rank`` does not own (its shards stay as they are)."""
    for bucket in layout.buckets:
        start, end = bucket.spans[rank]
        element = 0 if start > 0 else bucket.numel - 1 if end < bucket.numel else None
        if element is None:
            continue
        for slot in bucket.slots:
            grad = param_grads[slot.param]
            if grad is not None and slot.offset <= element < slot.offset + slot.numel:
                grad.view(-1)[element - slot.offset] = float("nan")
                return


def clip_by_global_norm(shard_grads: Sequence[torch.Tensor | None], max_norm: float, norm_type: float,
                        allreduce: Allreduce) -> torch.Tensor:
    """Scale the shards as ``torch.nn.utils.clip_grad_norm_`` would scale the whole gradient.

    Args:
        shard_grads: this rank's reduced gradient shards.
        max_norm: the largest norm the whole gradient may keep.
        norm_type: the p of the p-norm (``inf`` for the largest magnitude).
        allreduce: reduces a one-element tensor over the set.
    Returns:
        The norm of the whole gradient (a 0-d float32 tensor, the same on every rank).
    """
    grads = [g for g in shard_grads if g is not None and g.numel()]
    norm_type = float(norm_type)
    if norm_type == float("inf"):
        local = max((g.abs().max().float() for g in grads), default=torch.tensor(0.0))
        total = allreduce(local.reshape(1), ReduceOp.MAX)[0]
    else:
        local = sum((g.float().norm(norm_type) ** norm_type for g in grads), torch.tensor(0.0))
        total = allreduce(local.reshape(1), ReduceOp.SUM)[0] ** (1.0 / norm_type)
    coef = float(max_norm) / (float(total) + 1e-6)
    if coef < 1.0:
        for g in grads:
            g.mul_(coef)
    return total


def scaler_attributes(optimizer: Any, shard_gradients: bool) -> dict[str, Any]:
    """What a GradScaler set on ``optimizer`` for this step (empty without one).

    A stage 1 optimizer passes them on to the optimizer over its shards (a fused one unscales
    and skips by them). Stage 2 is refused: it keeps no ``p.grad``, so the scaler found no
    gradient to unscale or check, and its ``update()`` would fail with "No inf checks were
    recorded"; the attributes are removed first, so the optimizer stays usable.

    Raises:
        ConfigError: a GradScaler steps a stage 2 (``shard_gradients=True``) optimizer.
    """
    found = {name: getattr(optimizer, name) for name in SCALER_ATTRIBUTES if hasattr(optimizer, name)}
    if found and shard_gradients:
        for name in found:
            delattr(optimizer, name)
        raise ConfigError(with_hint(
            "torch.amp.GradScaler cannot step a DistributedOptimizer with shard_gradients=True: "
            "it keeps no p.grad (each rank holds only its reduced shard of the gradient), so the "
            "scaler has no gradient to unscale or to check for inf/nan",
            "use shard_gradients=False (ZeRO-1 shards the optimizer state and works with a "
            "GradScaler), or train in bfloat16 without a GradScaler"))
    return found
