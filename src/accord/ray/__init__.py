"""accord on Ray: Horovod's ``horovod.ray.RayExecutor`` (:class:`RayExecutor`), and what Ray Train
needs to run DDP on accord (nothing: ``TorchConfig(backend="accord")``, see docs/ray.md).

``pip install 'accord[ray]'``. Importing ``accord`` or ``accord.torch`` never imports Ray; this
package imports it when :class:`RayExecutor` is first used, and a missing Ray is an ImportError
that names the pip line (:mod:`accord.ray.requirement`).

The workers are Ray actors, one per rank, placed by a placement group (static jobs) or by
Ray's view of its nodes (elastic jobs, :mod:`accord.ray.elastic`). They meet over accord's
authenticated store, which the driver hosts, as ``accordrun`` and ``accord.spawn`` do: each
actor gets the worker environment contract of :mod:`accord.run.spec.worker_env` and the job's
secret through one method call (:mod:`accord.ray.actor`). Functions and their results travel
over Ray's own object transfer.
"""
from __future__ import annotations

from typing import Any

# Other accord packages import none of this package's modules.
PUBLIC_MODULES: tuple[str, ...] = ()

__all__ = ["RayExecutor"]


def __getattr__(name: str) -> Any:
    if name == "RayExecutor":  # loaded on first use: it imports Ray
        from accord.ray.executor import RayExecutor

        return RayExecutor
    raise AttributeError(f"module 'accord.ray' has no attribute {name!r}")
