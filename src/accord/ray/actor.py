"""One accord worker inside a Ray actor: the class Ray runs (``ray.remote(Worker)``), one per rank.

The driver sets the worker's environment with one call of :meth:`Worker.set_env` (coordinates,
the store's address and the job's secret) before any user function runs, so ``hvd.init()`` or
``init_process_group("accord")`` inside the function meets the other ranks over the driver's
store. The secret travels as that call's argument, never in the actor's options or constructor
(Ray keeps an actor's creation arguments in its control store to restart it).

:meth:`Worker.call` never raises: the driver gets ``("ok", value)``, ``("left", None)`` (an
elastic worker whose node left the job, Horovod's ``SystemExit(0)``) or ``("error", info)``
with the exception's type, message and traceback, and the exception itself when it pickles.
"""
from __future__ import annotations

import os
import pickle
import socket
import sys
import traceback
from typing import Any, Callable, Mapping

from accord import config

OK, LEFT, ERROR = "ok", "left", "error"


class Worker:
    """The actor (see the module docstring); Ray imports this module in the worker process."""

    def __init__(self) -> None:
        self._executable: Any = None

    def describe(self) -> dict[str, Any]:
        """Where this actor runs: Ray node id and address, pid, GPUs, a free port for MASTER_PORT."""
        import ray

        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("", 0))
            port = sock.getsockname()[1]
        return {"node_id": ray.get_runtime_context().get_node_id(), "ip": ray.util.get_node_ip_address(),
                "pid": os.getpid(), "hostname": socket.gethostname(),
                "gpu_ids": [str(g) for g in ray.get_gpu_ids()], "free_port": port}

    def set_env(self, env: Mapping[str, str | None]) -> None:
        """Set (None: remove) variables of this process's environment, read by the next init()."""
        config.set_variables(env)

    def start_executable(self, cls: Callable[..., Any] | None, args: Any, kwargs: Any) -> None:
        """Build the object :meth:`call` hands ``execute`` functions (Horovod's executable_cls)."""
        self._executable = None if cls is None else cls(*(args or ()), **(kwargs or {}))

    def call(self, fn: Callable[..., Any], args: Any = None, kwargs: Any = None,
             on_executable: bool = False) -> tuple[str, Any]:
        """``fn(executable)`` when ``on_executable``, else ``fn(*args, **kwargs)``; see the module doc."""
        try:
            if on_executable:
                return OK, fn(self._executable)
            return OK, fn(*(args or ()), **(kwargs or {}))
        except SystemExit as exc:
            if exc.code in (0, None):
                return LEFT, None
            return ERROR, describe_exception(exc)
        except BaseException as exc:  # everything goes back to the driver, KeyboardInterrupt too
            return ERROR, describe_exception(exc)

    def call_plain(self, fn: Callable[..., Any], args: Any = None, kwargs: Any = None) -> Any:
        """``fn(*args, **kwargs)`` with Ray's own error handling (``run_remote``'s ObjectRefs)."""
        return fn(*(args or ()), **(kwargs or {}))

    def close(self) -> None:
        """Shut accord's engine down when a frontend started it (before the actor is ended)."""
        for name in ("accord.torch", "accord.mxnet"):
            frontend = sys.modules.get(name)
            if frontend is not None and frontend.is_initialized():
                frontend.shutdown()


def describe_exception(exc: BaseException) -> dict[str, Any]:
    """Type, message, traceback, and ``exc`` itself when it survives pickling."""
    try:
        pickle.loads(pickle.dumps(exc))
        original: BaseException | None = exc
    except Exception:  # noqa: BLE001 - unpicklable exceptions still report type and text
        original = None
    return {"type": type(exc).__qualname__, "message": str(exc),
            "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
            "exception": original}
