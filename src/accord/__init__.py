"""accord: distributed data-parallel training for PyTorch.

Importing ``accord`` has no side effects and does not import torch (the launcher relies on that).
Frameworks live in subpackages: ``accord.torch`` (Horovod-compatible), ``accord.kvstore``.
"""
from __future__ import annotations

from typing import Any

from accord.version import __version__

__all__ = ["Model", "__version__", "run", "spawn"]


def __getattr__(name: str) -> Any:
    # Lazy: `accord.spawn` loads the launcher's spawn module on first use, keeping `import accord`
    # free of side effects and of torch.
    if name == "spawn":
        from accord.run.functions.spawn import spawn

        return spawn
    if name == "run":  # the launcher package, callable as Horovod's horovod.run
        import importlib

        return importlib.import_module("accord.run")
    if name == "Model":  # Paddle-style Model.fit; imports torch, so only when asked for
        from accord.hapi.model import Model

        return Model
    raise AttributeError(f"module 'accord' has no attribute {name!r}")
