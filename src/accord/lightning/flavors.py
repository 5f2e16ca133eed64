"""accord's strategies for each Lightning package installed, and their names in Lightning's registries.

Lightning ships under two import names with separate class hierarchies: ``pytorch_lightning`` (with
``lightning_fabric``; ``pip install pytorch-lightning``, what Lightning 1.x scripts import) and
``lightning`` (``lightning.pytorch``, ``lightning.fabric``; ``pip install lightning``). A Trainer
only takes strategies derived from its own package's base class, so the strategies are built for
each package from the same mixins (:mod:`accord.lightning.trainer_strategy`,
:mod:`accord.lightning.fabric_strategy`, :mod:`accord.lightning.environment`) and registered in
that package's registries:

=================  =====================================================================
Trainer            ``"accord"`` (AccordStrategy), ``"horovod"`` (AccordStrategy with
                   ``scale_lr=True``, as Lightning 1.x's HorovodStrategy), ``"ddp_accord"``
                   (Lightning's DDPStrategy with ``process_group_backend="accord"``)
Fabric             ``"accord"`` (AccordFabricStrategy), ``"ddp_accord"`` (Fabric's DDPStrategy
                   with ``process_group_backend="accord"``)
=================  =====================================================================
"""
from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from typing import Any

from accord.lightning.environment import EnvironmentMixin
from accord.lightning.fabric_strategy import BackwardSyncMixin, FabricStrategyMixin
from accord.lightning.trainer_strategy import JoinCallbackMixin, TrainerStrategyMixin


@dataclass(frozen=True)
class Flavor:
    """One of Lightning's import names: the package to look for, its Trainer and Fabric halves,
    and the accord module whose names the built classes take."""

    package: str
    trainer: str
    fabric: str
    home: str


PYTORCH_LIGHTNING = Flavor("pytorch_lightning", "pytorch_lightning", "lightning_fabric", "accord.lightning")
LIGHTNING = Flavor("lightning", "lightning.pytorch", "lightning.fabric", "accord.lightning.unified")
FLAVORS = (PYTORCH_LIGHTNING, LIGHTNING)


@dataclass(frozen=True)
class Strategies:
    """The classes built for one flavor."""

    flavor: Flavor
    environment: type
    strategy: type
    fabric_strategy: type


def installed() -> list[Flavor]:
    """The flavors whose package is installed (looked up, not imported)."""
    found = []
    for flavor in FLAVORS:
        try:
            if importlib.util.find_spec(flavor.package) is not None:
                found.append(flavor)
        except (ImportError, ValueError):  # a broken install counts as absent
            continue
    return found


def _class(name: str, mixin: type, base: type, home: str, **attributes: Any) -> type:
    cls = type(name, (mixin, base), {"__doc__": mixin.__doc__, "__module__": home, **attributes})
    cls.__qualname__ = name
    return cls


def build(flavor: Flavor) -> Strategies:
    """Import ``flavor``'s Lightning modules and build accord's classes on its base classes."""
    environments = importlib.import_module(f"{flavor.fabric}.plugins.environments")
    fabric_strategies = importlib.import_module(f"{flavor.fabric}.strategies")
    fabric_base = importlib.import_module(f"{flavor.fabric}.strategies.strategy")
    trainer_strategies = importlib.import_module(f"{flavor.trainer}.strategies")
    callbacks = importlib.import_module(f"{flavor.trainer}.callbacks")

    environment = _class("AccordEnvironment", EnvironmentMixin, environments.ClusterEnvironment, flavor.home)
    join = _class("AccordJoinAtEpochEnd", JoinCallbackMixin, callbacks.Callback, flavor.home)
    sync_control = _class("AccordBackwardSyncControl", BackwardSyncMixin, fabric_base._BackwardSyncControl,
                          flavor.home)
    strategy = _class("AccordStrategy", TrainerStrategyMixin, trainer_strategies.ParallelStrategy, flavor.home,
                      _environment_class=environment, _join_callback_class=join)
    fabric_strategy = _class("AccordFabricStrategy", FabricStrategyMixin, fabric_strategies.ParallelStrategy,
                             flavor.home, _environment_class=environment, _sync_control_class=sync_control)
    return Strategies(flavor, environment, strategy, fabric_strategy)


def register(built: Strategies) -> None:
    """Put accord's names in the flavor's Trainer and Fabric strategy registries (replacing what a
    previous import, or another package, registered under them)."""
    trainer_strategies = importlib.import_module(f"{built.flavor.trainer}.strategies")
    fabric_strategies = importlib.import_module(f"{built.flavor.fabric}.strategies")
    trainer, fabric = trainer_strategies.StrategyRegistry, fabric_strategies.STRATEGY_REGISTRY
    trainer.register("accord", built.strategy, description="accord's engine (accord.torch)", override=True)
    trainer.register("horovod", built.strategy, description="accord's engine, as Lightning 1.x's "
                     "HorovodStrategy (learning rates scaled by the number of ranks)", override=True,
                     scale_lr=True)
    trainer.register("ddp_accord", trainer_strategies.DDPStrategy, description="DDP on the accord "
                     "torch.distributed backend", override=True, process_group_backend="accord",
                     start_method="popen")
    fabric.register("accord", built.fabric_strategy, description="accord's engine (accord.torch)", override=True)
    fabric.register("ddp_accord", fabric_strategies.DDPStrategy, description="DDP on the accord "
                    "torch.distributed backend", override=True, process_group_backend="accord",
                    start_method="popen")
