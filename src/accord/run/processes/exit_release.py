"""Python workers whose objects are released before the interpreter is torn down.

A plain DDP script ends with ``dist.destroy_process_group()`` while its
``DistributedDataParallel`` model, a global of the script, still holds the Gloo process group.
The group then lives on until the interpreter's finalization clears ``__main__``, and torch
(2.13 measured) sometimes aborts there: ``terminate called without an active exception``,
SIGABRT after the script's last line ran, about 1 run in 8-12 on two cores, under torchrun too.
Releasing the model first (``del model``) avoids it; this module does the same for scripts that
do not.

For a command ``python [interpreter flags] script.py args...`` the launcher runs
``python [flags] -c RUNNER script.py args...`` instead. :data:`RUNNER` (the text of
:mod:`accord.run.processes.exit_release_runner`, standard library only, so that a remote host
needs nothing of accord) runs the script as Python would (``__main__``,
``sys.argv``, ``sys.path[0]``, ``__file__``, exit status, tracebacks without extra frames) and
registers, before the script runs, an ``atexit`` handler. Handlers run last-in first-out, so
this one runs after every handler the script and its libraries registered, when threads have
been joined, and while every module is still whole: it sets the script's global variables that
hold data to ``None``, the most recently defined first (as a stack unwinds: the model goes before
the logger it may use), collecting cycles after each one that something else also held and that
the cycle collector tracks (ints and strings are in no cycle), and keeps modules, classes and
functions (what a ``__del__`` calls). The model and its group are freed then, not during teardown.
Any other command (``-m``, ``-c``, a shell script, a program) is run unchanged.
"""
from __future__ import annotations

import os
import re
from typing import Sequence

# What runs in the worker: the text of exit_release_runner.py, passed with -c. It stays code on
# the command line rather than ``python -m accord...`` because a remote host may run the script
# in a Python that has no accord installed; the file keeps it linted and readable.
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "exit_release_runner.py"),
          encoding="utf-8") as _source:
    RUNNER = _source.read()

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
