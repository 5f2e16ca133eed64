"""accord.bench: the ``accord-bench`` harness (``collectives`` and ``train``); see :mod:`accord.bench.cli`.

Importing it loads nothing heavy: the workers import torch, the CLI parent does not.
"""
