"""accord.run: the ``accordrun`` launcher and ``accord.spawn``; called, Horovod's ``horovod.run``.

Torch-free on purpose (the launcher's start-up time counts): nothing here imports torch,
except ``accordrun --check-build``, which reports on it.

``accord.run(fn, num_proc=2)`` runs ``fn`` as a job, as ``horovod.run`` does (see
:mod:`accord.run.functions.horovod_run`): Horovod's runner function and this package share the name,
so the package itself is callable and ``from accord.run import run`` gives the function.
"""
from __future__ import annotations

import sys
import types
from typing import Any

# The modules other accord packages may import; the rest are this package's own
# (tests/unit/test_import_graph.py checks every import that crosses a package boundary).
PUBLIC_MODULES = ("functions.spawn", "processes.job_store", "spec.assignment", "spec.worker_env")


def __getattr__(name: str) -> Any:
    if name == "run":  # loaded on first use: the launcher's own start-up never needs it
        from accord.run.functions.horovod_run import run

        return run
    raise AttributeError(f"module 'accord.run' has no attribute {name!r}")


class _CallablePackage(types.ModuleType):
    def __call__(self, func: Any, *args: Any, **kwargs: Any) -> Any:
        from accord.run.functions.horovod_run import run

        return run(func, *args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
