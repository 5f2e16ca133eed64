"""``accordrun --check-build``: which frameworks and backends this installation can use.

The one launcher command that imports torch (it reports on it). Each probe is independent: a
broken import shows as unavailable with the reason instead of stopping the report.
"""
from __future__ import annotations

import importlib
import platform
import shutil
from typing import Callable

from accord.version import __version__


def _mark(ok: bool) -> str:
    return "[X]" if ok else "[ ]"


def _probe(fn: Callable[[], str]) -> tuple[bool, str]:
    try:
        return True, fn()
    except Exception as exc:  # noqa: BLE001 - any failure means "not usable", with the reason
        return False, f"{type(exc).__name__}: {exc}".splitlines()[0]


def _torch() -> str:
    torch = importlib.import_module("torch")
    return str(torch.__version__)


def _gloo() -> str:
    dist = importlib.import_module("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        raise RuntimeError("torch was built without Gloo")
    return "torch.distributed"


def _nccl() -> str:
    torch = importlib.import_module("torch")
    dist = importlib.import_module("torch.distributed")
    if not dist.is_nccl_available():
        raise RuntimeError("torch was built without NCCL")
    if not torch.cuda.is_available():
        raise RuntimeError("built in, but no CUDA device is visible")
    return f"NCCL {'.'.join(str(v) for v in torch.cuda.nccl.version())}"


def _cuda() -> str:
    torch = importlib.import_module("torch")
    if not torch.cuda.is_available():
        raise RuntimeError(f"no CUDA device (torch built with CUDA {torch.version.cuda})")
    return f"CUDA {torch.version.cuda}, {torch.cuda.device_count()} device(s)"


def _mpi() -> str:
    mpi4py = importlib.import_module("mpi4py")
    mpirun = shutil.which("mpirun") or shutil.which("mpiexec")
    if mpirun is None:
        raise RuntimeError(f"mpi4py {mpi4py.__version__} found but no mpirun/mpiexec on PATH")
    return f"mpi4py {mpi4py.__version__}, {mpirun}"


def _mxnet() -> str:
    try:
        mx = importlib.import_module("mxnet")
        importlib.import_module("accord.mxnet")  # registers kvstore='accord' with MXNet
    except Exception as exc:  # noqa: BLE001 - shown as the reason, with the fix
        raise RuntimeError(f"{type(exc).__name__}: {str(exc).splitlines()[0]} "
                           "(pip install 'accord[mxnet]' in its own venv)") from None
    return f"{mx.__version__}, accord.mxnet and kvstore 'accord' ready"


def _parameter_servers() -> str:
    crypto = importlib.import_module("cryptography")
    importlib.import_module("cryptography.hazmat.primitives.poly1305")  # their payload MACs
    return f"cryptography {crypto.__version__}"


def build_report() -> str:
    """The text ``accordrun --check-build`` prints."""
    sections = {
        "Available frameworks": [("PyTorch", _torch), ("MXNet", _mxnet)],
        "Available backends": [("Gloo", _gloo), ("NCCL", _nccl), ("MPI", _mpi),
                               ("Parameter servers", _parameter_servers)],
        "Available devices": [("CUDA", _cuda)],
    }
    lines = [f"accord v{__version__} (python {platform.python_version()}, {platform.system()})", ""]
    for title, probes in sections.items():
        lines.append(f"{title}:")
        for name, fn in probes:
            ok, detail = _probe(fn)
            lines.append(f"    {_mark(ok)} {name:<28} {detail}")
        lines.append("")
    return "\n".join(lines).rstrip()
