"""The command the workers run, checked before anything starts: given at all, and, when every
worker runs on this host, found on PATH or an executable file at the path given."""
from __future__ import annotations

import argparse
import os
import shutil
from typing import Mapping

from accord.errors import ConfigError, with_hint


def worker_command(ns: argparse.Namespace, environ: Mapping[str, str], all_local: bool,
                   cwd: str) -> tuple[str, ...]:
    """The workers' argv from the command line (a leading ``--`` dropped); with ``all_local``
    the program must exist here (relative paths from ``cwd``).

    Raises:
        ConfigError: no command, or a program that is not found or not executable.
    """
    command = list(ns.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise ConfigError(with_hint("no command to run", "append the command, e.g. accordrun -np 2 python train.py"))
    exe = command[0]
    if all_local and os.sep not in exe and shutil.which(exe, path=environ.get("PATH")) is None:
        raise ConfigError(with_hint(f"command {exe!r} not found on PATH",
                                    "check the spelling, or give the program's full path"))
    # A path is checked where the workers run it; a --sync-dst-dir copy does not exist yet.
    if all_local and os.sep in exe and ns.sync_dst_dir is None:
        _check_program(exe, cwd)
    return tuple(command)


def _check_program(exe: str, cwd: str) -> None:
    """A command given by its path must be an executable file (relative paths from ``cwd``)."""
    path = os.path.join(cwd, exe)
    problem = ("does not exist" if not os.path.exists(path) else "is a folder" if os.path.isdir(path)
               else "is not executable" if not os.access(path, os.X_OK) else None)
    if problem is not None:
        raise ConfigError(with_hint(f"command {exe!r} {problem}",
                                    "give the path of an executable program (chmod +x a script), or run a "
                                    f"script through its interpreter, e.g. accordrun -np 2 python {exe}"))
