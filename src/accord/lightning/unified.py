"""accord's Lightning strategies for the ``lightning`` package (``import lightning as L``):
``AccordStrategy`` for ``L.Trainer``, ``AccordFabricStrategy`` for ``L.Fabric``.

They are the classes of :mod:`accord.lightning`, built on ``lightning.pytorch`` and
``lightning.fabric`` instead of ``pytorch_lightning`` and ``lightning_fabric``; the names
``"accord"``, ``"horovod"`` and ``"ddp_accord"`` are registered for both packages already by
``import accord.lightning``.
"""
from __future__ import annotations

from typing import Any

from accord.errors import with_hint
from accord.lightning import BUILT, flavors

__all__ = ["AccordEnvironment", "AccordFabricStrategy", "AccordStrategy"]

_BUILT = BUILT.get(flavors.LIGHTNING.package)
if _BUILT is not None:
    AccordEnvironment = _BUILT.environment
    AccordStrategy = _BUILT.strategy
    AccordFabricStrategy = _BUILT.fabric_strategy


def __getattr__(name: str) -> Any:
    if name in __all__:  # only asked for when the lightning package is not installed
        raise AttributeError(with_hint(
            f"accord.lightning.unified.{name} is the class for the lightning package, which is not installed",
            f"use accord.lightning.{name} with pytorch_lightning, or pip install lightning"))
    raise AttributeError(f"module 'accord.lightning.unified' has no attribute {name!r}")
