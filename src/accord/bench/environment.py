"""The environment header every benchmark result carries: versions, machine, load, device.

Numbers from a shared machine mean little without the load they were taken under, so the
header records ``os.getloadavg()`` next to the versions. Torch is imported only when
:func:`describe` is asked about it (it is always loaded in the workers that call it).
"""
from __future__ import annotations

import os
import platform
import socket
import sys
import time
from typing import Any

from accord.version import __version__


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> list[float] | None:
    """1, 5 and 15-minute load averages (what ``uptime`` prints), or None where unknown."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def _version(module: str) -> str | None:
    """The loaded module's version as a plain string (torch's is a ``TorchVersion``, which, sent
    from a rank, would import torch in the launcher that unpickles it)."""
    mod = sys.modules.get(module)
    version = getattr(mod, "__version__", None) if mod is not None else None
    return None if version is None else str(version)


def describe(*, world_size: int, threads: int, backend: str, device: str) -> dict[str, Any]:
    """A JSON-friendly description of where and with what a benchmark ran.

    Args:
        world_size: ranks in the measured job.
        threads: torch intra-op threads per rank.
        backend: the communication backend(s) measured, e.g. "gloo".
        device: "cpu" or "cuda".
    """
    info: dict[str, Any] = {
        "accord": __version__,
        "python": platform.python_version(),
        "torch": _version("torch"),
        "numpy": _version("numpy"),
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "load_average": load_average(),
        "world_size": world_size,
        "threads_per_rank": threads,
        "backend": backend,
        "device": device,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
    }
    torch = sys.modules.get("torch")
    if device == "cuda" and torch is not None and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(torch.cuda.current_device())
        info["cuda"] = torch.version.cuda
    if "mpi4py" in sys.modules:
        info["mpi4py"] = _version("mpi4py")
    return info
