"""How a process is started on a host: a small registry of runners (``local``, ``ssh``).

The launcher asks :func:`runner_for` for each worker's and server's host and never branches on
local versus remote itself. Another way to reach hosts (a batch system's ``srun``, a container
exec) is a :class:`Runner` subclass registered with :func:`register_runner`.
"""
from __future__ import annotations

import subprocess
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from accord.errors import ConfigError
from accord.registry import Registry
from accord.run.processes.guardian import start_process
from accord.run.processes.ssh import SshOptions, remote_script, secret_line, ssh_argv
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


class SshRunner(Runner):
    """Another host through ssh: the remote side runs :func:`accord.run.processes.ssh.remote_script` with
    the forwarded variables; the secret goes on ssh's stdin, which stays open: its end-of-file
    tells the remote side to stop the process (TERM, grace, KILL)."""

    name = "ssh"
    remote = True

    def start(self, host: str, argv: Sequence[str], environ: Mapping[str, str],
              added: Mapping[str, str], options: StartOptions) -> subprocess.Popen[bytes]:
        script = remote_script(argv, forwarded_env(environ, added), options.worker_cwd, options.grace)
        ssh_env = {k: v for k, v in environ.items() if k not in (SECRET_VAR, SECRET_FILE_VAR)}
        proc = start_process(ssh_argv(host, script, options.ssh), ssh_env, options.cwd,
                             stdin=subprocess.PIPE)
        assert proc.stdin is not None
        proc.stdin.write(secret_line(options.secret_hex))
        proc.stdin.flush()
        return proc

    def ask_to_stop(self, proc: subprocess.Popen[bytes]) -> None:
        close_stdin(proc)


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
