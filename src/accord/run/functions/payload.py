"""How :func:`accord.spawn` and ``accord.run`` hand a function to their workers (a local pipe,
never the network).

A function pickles by reference (module and name) and the worker imports it. That fails for
what a worker cannot import: a lambda or a nested function, and any function of an interactive
``__main__`` (a notebook, ``python -c``, a REPL) — the workers start fresh interpreters, which
re-run a script's ``__main__`` but have no notebook to re-run. Those are sent by value with
cloudpickle when it is installed (as horovod.run does), else refused with a HINT.
"""
from __future__ import annotations

import functools
import pickle
import sys
from typing import Any, Callable, Sequence

from accord.errors import ConfigError, with_hint


def function_payload(fn: Callable[..., Any], args: Sequence[Any]) -> bytes:
    """The bytes a worker turns back into ``(fn, args)`` with ``pickle.loads``.

    Raises:
        ConfigError: ``fn`` must go by value and cloudpickle is not installed, or ``fn``/``args``
            cannot be pickled at all.
    """
    if not _by_value(fn):
        try:
            return pickle.dumps((fn, tuple(args)))
        except (pickle.PicklingError, AttributeError, TypeError):
            pass  # e.g. a lambda or a nested function: by value, below
    try:
        import cloudpickle
    except ImportError:
        raise ConfigError(with_hint(
            f"{_name(fn)} cannot be imported by the workers (defined in an interactive session, "
            "or a lambda or nested function) and cloudpickle, which would send it by value, is "
            "not installed",
            "pip install cloudpickle, or define the function at the top level of a module")) from None
    try:
        return cloudpickle.dumps((fn, tuple(args)))
    except Exception as exc:  # noqa: BLE001 - cloudpickle raises many types; all mean the same
        raise ConfigError(with_hint(f"cannot send {_name(fn)} and its arguments to the workers: "
                                    f"{type(exc).__name__}: {exc}",
                                    "pass a function and arguments that can be pickled")) from None


def _by_value(fn: Callable[..., Any]) -> bool:
    """True for a function of an interactive ``__main__`` (no file the workers could re-run)."""
    while isinstance(fn, functools.partial):  # accord.run passes kwargs through a partial
        fn = fn.func
    main = sys.modules.get("__main__")
    return getattr(fn, "__module__", None) == "__main__" and not getattr(main, "__file__", None)


def _name(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
