"""``accordrun --sync-dst-dir DIR``: copy the working directory to every host before the job.

As MXNet's ``tools/launch.py --sync-dst-dir``: the launcher's working directory is copied with
``rsync`` over the same ssh (port, identity, host-key policy) to ``DIR`` on every remote host of
the job, and to ``DIR`` on this host when it runs workers and ``DIR`` is elsewhere; then every
worker and parameter server runs from ``DIR``. Files already in ``DIR`` that the source lacks
are kept (rsync without ``--delete``). The copies run side by side, one per host.
"""
from __future__ import annotations

import os
import shlex
import subprocess
from typing import Mapping, Sequence

from accord.errors import LaunchError, with_hint
from accord.run.ssh import SshOptions, ssh_argv


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


def sync_dirs(source: str, hosts: Sequence[str | None], dest: str, ssh: SshOptions,
              env: Mapping[str, str], timeout: float = 600.0) -> None:
    """Copy ``source`` to ``dest`` on each of ``hosts`` (None: this host), side by side.

    Raises:
        LaunchError: rsync is missing or a copy failed (naming the host and rsync's message).
    """
    procs = []
    for host in hosts:
        if host is None and os.path.realpath(source) == os.path.realpath(dest):
            continue
        try:
            procs.append((host, subprocess.Popen(rsync_argv(source, host, dest, ssh), env=dict(env),
                                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                                 stderr=subprocess.PIPE)))
        except OSError as exc:
            for _, p in procs:
                p.kill()
                p.wait()
            raise LaunchError(with_hint(f"--sync-dst-dir: cannot run rsync: {exc}",
                                        "install rsync on this host and on every remote host")) from None
    failed = []
    for host, proc in procs:
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        if proc.returncode != 0:
            message = err.decode(errors="replace").strip().splitlines()
            failed.append(f"{host or 'this host'} (rsync exit {proc.returncode}: "
                          f"{message[-1] if message else 'no message'})")
    if failed:
        raise LaunchError(with_hint(
            f"--sync-dst-dir: could not copy {source} to {dest} on {'; '.join(failed)}",
            "check that rsync is installed on every host, that ssh to it works "
            "(ssh -o BatchMode=yes HOST true), and that the folder can be created there"))
