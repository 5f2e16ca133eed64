"""accord.lightning: PyTorch Lightning's Trainer and Fabric on accord's engine.

One import makes accord's strategy names known to Lightning (Lightning has no entry point for
strategies), and a Lightning 1.x Horovod script runs under ``accordrun`` unchanged otherwise::

    import accord.lightning                       # the line to add
    trainer = pl.Trainer(strategy="horovod")      # or "accord"; Fabric(strategy="accord")

``AccordStrategy`` (Trainer) and ``AccordFabricStrategy`` (Fabric) are the classes for
``pytorch_lightning``/``lightning_fabric``; :mod:`accord.lightning.unified` has those for the
``lightning`` package. The names are registered for each of the two packages that is installed.
Needs Lightning 2.6 (``pip install 'accord[lightning]'``); without it the import fails with an
ImportError that says so. ``import accord`` and ``import accord.torch`` never import Lightning.
"""
from __future__ import annotations

from typing import Any

from accord.errors import with_hint
from accord.lightning import flavors

INSTALL_HINT = "pip install 'accord[lightning]'"

# The modules other accord packages may import: none.
PUBLIC_MODULES: tuple[str, ...] = ()

__all__ = ["AccordEnvironment", "AccordFabricStrategy", "AccordStrategy"]


def _build_all() -> dict[str, flavors.Strategies]:
    found = flavors.installed()
    if not found:
        raise ImportError(with_hint(
            "accord.lightning needs PyTorch Lightning 2.6 (the pytorch_lightning or lightning package), "
            "which is not installed", f"{INSTALL_HINT} (installs pytorch-lightning 2.6), or pip install lightning"))
    built = {}
    for flavor in found:
        try:
            strategies = flavors.build(flavor)
        except Exception as exc:
            raise ImportError(with_hint(
                f"accord.lightning could not use the installed {flavor.package} package: "
                f"{type(exc).__name__}: {exc}",
                f"{INSTALL_HINT} (accord's strategies are written for Lightning 2.6)")) from exc
        flavors.register(strategies)
        built[flavor.package] = strategies
    return built


BUILT = _build_all()

_BUILT = BUILT.get(flavors.PYTORCH_LIGHTNING.package)
if _BUILT is not None:
    AccordEnvironment = _BUILT.environment
    AccordStrategy = _BUILT.strategy
    AccordFabricStrategy = _BUILT.fabric_strategy


def __getattr__(name: str) -> Any:
    if name in __all__:  # only asked for when the pytorch_lightning package is not installed
        raise AttributeError(with_hint(
            f"accord.lightning.{name} is the class for the pytorch_lightning package, which is not installed",
            f"use accord.lightning.unified.{name} with the lightning package, or {INSTALL_HINT}"))
    raise AttributeError(f"module 'accord.lightning' has no attribute {name!r}")
