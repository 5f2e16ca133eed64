"""accord.comm: communication backends behind one small protocol.

Registered here: ``gloo`` and ``nccl`` (torch.distributed), ``mpi`` (mpi4py), ``shm`` and
``host`` (CUDA tensors staged through host memory over the CPU backend). Registration is
lazy: importing this package imports neither torch nor mpi4py; a backend's module is imported
when :func:`get_backend` first asks for it.

    from accord.comm import backend_name_for, get_backend
    comm = get_backend(backend_name_for("cpu")).create(context)   # an accord.comm.groups.GroupContext
"""
from __future__ import annotations

import sys

from accord.comm.backend import (
    Backend,
    Communicator,
    get_backend,
    known_backends,
    register_backend,
)
from accord.comm.ops import ReduceOp
from accord.comm.settings import CommSettings
from accord.errors import BackendError, with_hint

__all__ = [
    "Backend", "Communicator", "ReduceOp", "backend_name_for", "get_backend", "known_backends",
    "register_backend",
]

# The modules other accord packages may import; the rest are this package's own
# (tests/unit/test_import_graph.py checks every import that crosses a package boundary).
PUBLIC_MODULES = ("backend", "base_communicator", "devices", "dtypes", "groups", "hierarchical", "host_first",
                  "memory", "ops", "settings")

_DEVICE_TYPES = ("cpu", "cuda")  # those a backend can be configured for
AUTO = "auto"


def backend_name_for(device_type: str, single_host: bool = False) -> str:
    """The backend for tensors on ``device_type`` ("cpu" or "cuda").

    ACCORD_CPU_BACKEND for "cpu", ACCORD_GPU_BACKEND for "cuda". The CPU default, ``auto``, is
    ``shm`` when ``single_host`` (every rank of a multi-rank job on this host; shared memory is
    several times faster than Gloo's loopback TCP there) and ``gloo`` otherwise. The GPU default,
    ``auto``, is ``nccl`` here; at init :func:`accord.comm.devices.device_backends` falls back to
    ``host`` for a job NCCL cannot carry (ranks sharing a GPU, no NCCL in torch).

    Raises:
        BackendError: no backend is configured for that device type.
    """
    if device_type not in _DEVICE_TYPES:
        raise BackendError(with_hint(
            f"no communication backend is configured for device type {device_type!r}; "
            f"configured: {', '.join(sorted(_DEVICE_TYPES))}",
            "move the tensors to cpu or cuda, or pass a backend name explicitly "
            f"(known: {', '.join(known_backends())})"))
    name = CommSettings.from_config().backend_for(device_type)
    if name.lower() == AUTO:
        if device_type == "cuda":
            return "nccl"
        return "shm" if device_type == "cpu" and single_host and sys.platform.startswith("linux") else "gloo"
    return name


def _gloo() -> Backend:
    from accord.comm.torch_backend import TorchBackend

    return TorchBackend("gloo")


def _nccl() -> Backend:
    from accord.comm.torch_backend import TorchBackend

    return TorchBackend("nccl")


def _mpi() -> Backend:
    from accord.comm.mpi import MpiBackend

    return MpiBackend()


def _shm() -> Backend:
    from accord.comm.shm.backend import ShmBackend

    return ShmBackend()


def _host() -> Backend:
    from accord.comm.host_staged import HostStagedBackend

    return HostStagedBackend(get_backend(backend_name_for("cpu")))


register_backend("gloo", _gloo)
register_backend("nccl", _nccl)
register_backend("mpi", _mpi)
register_backend("shm", _shm)
register_backend("host", _host)
