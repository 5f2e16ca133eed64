"""accord.hapi: Paddle-style high-level training (``Model.fit``) that runs distributed unchanged.

>>> from accord.hapi import Model, Accuracy
"""
from __future__ import annotations

from accord.hapi.callbacks import Callback, EarlyStopping, LRScheduler, ModelCheckpoint, ProgBarLogger
from accord.hapi.metrics import Accuracy, Mean, Metric
from accord.hapi.model import Model

__all__ = ["Accuracy", "Callback", "EarlyStopping", "LRScheduler", "Mean", "Metric", "Model",
           "ModelCheckpoint", "ProgBarLogger"]

# The modules other accord packages may import; the rest are this package's own
# (tests/unit/test_import_graph.py checks every import that crosses a package boundary).
PUBLIC_MODULES = ("model",)
