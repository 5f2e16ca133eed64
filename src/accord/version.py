"""accord's version: the one place it is written (pyproject.toml reads it from here).

A base-layer leaf, so that the launcher, the benchmarks and the package facade can all name the
version without importing anything above them.
"""
from __future__ import annotations

__version__ = "0.1.0"
