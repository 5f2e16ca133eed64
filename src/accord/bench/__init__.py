"""accord.bench: the ``accord-bench`` harness (``collectives`` and ``train``); see :mod:`accord.bench.cli`.

Importing it loads nothing heavy: the workers import torch, the CLI parent does not.
"""

# The modules other accord packages may import: none, they use the package itself
# (tests/unit/test_import_graph.py checks every import that crosses a package boundary).
PUBLIC_MODULES: tuple[str, ...] = ()
