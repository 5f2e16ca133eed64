"""The ``accord`` name in torch.distributed's backend registry, made known cheaply.

:func:`register` adds the name with a creator that imports the real backend
(:mod:`accord.distributed.creator`) only when ``init_process_group("accord")`` or ``new_group``
first asks for a group. It is idempotent and imports nothing of accord beyond this package, so
torch's backend autoload (the ``torch.backends`` entry point, torch >= 2.5) can run it at
``import torch``: a script then needs no import of accord at all. ``import accord.distributed``
and ``import accord.torch`` register it too (torch 2.4, or autoload turned off with
``TORCH_DEVICE_BACKEND_AUTOLOAD=0``).
"""
from __future__ import annotations

from typing import Any

BACKEND_NAME = "accord"


def register() -> None:
    """Make ``backend="accord"`` (and ``"cpu:accord,cuda:accord"``) selectable in
    ``torch.distributed.init_process_group``; a no-op when it already is.

    Runs inside ``import torch`` when torch autoloads backends, so it never raises there: a
    torch without distributed support just gets no ``accord`` backend.
    """
    try:
        import torch.distributed as dist
    except ImportError:
        return
    if not dist.is_available() or BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    # torch 2.4 asserts the name is new, so the check above keeps this idempotent
    dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=["cpu", "cuda"])


def autoload() -> None:
    """The ``torch.backends`` entry point: :func:`register`, never raising (an entry point that
    raises makes ``import torch`` fail)."""
    try:
        register()
    except Exception:  # noqa: BLE001 (import torch must work whatever happens here)
        pass


def _create(options: Any, backend_options: Any = None) -> Any:
    from accord.distributed.creator import create_process_group

    return create_process_group(options, backend_options)
