"""Starting one process on a remote host through ssh (workers and parameter servers alike).

The remote side runs :func:`accord.run.ssh.remote_script`; the job secret goes on ssh's stdin,
which stays open: its end-of-file tells the remote side to stop the process (see ssh.py).
"""
from __future__ import annotations

import subprocess
from typing import Mapping, Sequence

from accord.run.local import start_process
from accord.run.ssh import SshOptions, remote_script, secret_line, ssh_argv
from accord.run.worker_env import SECRET_FILE_VAR, SECRET_VAR, forwarded_env


def start_remote(
    host: str,
    argv: Sequence[str],
    environ: Mapping[str, str],
    added: Mapping[str, str],
    *,
    cwd: str,
    remote_cwd: str,
    grace: float,
    ssh: SshOptions,
    secret_hex: str,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` on ``host`` in ``remote_cwd`` with the forwarded part of ``environ`` plus
    ``added``; the ssh client runs here in ``cwd``, in its own session, stdin kept open.

    Raises:
        OSError: the ssh client cannot be started.
    """
    script = remote_script(argv, forwarded_env(environ, added), remote_cwd, grace)
    ssh_env = {k: v for k, v in environ.items() if k not in (SECRET_VAR, SECRET_FILE_VAR)}
    proc = start_process(ssh_argv(host, script, ssh), ssh_env, cwd, stdin=subprocess.PIPE)
    assert proc.stdin is not None
    proc.stdin.write(secret_line(secret_hex))
    proc.stdin.flush()
    return proc


def close_stdin(proc: subprocess.Popen[bytes]) -> None:
    """End-of-file to a remote process's ssh: the remote side stops it (TERM, grace, KILL)."""
    if proc.stdin is not None:
        try:
            proc.stdin.close()
        except OSError:
            pass
