"""The ssh command line for remote workers (pure: built here, started by the launcher).

The remote side runs a short POSIX ``sh`` script (the remote login shell must understand
POSIX syntax: sh, bash, dash, zsh):

1. ``cd`` to the launcher's working directory;
2. read the job secret from the first line of stdin, then the forwarded variables, one
   ``NAME=value`` shell assignment a line up to an empty line, and export them (the launcher
   writes them to ssh's stdin, :func:`stdin_preamble`: the secret never appears in an argv or a
   log, the variables' values are not shown by ``ps`` on either host, and their size is not
   bounded by the 128 KiB a single argv string may have);
3. start the command in its own session (``setsid``) so its whole process tree has one group;
4. keep reading stdin: end-of-file means the launcher (or its ssh client) is gone, so the
   script sends SIGTERM to the worker's group, waits up to the grace period, then SIGKILL;
5. when the worker exits, stop what is left of its group the same way (its children must not
   outlive the job), then exit with the worker's status (signal ``n`` shows as ``128 + n``).
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Mapping, Sequence

from accord.errors import ConfigError, with_hint
from accord.run.spec.worker_env import SECRET_VAR

STRICT_POLICIES = ("yes", "accept-new", "no")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class SshOptions:
    """How to reach remote hosts."""

    port: int | None = None
    identity_file: str | None = None
    strict_host_key_checking: str = "accept-new"
    connect_timeout: int = 10
    ssh_binary: str = "ssh"
    # a program used instead of ssh (the MPI Operator's OMPI_MCA_plm_rsh_agent): argv + host + script
    rsh_agent: tuple[str, ...] | None = None
    # OMPI_MCA_plm_rsh_args: right after the program, so that their -o options win (ssh keeps the
    # first value of each) and an explicit -p given to accordrun, later, wins over theirs
    extra_args: tuple[str, ...] = ()


# A newline inside a forwarded value: the line that carries it names this variable instead, so
# that every assignment stays on one line of stdin.
_NEWLINE_VAR = "_accord_nl"


def remote_script(command: Sequence[str], cwd: str, grace: float) -> str:
    """The POSIX sh script a remote host runs for one worker (see the module docstring); its
    stdin must start with :func:`stdin_preamble`."""
    cmd = " ".join(shlex.quote(part) for part in command)
    grace_s = max(0, int(round(grace)))
    lines = [
        f"cd {shlex.quote(cwd)} || exit 127",
        f"IFS= read -r {SECRET_VAR} || exit 126",
        f"export {SECRET_VAR}",
        f"{_NEWLINE_VAR}='\n'",
        # each line is an assignment stdin_preamble quoted; the empty line ends them
        'while IFS= read -r _accord_line || exit 126; [ -n "$_accord_line" ]; do eval "export $_accord_line"; done',
        f"unset _accord_line {_NEWLINE_VAR}",
    ]
    # stop the worker's group: TERM, up to `grace` seconds, then KILL (also used for leftovers
    # of a worker that exited: its children must not outlive the job, as on the launch host)
    stop = (f"kill -TERM -$pid 2>/dev/null && {{ n=0; while [ $n -lt {grace_s} ] && kill -0 -$pid 2>/dev/null; "
            f"do sleep 1; n=$((n+1)); done; kill -KILL -$pid 2>/dev/null; }}")
    lines += [
        "exec 3<&0",
        f"setsid {cmd} </dev/null &",
        "pid=$!",
        # why a read loop: a builtin, so no extra process outlives the job; <&3 because
        # background jobs in a non-interactive shell otherwise read /dev/null.
        f"{{ while IFS= read -r _line; do :; done; {stop}; }} <&3 >/dev/null 2>&1 &",
        "watcher=$!",
        "exec 3<&-",
        "wait $pid",
        "rc=$?",
        "kill $watcher 2>/dev/null",
        f"{stop}",
        "exit $rc",
    ]
    return "\n".join(lines)


def ssh_argv(host: str, script: str, opts: SshOptions) -> list[str]:
    """The ssh client's argv: the extra arguments, batch mode (never prompt), host key policy,
    port, identity; or the rsh agent's (its argv, the extra arguments, host, script).

    Raises:
        ConfigError: an unknown StrictHostKeyChecking policy.
    """
    if opts.rsh_agent is not None:  # it takes the host and the command, as ssh does
        return [*opts.rsh_agent, *opts.extra_args, host, script]
    if opts.strict_host_key_checking not in STRICT_POLICIES:
        raise ConfigError(with_hint(
            f"unknown StrictHostKeyChecking policy {opts.strict_host_key_checking!r}",
            f"use one of {', '.join(STRICT_POLICIES)}",
        ))
    argv = [
        opts.ssh_binary,
        *opts.extra_args,
        "-T",  # no pseudo-terminal: output stays a clean byte stream
        "-o", "BatchMode=yes",
        "-o", f"StrictHostKeyChecking={opts.strict_host_key_checking}",
        "-o", f"ConnectTimeout={opts.connect_timeout}",
    ]
    if opts.port is not None:
        argv += ["-p", str(opts.port)]
    if opts.identity_file is not None:
        argv += ["-i", opts.identity_file]
    argv += [host, script]
    return argv


def secret_line(secret_hex: str) -> bytes:
    """What the launcher writes to ssh's stdin first: the secret and a newline."""
    return (secret_hex + "\n").encode("ascii")


def _quoted(value: str) -> str:
    """``value`` as one line of shell words: quoted pieces joined by the newline variable."""
    return f'"${_NEWLINE_VAR}"'.join(shlex.quote(piece) for piece in value.split("\n"))


def environment_lines(env: Mapping[str, str]) -> bytes:
    """The forwarded variables as :func:`remote_script` reads them: ``NAME=value`` lines, the
    value quoted for the shell, then an empty line.

    Raises:
        ConfigError: a variable name that a shell cannot export.
    """
    for name in env:
        if not _IDENT.match(name) or name.startswith("_accord_"):
            raise ConfigError(with_hint(f"cannot export variable {name!r} to a remote shell",
                                        "use names made of letters, digits and underscores"))
    return "".join(f"{k}={_quoted(v)}\n" for k, v in sorted(env.items())).encode("utf-8", "surrogateescape") + b"\n"


def stdin_preamble(secret_hex: str, env: Mapping[str, str]) -> bytes:
    """Everything the launcher writes to ssh's stdin before it only keeps it open: the secret,
    then the forwarded variables (:func:`environment_lines`)."""
    return secret_line(secret_hex) + environment_lines(env)
