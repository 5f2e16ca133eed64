"""accord: distributed data-parallel training for PyTorch.

Importing ``accord`` has no side effects and does not import torch (the launcher relies on that).
Frameworks live in subpackages: ``accord.torch`` (Horovod-compatible), ``accord.kvstore``.
"""
from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
