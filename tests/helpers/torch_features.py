"""What the running torch offers that some tests' expectations depend on (accord accepts torch >= 2.4)."""
from __future__ import annotations

import torch
import torch.distributed as dist


def torch_release() -> tuple[int, int]:
    """The running torch's (major, minor) release."""
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int(minor)


def premul_factor_readable() -> bool:
    """Whether a PREMUL_SUM op's scalar factor can be read from Python (torch >= 2.5).

    On older torch the factor is hidden inside the C++ op, so the accord backend refuses PREMUL_SUM
    on every rank with a HINT instead of summing unscaled values.
    """
    try:
        factor = dist._make_nccl_premul_sum(2.0).factor
    except (AttributeError, RuntimeError):
        return False
    return factor is not None
