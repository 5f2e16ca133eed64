"""The communication backends' settings, typed.

:class:`CommSettings` is built where a backend is chosen or a communicator made, not at import:
a program (or a test) may set ACCORD_CPU_BACKEND between two ``init()`` calls, and
accord-bench sets it for each backend it measures.
"""
from __future__ import annotations

from dataclasses import dataclass

from accord import config


@dataclass(frozen=True)
class CommSettings:
    """Which backends carry CPU and CUDA tensors, and how long their set-up may wait."""

    cpu_backend: str  # ACCORD_CPU_BACKEND (HOROVOD_CPU_OPERATIONS): auto, gloo, shm, mpi, or a registered name
    gpu_backend: str  # ACCORD_GPU_BACKEND: auto, nccl, host, or a registered name
    collective_timeout: float  # seconds: a new group's timeout, and how long an shm barrier waits
    start_timeout: float  # seconds the ranks wait for each other's GPU reports at init
    hostname: str | None  # ACCORD_HOSTNAME: overrides the host name shm groups ranks by

    @classmethod
    def from_config(cls) -> "CommSettings":
        """Read ACCORD_CPU_BACKEND, ACCORD_GPU_BACKEND, ACCORD_COLLECTIVE_TIMEOUT, ACCORD_START_TIMEOUT
        and ACCORD_HOSTNAME (with their Horovod aliases).

        Raises:
            ConfigError: a timeout is not a finite number.
        """
        return cls(cpu_backend=config.get("ACCORD_CPU_BACKEND"), gpu_backend=config.get("ACCORD_GPU_BACKEND"),
                   collective_timeout=float(config.get("ACCORD_COLLECTIVE_TIMEOUT")),
                   start_timeout=float(config.get("ACCORD_START_TIMEOUT")), hostname=config.get("ACCORD_HOSTNAME"))

    def backend_for(self, device_type: str) -> str:
        """The backend name configured for ``device_type``.

        Raises:
            KeyError: ``device_type`` is neither "cpu" nor "cuda".
        """
        return {"cpu": self.cpu_backend, "cuda": self.gpu_backend}[device_type]


def shm_chunk_bytes() -> int:
    """ACCORD_SHM_CHUNK_BYTES: the shm backend's slot size in bytes. Only a set's first rank reads
    it (its choice applies to every member), so it is read on its own.

    Raises:
        ConfigError: the variable is not an integer.
    """
    return int(config.get("ACCORD_SHM_CHUNK_BYTES"))
