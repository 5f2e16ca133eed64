"""How a process is started on a host: a small registry of runners (``local``, ``ssh``).

The launcher asks :func:`runner_for` for each worker's and server's host and never branches on
local versus remote itself. Another way to reach hosts (a batch system's ``srun``, a container
exec) is a :class:`Runner` subclass registered with :func:`register_runner`.
"""
from __future__ import annotations

import os
import subprocess
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from accord.errors import ConfigError
from accord.registry import Registry
from accord.run.processes.guardian import start_process
from accord.run.processes.ssh import SshOptions, remote_script, ssh_argv, stdin_preamble
from accord.run.spec.hosts import is_local
from accord.run.spec.worker_env import SECRET_FILE_VAR, SECRET_VAR, forwarded_env, local_environment


@dataclass(frozen=True)
class StartOptions:
    """What every start of one job shares: the launcher's directory, the workers' directory
    (``--sync-dst-dir`` or the same), the grace period, ssh's options and the job secret."""

    cwd: str
    worker_cwd: str
    grace: float
    ssh: SshOptions
    secret_hex: str


class Runner(ABC):
    """Starts one process (in its own session, stdout/stderr piped) on a host."""

    name: str = ""
    remote: bool = False

    @abstractmethod
    def start(self, host: str, argv: Sequence[str], environ: Mapping[str, str],
              added: Mapping[str, str], options: StartOptions) -> subprocess.Popen[bytes]:
        """Start ``argv`` on ``host`` with ``environ`` (the launcher's) plus ``added``.

        Raises:
            OSError: the program (or the runner's client) cannot be started.
        """

    def ask_to_stop(self, proc: subprocess.Popen[bytes]) -> None:  # noqa: B027 - an optional hook
        """What comes before the stop signal; the signal alone stops a local process."""


class LocalRunner(Runner):
    """This host: the whole launcher environment, the contract and the secret."""

    name = "local"

    def start(self, host: str, argv: Sequence[str], environ: Mapping[str, str],
              added: Mapping[str, str], options: StartOptions) -> subprocess.Popen[bytes]:
        return start_process(argv, local_environment(environ, added, options.secret_hex),
                             options.worker_cwd)


# Preambles up to this size go into ssh's stdin pipe at once (a pipe holds at least this much);
# a larger one is written by a thread, since the write then waits until the remote side reads,
# and the launcher starts the next host meanwhile.
_WRITE_AT_ONCE = 16 * 1024


class SshRunner(Runner):
    """Another host through ssh: the remote side runs :func:`accord.run.processes.ssh.remote_script`;
    the secret and the forwarded variables go on ssh's stdin (:func:`accord.run.processes.ssh.stdin_preamble`),
    which stays open: its end-of-file tells the remote side to stop the process (TERM, grace, KILL)."""

    name = "ssh"
    remote = True

    def start(self, host: str, argv: Sequence[str], environ: Mapping[str, str],
              added: Mapping[str, str], options: StartOptions) -> subprocess.Popen[bytes]:
        preamble = stdin_preamble(options.secret_hex, forwarded_env(environ, added))
        script = remote_script(argv, options.worker_cwd, options.grace)
        ssh_env = {k: v for k, v in environ.items() if k not in (SECRET_VAR, SECRET_FILE_VAR)}
        proc = start_process(ssh_argv(host, script, options.ssh), ssh_env, options.cwd,
                             stdin=subprocess.PIPE)
        assert proc.stdin is not None
        if len(preamble) <= _WRITE_AT_ONCE:
            try:
                proc.stdin.write(preamble)
                proc.stdin.flush()
            except OSError:  # ssh ended at once: the supervisor sees its exit status
                pass
        else:  # on a descriptor of its own: closing stdin to stop the worker must not wait for it
            threading.Thread(target=_write_all, args=(os.dup(proc.stdin.fileno()), preamble),
                             name=f"accord-ssh-stdin-{host}", daemon=True).start()
        return proc

    def ask_to_stop(self, proc: subprocess.Popen[bytes]) -> None:
        close_stdin(proc)


def _write_all(fd: int, data: bytes) -> None:
    """Write ``data`` to ``fd`` (a copy of ssh's stdin), then close it: once stdin is closed
    too, the remote side sees its end. An ssh that ended is seen through its exit status."""
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view):]
    except OSError:
        pass
    finally:
        os.close(fd)


def close_stdin(proc: subprocess.Popen[bytes]) -> None:
    """Close a process's stdin (for ssh: end-of-file, the remote side stops its process)."""
    if proc.stdin is not None:
        try:
            proc.stdin.close()
        except OSError:
            pass


_RUNNERS: Registry[Callable[[], Runner]] = Registry(
    "remote runner", "accord.run.processes.runners.register_runner(name, factory)", ConfigError)


def register_runner(name: str, factory: Callable[[], Runner], *, override: bool = False) -> None:
    """Make ``name`` a way to start processes (a duplicate name needs ``override=True``)."""
    _RUNNERS.add(name, factory, override=override)


def get_runner(name: str) -> Runner:
    """The runner registered as ``name`` (ConfigError listing the known ones otherwise)."""
    if name not in _RUNNERS:
        raise _RUNNERS.unknown(name)
    return _RUNNERS[name]()


def runner_for(host: str, remote: str = "ssh") -> Runner:
    """The runner for ``host``: ``local`` for this host, else ``remote``."""
    return get_runner("local" if is_local(host) else remote)


register_runner("local", LocalRunner)
register_runner("ssh", SshRunner)
