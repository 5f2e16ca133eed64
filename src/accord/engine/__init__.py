"""accord.engine: the background engine that matches named collectives across ranks.

Frontends (accord.frontend, accord.torch, accord.mxnet, accord.kvstore, accord.data, hapi,
bench) use the names in ``__all__`` and nothing deeper::

    from accord import engine

    engine.init()
    handle = engine.submit("allreduce", tensor, "grad.w")
    result = engine.synchronize(handle)

- the session (:mod:`~accord.engine.session`, the one door): ``init``, ``shutdown``,
  ``is_initialized``, ``topology``, ``runtime``, ``submit``, ``submit_group``, ``poll``,
  ``synchronize``, the process sets, the timeline, ``backend_name``, ``communicator`` and
  ``current_engine`` (the running :class:`~accord.engine.engine.Engine`, for ``join``);
- requests: ``Op`` (the collectives), ``Handle`` (one request's completion);
- compression: ``Compressor``, ``NoneCompressor``, ``FP16Compressor``, ``BF16Compressor``,
  ``Compression`` (Horovod's names); the engine applies them;
- process sets: ``GLOBAL_ID`` and ``sets_given_at_init`` (a frontend's ``init`` argument).

Inside: :mod:`~accord.engine.engine` routes each request to its process set's controller
(:mod:`~accord.engine.cycle.controller`, one thread per set); negotiation
(:mod:`~accord.engine.negotiation`) is pure; :mod:`~accord.engine.cycle.fusion`,
:mod:`~accord.engine.cycle.execute`, :mod:`~accord.engine.negotiation.join`,
:mod:`~accord.engine.cycle.stall`, :mod:`~accord.engine.cycle.timeline`.

Importing this package, or one of its modules, imports nothing else (no torch): each name
above loads its module on first use (PEP 562), so ``import accord.engine.request`` stays
cheap and no import order between the engine's modules can form a cycle through here.
"""
from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what the lazy names are, for type checkers and readers
    from accord.engine.compression import BF16Compressor, Compression, Compressor, FP16Compressor, NoneCompressor
    from accord.engine.request import Handle, Op
    from accord.engine.session import (
        add_private_process_set,
        add_process_set,
        backend_name,
        build_communicator,
        communicator,
        find_process_set,
        init,
        is_initialized,
        poll,
        process_set_members,
        process_sets,
        remove_process_set,
        runtime,
        shutdown,
        start_timeline,
        stop_timeline,
        submit,
        submit_group,
        synchronize,
        topology,
    )
    from accord.engine.session import engine as current_engine
    from accord.engine.sets import GLOBAL_ID, sets_given_at_init

# public name -> (module of this package, its name there)
_HOMES: dict[str, tuple[str, str]] = {
    **{name: ("session", name) for name in (
        "init", "shutdown", "is_initialized", "topology", "runtime", "communicator", "backend_name",
        "add_process_set", "remove_process_set", "process_sets", "process_set_members",
        "find_process_set", "submit", "submit_group", "poll", "synchronize", "start_timeline",
        "stop_timeline", "build_communicator", "add_private_process_set")},
    # ``engine`` is also the name of a module of this package, which its import binds here
    "current_engine": ("session", "engine"),
    "Op": ("request", "Op"),
    "Handle": ("request", "Handle"),
    **{name: ("compression", name) for name in (
        "Compressor", "NoneCompressor", "FP16Compressor", "BF16Compressor", "Compression")},
    "GLOBAL_ID": ("sets", "GLOBAL_ID"),
    "sets_given_at_init": ("sets", "sets_given_at_init"),
}

__all__ = [
    "BF16Compressor", "Compression", "Compressor", "FP16Compressor", "GLOBAL_ID", "Handle",
    "NoneCompressor", "Op", "add_private_process_set", "add_process_set", "backend_name",
    "build_communicator", "communicator", "current_engine",
    "find_process_set", "init", "is_initialized", "poll", "process_set_members", "process_sets",
    "remove_process_set", "runtime", "sets_given_at_init", "shutdown", "start_timeline",
    "stop_timeline", "submit", "submit_group", "synchronize", "topology",
]

# Other packages use the names of ``__all__`` above, through the package, and none of its modules
# (tests/unit/test_import_graph.py checks every import that crosses a package boundary).
PUBLIC_MODULES: tuple[str, ...] = ()


def _module(home: str) -> ModuleType:
    # Written out (not importlib) so that tests/unit/test_import_graph.py sees these edges.
    if home == "session":
        from accord.engine import session as module
    elif home == "request":
        from accord.engine import request as module
    elif home == "compression":
        from accord.engine import compression as module
    else:
        from accord.engine import sets as module
    return module


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'accord.engine' has no attribute {name!r}")
    value = getattr(_module(home[0]), home[1])
    globals()[name] = value  # later lookups are plain module attributes (the collectives' path)
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
