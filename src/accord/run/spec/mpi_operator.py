"""The MPI Operator's contract (Kubeflow's MPIJob), read as horovodrun reads it under mpirun.

In an MPIJob's launcher pod the operator sets ``OMPI_MCA_orte_default_hostfile`` (newer Open
MPI: ``OMPI_MCA_prte_default_hostfile``) to a hostfile of ``host slots=N`` lines, one per
worker pod, and (MPI Operator v1) ``OMPI_MCA_plm_rsh_agent`` to a program used instead of ssh
(``/etc/mpi/kubexec.sh POD command``, which runs the command in the pod through ``kubectl
exec``). ``accordrun -np 4 python train.py`` with no ``-H``, ``--hostfile`` or ``--ips`` takes
the hosts from that hostfile, and starts remote workers through that program: its argv is the
program, then the host, then the remote script (as ssh's), and it must pass stdin through (the
job secret travels there, never in an argv). ``OMPI_MCA_plm_rsh_args`` are added right after
the program (ssh or the agent), as Open MPI's mpirun adds them. Pure.
"""
from __future__ import annotations

import os
import shlex
import shutil
from typing import Mapping

from accord.errors import ConfigError, with_hint

HOSTFILE_VARS = ("OMPI_MCA_orte_default_hostfile", "OMPI_MCA_prte_default_hostfile")
RSH_AGENT_VARS = ("OMPI_MCA_plm_rsh_agent", "OMPI_MCA_orte_rsh_agent")
# Open MPI's extra arguments for ssh (or the rsh agent): the MPI Operator sets e.g.
# "-o ConnectionAttempts=10"; Open MPI 5's PRRTE names it plm_ssh_args.
RSH_ARGS_VARS = ("OMPI_MCA_plm_rsh_args", "PRTE_MCA_plm_ssh_args")
_SSH_NAMES = ("ssh", "rsh")  # Open MPI's default, "ssh : rsh": accordrun's own ssh does


def default_hostfile(environ: Mapping[str, str]) -> tuple[str, str] | None:
    """(variable, path) of the operator's hostfile, or None."""
    for name in HOSTFILE_VARS:
        if environ.get(name):
            return name, environ[name]
    return None


def rsh_agent(environ: Mapping[str, str]) -> tuple[str, ...] | None:
    """The program (and its arguments) ``OMPI_MCA_plm_rsh_agent`` names instead of ssh, or None
    when unset or naming ssh/rsh (Open MPI's default ``ssh : rsh``).

    Raises:
        ConfigError: the program named does not exist or cannot be run.
    """
    for name in RSH_AGENT_VARS:
        text = environ.get(name, "").strip()
        if not text:
            continue
        first = text.split(":")[0].strip()  # Open MPI's "a : b" list: the first is tried first
        argv = tuple(shlex.split(first))
        if not argv or os.path.basename(argv[0]) in _SSH_NAMES:
            return None
        found = shutil.which(argv[0], path=environ.get("PATH"))
        if found is None:
            raise ConfigError(with_hint(
                f"{name}={text!r} names {argv[0]!r}, which is not an executable program here",
                f"point {name} at the program that runs a command on a host (the MPI Operator's "
                "/etc/mpi/kubexec.sh), or unset it to use ssh"))
        return (found, *argv[1:])
    return None


def rsh_args(environ: Mapping[str, str]) -> tuple[str, ...]:
    """The arguments ``OMPI_MCA_plm_rsh_args`` (or PRRTE's ``PRTE_MCA_plm_ssh_args``) adds to ssh
    or to the rsh agent, split as a shell splits them; () when unset.

    Args:
        environ: the launcher's environment.

    Returns:
        The arguments, e.g. ``("-o", "ConnectionAttempts=10")``.

    Raises:
        ConfigError: the value cannot be split (an unclosed quote).
    """
    for name in RSH_ARGS_VARS:
        text = environ.get(name, "").strip()
        if not text:
            continue
        try:
            return tuple(shlex.split(text))
        except ValueError as exc:
            raise ConfigError(with_hint(f"{name}={text!r} cannot be split into arguments: {exc}",
                                        f"close the quote in {name}, e.g. {name}='-o ConnectionAttempts=10 "
                                        "-p 2222'")) from None
    return ()
