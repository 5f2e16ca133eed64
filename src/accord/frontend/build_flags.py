"""What this installation can move data with: Horovod's ``*_built()`` flags, frontend-neutral.

accord.torch and accord.mxnet export these under Horovod's names (which library the job uses
is :mod:`accord.frontend.backend_flags`).
"""
from __future__ import annotations

import importlib.util

import torch


def mpi_built() -> bool:
    """Whether accord's ``mpi`` backend can be used.

    Returns:
        True when mpi4py is installed.
    """
    return importlib.util.find_spec("mpi4py") is not None


def gloo_built() -> bool:
    """Whether Gloo is available.

    Returns:
        True when torch.distributed has Gloo.
    """
    return bool(torch.distributed.is_available() and torch.distributed.is_gloo_available())


def nccl_built() -> int:
    """Whether NCCL is available, as Horovod answers it.

    Returns:
        NCCL's version code (e.g. 21803) when torch has NCCL and CUDA, else 0.
    """
    try:
        if not (torch.cuda.is_available() and torch.distributed.is_nccl_available()):
            return 0
        major, minor, patch = torch.cuda.nccl.version()[:3]
    except Exception:  # a CPU-only torch raises various errors here
        return 0
    # NCCL_VERSION_CODE: 2.9 and later use five digits for major.minor.patch
    if (major, minor) >= (2, 9):
        return major * 10000 + minor * 100 + patch
    return major * 1000 + minor * 100 + patch


def cuda_built() -> bool:
    """Whether CUDA is available to accord.

    Returns:
        True when torch was built with CUDA.
    """
    return torch.version.cuda is not None


def rocm_built() -> bool:
    """Whether ROCm is available to accord.

    Returns:
        True when torch was built with ROCm (HIP).
    """
    return getattr(torch.version, "hip", None) is not None


def ddl_built() -> bool:
    """IBM DDL: not supported by accord.

    Returns:
        Always False.
    """
    return False


def ccl_built() -> bool:
    """oneCCL: not supported by accord.

    Returns:
        False, always.
    """
    return False
