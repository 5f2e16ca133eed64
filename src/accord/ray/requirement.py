"""Ray, imported on first use, or an ImportError that says how to install it."""
from __future__ import annotations

from types import ModuleType

from accord.errors import with_hint

PIP_LINE = "pip install 'accord[ray]'"
MIN_VERSION = (2, 10)  # placement-group scheduling strategies and ray.util.get_node_ip_address


def need_ray() -> ModuleType:
    """The ``ray`` module.

    Raises:
        ImportError: Ray is not installed, or is older than :data:`MIN_VERSION`.
    """
    try:
        import ray
    except ImportError as exc:
        raise ImportError(with_hint(f"accord.ray needs Ray, which is not installed ({exc})", PIP_LINE)) from None
    try:
        found = tuple(int(p) for p in ray.__version__.split(".")[:2])
    except ValueError:  # a development build: trust it
        return ray
    if found < MIN_VERSION:
        raise ImportError(with_hint(
            f"accord.ray needs Ray >= {'.'.join(map(str, MIN_VERSION))}, found {ray.__version__}",
            f"{PIP_LINE} --upgrade"))
    return ray
