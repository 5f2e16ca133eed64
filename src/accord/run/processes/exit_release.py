"""Python workers whose objects are released before the interpreter is torn down.

A plain DDP script ends with ``dist.destroy_process_group()`` while its
``DistributedDataParallel`` model, a global of the script, still holds the Gloo process group.
The group then lives on until the interpreter's finalization clears ``__main__``, and torch
(2.13 measured) sometimes aborts there: ``terminate called without an active exception``,
SIGABRT after the script's last line ran, about 1 run in 8-12 on two cores, under torchrun too.
Releasing the model first (``del model``) avoids it; this module does the same for scripts that
do not.

For a command ``python [interpreter flags] script.py args...`` the launcher runs
``python [flags] -c RUNNER script.py args...`` instead. :data:`RUNNER` (standard library only,
so that a remote host needs nothing of accord) runs the script as Python would (``__main__``,
``sys.argv``, ``sys.path[0]``, ``__file__``, exit status, tracebacks without extra frames) and
registers, before the script runs, an ``atexit`` handler. Handlers run last-in first-out, so
this one runs after every handler the script and its libraries registered, when threads have
been joined, and while every module is still whole: it sets the script's global variables that
hold data to ``None``, the most recently defined first (as a stack unwinds: the model goes before
the logger it may use), collecting cycles after each one that something else also held, and
keeps modules, classes and functions (what a ``__del__`` calls). The model and its group are
freed then, not during teardown.
Any other command (``-m``, ``-c``, a shell script, a program) is run unchanged.
"""
from __future__ import annotations

import os
import re
from typing import Sequence

# What runs in the worker. Kept compatible with Python 3.8 and free of accord's imports.
RUNNER = """\
def _run_script():
    import atexit, builtins, gc, importlib.machinery, os, runpy, sys, types
    path = sys.argv[1]
    del sys.argv[0]
    if not os.path.isfile(path) or path.endswith(('.pyc', '.pyo')):
        runpy.run_path(path, run_name='__main__')
        return
    if sys.path and sys.path[0] == '':
        sys.path[0] = os.path.dirname(os.path.realpath(path))
    main = types.ModuleType('__main__')
    main.__file__ = os.path.abspath(path)
    main.__cached__ = None
    main.__loader__ = importlib.machinery.SourceFileLoader('__main__', main.__file__)
    main.__builtins__ = builtins
    sys.modules['__main__'] = main

    def release():
        names = main.__dict__
        kept = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType)
        for name in reversed(list(names)):
            value = names[name]
            if (name.startswith('__') and name.endswith('__')) or isinstance(value, kept):
                continue
            shared = sys.getrefcount(value) > 3  # held elsewhere too, maybe by a cycle
            names[name] = value = None
            if shared:
                gc.collect()  # a cycle goes now, while what it may use is still defined

    atexit.register(release)
    failed = None
    try:
        with open(main.__file__, 'rb') as source:
            code = compile(source.read(), main.__file__, 'exec')
        exec(code, main.__dict__)
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException:
        kind, value, trace = sys.exc_info()
        trace = trace.tb_next  # from the script's first frame on, as Python shows it
        sys.excepthook(kind, value.with_traceback(trace), trace)
        failed = True
        del kind, value, trace  # the frames (and what their locals hold) go now
    if failed:
        sys.exit(1)


_run_script()
"""

# Interpreter options that take the next argument as their value (``-W error``, ``-X dev``).
_VALUED = ("W", "X")
_PYTHON = re.compile(r"python[0-9.]*")


def is_python(program: str) -> bool:
    """True for a CPython interpreter named the usual way: ``python``, ``python3``,
    ``/usr/bin/python3.11``, ``.venv/bin/python``."""
    return _PYTHON.fullmatch(os.path.basename(program)) is not None


def script_index(argv: Sequence[str]) -> int | None:
    """Where the script's path is in ``python [flags] script.py args``, or None when the command
    is something else (another program, ``-m``, ``-c``, stdin, no script)."""
    if not argv or not is_python(argv[0]):
        return None
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == "--check-hash-based-pycs":
            i += 2
            continue
        if arg == "-" or arg == "--" or arg.startswith("--"):
            return None  # stdin, or a long option this parser does not know: run unchanged
        if not arg.startswith("-"):
            return i
        cluster = arg[1:]
        for pos, letter in enumerate(cluster):
            if letter in ("c", "m"):
                return None
            if letter in _VALUED:
                if pos == len(cluster) - 1:
                    i += 1  # the value is the next argument
                break  # the rest of the cluster is the value
        i += 1
    return None


def wrap(argv: Sequence[str]) -> tuple[str, ...]:
    """``argv`` with :data:`RUNNER` in front of the script when it runs a Python script; the
    same command otherwise."""
    index = script_index(argv)
    if index is None:
        return tuple(argv)
    return (*argv[:index], "-c", RUNNER, *argv[index:])
