"""What a ``Model``'s loops and steps work on: the network, its optimizer and loss, the meters,
the precision settings and the stop flag, as one explicit object.

:class:`~accord.hapi.model.Model` owns one :class:`ModelState` and hands it to
:mod:`~accord.hapi.steps`, :mod:`~accord.hapi.training` and :mod:`~accord.hapi.evaluation`, so
those modules depend on this small record, not on the ``Model`` class (no circle in hapi).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from accord.hapi.metrics import Meters
from accord.hapi.world import World

__all__ = ["ModelState", "is_distributed_optimizer"]


@dataclass
class ModelState:
    """A model's training state (see the module docstring).

    Attributes:
        world: the ranks training together.
        device: where the network and batches live.
        network: the module being trained.
        forward: what a batch goes through (the network, or its compiled form).
        optimizer: the optimizer in use (a ``DistributedOptimizer`` with several ranks), or None.
        loss: ``loss(outputs, labels)``, or None.
        meters: loss and metric accumulators.
        amp_dtype: the autocast dtype, or None when mixed precision is off.
        scaler: the ``GradScaler`` with float16 on CUDA, else None.
        masters: under AMP O2, the float32 master weights
            (:class:`~accord.hapi.master_weights.MasterWeights`), else None.
        synced: whether rank 0's parameters have been broadcast to every rank.
        stop_training: set by a callback to stop ``fit`` (agreed over ranks at log steps).
    """

    world: World
    device: torch.device
    network: nn.Module
    forward: Any
    optimizer: torch.optim.Optimizer | None = None
    loss: Any = None
    meters: Meters = field(default_factory=Meters)
    amp_dtype: torch.dtype | None = None
    scaler: Any = None
    masters: Any = None
    synced: bool = False
    stop_training: bool = False

    def sync_once(self) -> None:
        """Broadcast rank 0's parameters once, if ``prepare``/``load`` has not already."""
        if not self.synced:
            self.world.broadcast_state(self.network, None)
            self.synced = True

    def metrics_names(self) -> list[str]:
        """Names of the logged values: ``loss`` then each metric's names."""
        return self.meters.names()

    def logs(self, name: str | None) -> dict[str, Any]:
        """Loss and metrics so far; summed over ranks with one allreduce unless ``name`` is None.

        The same allreduce carries ``stop_training``: afterwards it is set on every rank if any
        rank asked to stop (so a callback that runs on rank 0 only cannot leave ranks waiting).
        """
        reduce = None if name is None else (lambda v: self.world.allreduce_sum(v, name=name))
        logs, self.stop_training = self.meters.logs(self.stop_training, reduce)
        return logs


def is_sharded_optimizer(optimizer: Any) -> bool:
    """True for a ``DistributedOptimizer(shard_optimizer_state=True)``: its ``state_dict()`` is
    a collective (every rank consolidates its shard)."""
    return bool(getattr(optimizer, "shard_optimizer_state", False))


def is_distributed_optimizer(optimizer: Any) -> bool:
    """True for an ``accord.torch.DistributedOptimizer`` (duck-typed: no torch frontend import)."""
    return hasattr(optimizer, "synchronize") and hasattr(optimizer, "skip_synchronize")
