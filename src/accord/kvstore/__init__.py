"""accord.kvstore: MXNet's KVStore on accord, with real parameter servers.

::

    import accord.kvstore as kvs

    kv = kvs.create("dist_sync")          # 'local', 'device', 'dist_sync', 'dist_device_sync', 'dist_async'
    kv.init("w", weight)                  # rank 0's value wins, then every worker waits
    kv.set_optimizer(kvs.optimizers.create("sgd", learning_rate=0.1, momentum=0.9))
    kv.push("w", grad)                    # merged over devices and workers, then w -= lr * ...
    kv.pull("w", out=weight)

Values are torch tensors or numpy arrays; a list of values for one key is one value per local
device. Semantics are MXNet 1.9.1's (see :class:`accord.kvstore.base.KVStoreBase`), plus the
Perseus extensions ``local_rank``, ``init(..., param_only=True)`` and ``push(..., op='max'|'min')``.

Importing this package does not import torch (the launcher imports
:mod:`accord.kvstore.server`); store classes load on first use.
"""
from __future__ import annotations

from typing import Any

from accord.kvstore.registry import create, known_types, register

__all__ = ["KVStoreBase", "create", "known_types", "optimizers", "register"]

# The modules other accord packages may import: none, they use the package itself
# (tests/unit/test_import_graph.py checks every import that crosses a package boundary).
PUBLIC_MODULES: tuple[str, ...] = ()


def __getattr__(name: str) -> Any:
    # Lazy, so that `import accord.kvstore.server` stays torch-free.
    if name == "KVStoreBase":
        from accord.kvstore.base import KVStoreBase

        return KVStoreBase
    if name == "optimizers":
        import accord.kvstore.optimizers as optimizers

        return optimizers
    raise AttributeError(f"module 'accord.kvstore' has no attribute {name!r}")
