"""``accordrun --sync-dst-dir DIR``: copy the working directory to every host before the job.

As MXNet's ``tools/launch.py --sync-dst-dir``: the launcher's working directory is copied with
``rsync`` over the same ssh (port, identity, host-key policy, ``OMPI_MCA_plm_rsh_args``; or the
MPI Operator's rsh agent, as ``rsync -e AGENT``) to ``DIR`` on every remote host of
the job, and to ``DIR`` on this host when it runs workers and ``DIR`` is elsewhere; then every
worker and parameter server runs from ``DIR``. Files already in ``DIR`` that the source lacks
are kept (rsync without ``--delete``). The copies run side by side, one per host. An elastic
job copies to a host it grows onto before its first worker there, without waiting for the
copy (:mod:`accord.run.elastic.sync`, through :meth:`FolderCopy.start`).
"""
from __future__ import annotations

import os
import shlex
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from typing import IO, Callable, Mapping, Sequence

from accord.errors import LaunchError, with_hint
from accord.run.processes.ssh import SshOptions, ssh_argv

_POLL = 0.1  # seconds between looks at the copies (and at stop_when) while they run


def rsync_argv(source: str, host: str | None, dest: str, ssh: SshOptions) -> list[str]:
    """rsync's argv copying the contents of ``source`` into ``dest`` on ``host`` (None: here).

    Example: ``rsync_argv("/w", "h2", "/tmp/job", SshOptions())`` ends with ``/w/ h2:/tmp/job/``.
    """
    argv = ["rsync", "-a", "--mkpath"]
    if host is None:
        return argv + [source.rstrip("/") + "/", dest.rstrip("/") + "/"]
    shell = ssh_argv(host, "", ssh)[:-2]  # the ssh client and its options, without host and script
    target = f"[{host}]" if ":" in host else host
    return argv + ["-e", shlex.join(shell), source.rstrip("/") + "/", f"{target}:{dest.rstrip('/')}/"]


class Copy:
    """One rsync to ``host`` (None: this host), running; :meth:`FolderCopy.start` makes them."""

    def __init__(self, host: str | None, proc: subprocess.Popen[bytes], err: IO[bytes]) -> None:
        self.host = host
        self._proc = proc
        self._err = err  # a file, not a pipe: nobody reads a copy's messages while it runs
        self._failure: str | None = None
        self._read = False

    def done(self) -> bool:
        """True once rsync has ended."""
        return self._proc.poll() is not None

    def wait(self, timeout: float) -> None:
        """Wait for rsync to end; past ``timeout`` seconds it is killed (then :meth:`failure` says so)."""
        try:
            self._proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()

    def stop(self) -> None:
        """Kill rsync (if still running) and reap it."""
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()

    def failure(self) -> str | None:
        """Once ended: None when the copy succeeded, else ``"HOST (rsync exit N: last message line)"``."""
        if not self._read:
            self._read = True
            code = self._proc.returncode
            self._err.seek(0)
            message = self._err.read().decode(errors="replace").strip().splitlines()
            self._err.close()
            if code != 0:
                self._failure = (f"{self.host or 'this host'} (rsync exit {code}: "
                                 f"{message[-1] if message else 'no message'})")
        return self._failure


@dataclass(frozen=True)
class FolderCopy:
    """What ``--sync-dst-dir`` copies: ``source`` into ``dest``, over ``ssh``, rsync run with ``env``."""

    source: str
    dest: str
    ssh: SshOptions
    env: Mapping[str, str] = field(default_factory=dict)
    timeout: float = 600.0  # seconds one copy may take

    def start(self, host: str | None) -> Copy | None:
        """Start copying to ``host`` (None: this host); None when there is nothing to copy
        (this host, where ``dest`` is ``source``).

        Raises:
            LaunchError: rsync cannot be run here.
        """
        if host is None and os.path.realpath(self.source) == os.path.realpath(self.dest):
            return None
        err = tempfile.TemporaryFile()
        try:
            proc = subprocess.Popen(rsync_argv(self.source, host, self.dest, self.ssh), env=dict(self.env),
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
        except OSError as exc:
            err.close()
            raise LaunchError(with_hint(f"--sync-dst-dir: cannot run rsync: {exc}",
                                        "install rsync on this host and on every remote host")) from None
        return Copy(host, proc, err)

    def error(self, failed: Sequence[str]) -> LaunchError:
        """The error for the copies that failed (each as :meth:`Copy.failure` says it)."""
        what = f"--sync-dst-dir: could not copy {self.source} to {self.dest} on {'; '.join(failed)}"
        if self.ssh.rsh_agent is not None:
            agent = shlex.join([*self.ssh.rsh_agent, *self.ssh.extra_args])
            return LaunchError(with_hint(
                f"{what}; rsync ran through the rsh agent (OMPI_MCA_plm_rsh_agent): {agent}",
                f"rsync calls `{agent} HOST rsync --server ...`: the agent must run every argument after "
                "the host as one command (the MPI Operator's kubexec.sh does: sh -c \"$*\") and pass "
                "stdin and stdout through; check `" + agent + " HOST rsync --version`, that rsync is "
                "installed on every host, and that the folder can be created there"))
        return LaunchError(with_hint(
            what, "check that rsync is installed on every host, that ssh to it works "
            "(ssh -o BatchMode=yes HOST true), and that the folder can be created there"))

    def run(self, hosts: Sequence[str | None], stop_when: Callable[[], bool] = lambda: False) -> bool:
        """Copy to each of ``hosts`` (None: this host), side by side, and wait for every copy;
        ``stop_when()`` is asked a few times a second (the launcher: a signal arrived), and when
        it answers True the copies are killed and False is returned. True: every copy is done.

        Raises:
            LaunchError: rsync is missing or a copy failed (naming every failed host and rsync's message).
        """
        copies: list[Copy] = []
        try:
            for host in hosts:
                copy = self.start(host)
                if copy is not None:
                    copies.append(copy)
        except LaunchError:
            for started in copies:
                started.stop()
                started.failure()  # closes its message file
            raise
        deadline = time.monotonic() + self.timeout
        while not all(copy.done() for copy in copies) and time.monotonic() < deadline:
            if stop_when():
                for copy in copies:
                    copy.stop()
                    copy.failure()  # closes its message file
                return False
            time.sleep(_POLL)
        failed = []
        for copy in copies:
            copy.wait(max(0.0, deadline - time.monotonic()))
            failure = copy.failure()
            if failure is not None:
                failed.append(failure)
        if failed:
            raise self.error(failed)
        return True

