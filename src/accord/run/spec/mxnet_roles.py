"""MXNet's own parameter-server jobs under accordrun (``--ps mxnet``): the roles and their
``DMLC_*`` environment, as MXNet's ``tools/launch.py`` gives them (pure functions).

MXNet's ps-lite runs one scheduler, ``-s`` servers and ``-n`` workers, all running the *same*
command: ``import mxnet`` in a process whose ``DMLC_ROLE`` is ``scheduler`` or ``server`` serves
and exits when the workers are done, so ``python train.py --kv-store dist_sync`` is every role.
The scheduler listens on ``DMLC_PS_ROOT_URI:DMLC_PS_ROOT_PORT`` (a free port of the launch host);
every node finds the others through it. The scheduler runs on the launch host (as MXNet's
``launch.py`` runs it); the servers go where accord's own would (``--server-hosts``, else round
robin over the worker hosts when there are several: :func:`accord.run.spec.server_roles.server_placement`),
remote ones through the same ssh runner as remote workers. All of them have accordrun's output
prefixes (``[scheduler]``, ``[serverN]``), fail-fast and cleanup; ps-lite ending them with status 0
once the workers finish is not a failure.

==========================  ====================================================================
``DMLC_ROLE``               ``scheduler``, ``server`` or ``worker``
``DMLC_PS_ROOT_URI/PORT``   the scheduler's address (loopback, or the launch host's address
                            that remote workers reach in multi-host jobs) and port
``DMLC_NUM_SERVER/WORKER``  ``--num-servers`` and ``-np``
``DMLC_INTERFACE``          ``--network-interface`` (``lo`` when every process is local)
``DMLC_NODE_HOST``          the address a node advertises: ``127.0.0.1`` when every process is
                            local; in multi-host jobs the launch host's address (on the job's
                            interface) for every node there; unset on other hosts, where ps-lite
                            takes the address of ``DMLC_INTERFACE`` or of the host's first
                            non-loopback interface
==========================  ====================================================================

A user's own ``DMLC_INTERFACE`` / ``DMLC_NODE_HOST`` / ``PS_VERBOSE`` are kept (the whole
launcher environment reaches local processes; remote ones get the ``DMLC_``/``PS_`` variables).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

PS_KINDS = ("accord", "mxnet")
SCHEDULER_LABEL = "scheduler"


@dataclass(frozen=True)
class MXNetJob:
    """Where MXNet's scheduler listens and how many nodes the job has."""

    root_uri: str
    root_port: int
    num_workers: int
    num_servers: int
    local: bool  # every process on the launch host
    interface: str | None = None  # --network-interface


def _common(job: MXNetJob, role: str, user_env: Mapping[str, str]) -> dict[str, str]:
    env = {
        "DMLC_ROLE": role,
        "DMLC_PS_ROOT_URI": job.root_uri,
        "DMLC_PS_ROOT_PORT": str(job.root_port),
        "DMLC_NUM_SERVER": str(job.num_servers),
        "DMLC_NUM_WORKER": str(job.num_workers),
    }
    interface = job.interface or ("lo" if job.local else None)
    if interface and "DMLC_INTERFACE" not in user_env:
        env["DMLC_INTERFACE"] = interface
    return env


def node_env(role: str, job: MXNetJob, user_env: Mapping[str, str], remote: bool = False) -> dict[str, str]:
    """The variables of a ``scheduler``, ``server`` or ``worker`` process; ``remote``: it runs on
    another host than the launcher's.

    Raises:
        ValueError: an unknown role.
    """
    if role not in ("scheduler", "server", "worker"):
        raise ValueError(f"unknown MXNet role {role!r}; use scheduler, server or worker")
    if remote and (job.local or role == "scheduler"):
        raise ValueError(f"MXNet's {role} cannot run on another host in this job "
                         f"({'every process is local' if job.local else 'the scheduler stays here'})")
    env = _common(job, role, user_env)
    # The launch host's address is only right for nodes on the launch host: a server or worker
    # elsewhere must advertise its own, which only ps-lite on that host can find (by
    # DMLC_INTERFACE, which every node gets when --network-interface is given, or its first
    # non-loopback interface), so it is left unset there.
    if "DMLC_NODE_HOST" not in user_env and not remote:
        env["DMLC_NODE_HOST"] = "127.0.0.1" if job.local else job.root_uri
    if role != "worker" and "OMP_NUM_THREADS" not in user_env:
        env["OMP_NUM_THREADS"] = "1"  # ps-lite nodes sum and copy; leave the cores to workers
    return env


def nodes(server_hosts: Sequence[str]) -> list[tuple[str, str, str]]:
    """(label, role, host) of the processes accordrun starts besides the workers: the scheduler
    on the launch host (``localhost``) first, then server ``i`` on ``server_hosts[i]``."""
    return [(SCHEDULER_LABEL, "scheduler", "localhost")] + [
        (f"server{i}", "server", host) for i, host in enumerate(server_hosts)]
