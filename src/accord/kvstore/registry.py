"""The registry of KVStore types and ``create(name)`` (torch-free: the launcher imports this package).

Built-in types are registered by name with a factory that imports its module on first use:

==================================  =================================================================
``local`` (``local_update_cpu``,    one process; values merged and updated on the CPU
``local_allreduce_cpu``)
``device`` (``local_allreduce_      one process; values merged and updated on their device (GPU when
device``)                           present)
``dist_sync``                       every worker's pushes of a round are merged, then applied once.
                                    With parameter servers launched (ACCORD_NUM_SERVERS /
                                    DMLC_NUM_SERVER > 0, e.g. ``accordrun --num-servers 2``) the
                                    servers merge and run the optimizer; without servers the
                                    workers allreduce through accord's engine and each applies the
                                    optimizer to its replica. Both give the same values.
``dist_device_sync``                as ``dist_sync``, merging a worker's device values on device
(``dist_sync_device``)
``dist_async``                      parameter servers only: each push is applied on its own as it
(``dist_device_async``)             arrives, with the servers' optimizer
==================================  =================================================================

``@register`` adds other types, MXNet style (the class name, lowercased, is the type name). A
name already taken (a built-in, an alias or an earlier registration) is refused unless
``override=True``, where MXNet warns and replaces.

In a process whose ACCORD_ROLE/DMLC_ROLE is ``server`` or ``scheduler`` (MXNet's launch.py runs
the training script in those roles too), ``create`` runs that role and exits the process.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable, TypeVar, overload

from accord.errors import BackendError, with_hint
from accord.kvstore.settings import process_role, server_count
from accord.registry import Registry

__all__ = ["create", "known_types", "register"]

T = TypeVar("T", bound=type)

# name -> a class or factory taking the type name, or "module:attribute" for lazy built-ins.
_REGISTRY: Registry[Callable[[str], Any] | str] = Registry("kvstore type", "@accord.kvstore.register")

_ALIASES = {
    "local_update_cpu": "local",
    "local_allreduce_cpu": "local",
    "local_allreduce_device": "device",
    "dist_sync_device": "dist_device_sync",
    "dist_device_async": "dist_async",
}


def _dist(name: str) -> Any:
    """dist_* types: parameter servers when launched, else the engine (dist_sync only)."""
    num_servers = server_count()
    if num_servers > 0:
        from accord.kvstore.client import DistKVStore

        return DistKVStore(name, num_servers=num_servers)
    if name == "dist_async":
        raise BackendError(with_hint(
            "kvstore type 'dist_async' needs parameter servers, and none were launched "
            f"(ACCORD_NUM_SERVERS/DMLC_NUM_SERVER is {num_servers})",
            "start the job with servers, e.g. `accordrun -np 4 --num-servers 2 python train.py`, "
            "or use 'dist_sync', which runs without servers on accord's engine"))
    from accord.kvstore.collective import CollectiveKVStore

    return CollectiveKVStore(name)


_BUILTINS: dict[str, Callable[[str], Any] | str] = {
    "local": "accord.kvstore.local:LocalKVStore",
    "device": "accord.kvstore.local:LocalKVStore",
    "dist_sync": _dist,
    "dist_device_sync": _dist,
    "dist_async": _dist,
}
_REGISTRY.update(_BUILTINS)


@overload
def register(klass: T, *, override: bool = False) -> T: ...


@overload
def register(klass: str | None = None, *, override: bool = False) -> Callable[[T], T]: ...


def register(klass: Any = None, *, override: bool = False) -> Any:
    """Register a KVStore type so that ``create(name)`` builds it.

    Use as ``@register`` (the type name is the class name, lowercased, as in MXNet) or as
    ``@register("name")``. ``create`` constructs the class with no arguments. A name already
    taken is refused; ``@register(override=True)`` or ``@register("name", override=True)``
    replaces it.

    Example::

        @accord.kvstore.register
        class MyStore(accord.kvstore.KVStoreBase):
            ...
        kv = accord.kvstore.create("mystore")

    Args:
        klass: the class to register (``@register``), a name for it (``@register("name")``),
            or None (``@register(override=True)``).
        override: replace a type already registered under that name.

    Returns:
        The class itself when given one; otherwise a decorator that registers its class and
        returns it.

    Raises:
        ConfigError: the name is taken and ``override`` is False.
        TypeError: ``klass`` is neither a class nor a name.
    """
    if klass is None or isinstance(klass, str):
        def decorate(cls: T) -> T:
            _add(cls.__name__ if klass is None else klass, cls, override)
            return cls

        return decorate
    if not isinstance(klass, type):
        raise TypeError(with_hint(f"register() takes a class or a name, got {klass!r}",
                                  "decorate the KVStore class: @register or @register('name')"))
    _add(klass.__name__, klass, override)
    return klass


def _add(name: str, factory: Any, override: bool) -> None:
    key = name.lower()
    _REGISTRY.add(key, factory, override=override, taken=key in _ALIASES)


def known_types() -> list[str]:
    """The store types ``create`` accepts.

    Returns:
        Every registered type and alias, sorted.
    """
    return sorted(set(_REGISTRY.names()) | set(_ALIASES))


def create(name: str = "local") -> Any:
    """Create a KVStore of type ``name`` (see the module docstring for the built-in types).

    In a process that MXNet's launcher started as a server or the scheduler (``DMLC_ROLE``),
    this serves that role and exits, as MXNet's ``import mxnet`` does.

    Args:
        name: ``"local"`` (the default), ``"device"``, ``"dist_sync"``, ``"dist_device_sync"``,
            ``"dist_async"``, MXNet's aliases of those, or a type registered with
            :func:`register` (case does not matter).

    Returns:
        The store: a :class:`~accord.kvstore.base.KVStoreBase`.

    Raises:
        TypeError: ``name`` is not a string.
        ValueError: an unknown type (the message lists the known ones).
        BackendError: ``dist_async`` without parameter servers.
    """
    role = process_role()
    if role in ("server", "scheduler"):
        # MXNet's launch.py starts the training script itself as servers and the scheduler
        # (MXNet serves from `import mxnet`); here the script serves from its create() call.
        from accord.kvstore.server.program import main

        raise SystemExit(main())
    if not isinstance(name, str):
        raise TypeError(with_hint(f"the kvstore type must be a string, got {type(name).__name__}",
                                  "pass e.g. create('local') or create('dist_sync')"))
    key = name.lower()
    key = key if key in _REGISTRY else _ALIASES.get(key, key)  # a registered name beats an alias
    factory = _REGISTRY.get(key)
    if factory is None:
        raise _REGISTRY.unknown(name, known_types())
    builtin = factory is _BUILTINS.get(key)
    if isinstance(factory, str):
        module, attr = factory.split(":")
        factory = getattr(importlib.import_module(module), attr)
    # Built-ins take their type name ('local' and 'device' share a class); registered classes
    # are constructed as MXNet does, with no arguments.
    return factory(key) if builtin else factory()
