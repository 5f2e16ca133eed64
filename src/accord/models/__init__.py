"""Models defined in the repository (no torchvision needed) and a registry by name.

>>> from accord.models import get_model
>>> net = get_model("resnet50", num_classes=10)
"""
from __future__ import annotations

from typing import Any, Callable

from torch import nn

from accord.models.lenet import LeNet, lenet
from accord.models.mlp import MLP, mlp_26m
from accord.models.resnet import ResNet, resnet18, resnet50
from accord.registry import Registry

__all__ = [
    "LeNet", "MLP", "ResNet", "get_model", "known_models", "lenet", "mlp_26m",
    "register_model", "resnet18", "resnet50",
]

# The modules other accord packages may import: none, they use the package itself
# (tests/unit/test_import_graph.py checks every import that crosses a package boundary).
PUBLIC_MODULES: tuple[str, ...] = ()

ModelFactory = Callable[..., nn.Module]

_REGISTRY: Registry[ModelFactory] = Registry("model", "accord.models.register_model()", entries={
    "lenet": lenet,
    "mlp": mlp_26m,
    "resnet18": resnet18,
    "resnet50": resnet50,
})


def register_model(name: str, factory: ModelFactory, *, override: bool = False) -> None:
    """Make ``get_model(name, ...)`` build ``factory(num_classes=..., **kwargs)``.

    Raises:
        ConfigError: ``name`` is taken (case-insensitively) and ``override`` is False.
    """
    _REGISTRY.add(name.lower(), factory, override=override)


def known_models() -> list[str]:
    """Names :func:`get_model` accepts."""
    return sorted(_REGISTRY)


def get_model(name: str, num_classes: int | None = None, **kwargs: Any) -> nn.Module:
    """Build the model registered as ``name`` (case-insensitive).

    Args:
        name: e.g. "resnet50", "resnet18", "lenet", "mlp".
        num_classes: outputs of the classifier; None keeps the model's default
            (1000 for resnets and mlp, 10 for lenet).
        kwargs: passed to the factory, e.g. ``image_size=8`` for lenet.
    Raises:
        ValueError: unknown name (the message lists the known ones).
    """
    factory = _REGISTRY.get(name.lower()) if isinstance(name, str) else None
    if factory is None:
        raise ValueError(
            f"unknown model {name!r}; known: {known_models()}.\n"
            "HINT: pick one of the known names, or add yours with accord.models.register_model()."
        )
    if num_classes is not None:
        kwargs["num_classes"] = num_classes
    return factory(**kwargs)
