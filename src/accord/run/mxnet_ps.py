"""MXNet's own parameter-server jobs under accordrun (``--ps mxnet``): the roles and their
``DMLC_*`` environment, as MXNet's ``tools/launch.py`` gives them (pure functions).

MXNet's ps-lite runs one scheduler, ``-s`` servers and ``-n`` workers, all running the *same*
command: ``import mxnet`` in a process whose ``DMLC_ROLE`` is ``scheduler`` or ``server`` serves
and exits when the workers are done, so ``python train.py --kv-store dist_sync`` is every role.
The scheduler listens on ``DMLC_PS_ROOT_URI:DMLC_PS_ROOT_PORT`` (a free port of the launch host);
every node finds the others through it. The scheduler and servers run on the launch host, with
accordrun's output prefixes (``[scheduler]``, ``[serverN]``), fail-fast and cleanup; ps-lite
ending them with status 0 once the workers finish is not a failure.

==========================  ====================================================================
``DMLC_ROLE``               ``scheduler``, ``server`` or ``worker``
``DMLC_PS_ROOT_URI/PORT``   the scheduler's address (loopback, or the launch host's address
                            that remote workers reach in multi-host jobs) and port
``DMLC_NUM_SERVER/WORKER``  ``--num-servers`` and ``-np``
``DMLC_INTERFACE``          ``--network-interface`` (``lo`` when every process is local)
``DMLC_NODE_HOST``          the address a node advertises: ``127.0.0.1`` when every process is
                            local; in multi-host jobs the launch host's address for the scheduler
                            and servers (workers pick their interface's address)
==========================  ====================================================================

A user's own ``DMLC_INTERFACE`` / ``DMLC_NODE_HOST`` / ``PS_VERBOSE`` are kept (the whole
launcher environment reaches local processes; remote ones get the ``DMLC_``/``PS_`` variables).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

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


def node_env(role: str, job: MXNetJob, user_env: Mapping[str, str]) -> dict[str, str]:
    """The variables of a ``scheduler``, ``server`` or ``worker`` process.

    Raises:
        ValueError: an unknown role.
    """
    if role not in ("scheduler", "server", "worker"):
        raise ValueError(f"unknown MXNet role {role!r}; use scheduler, server or worker")
    env = _common(job, role, user_env)
    if "DMLC_NODE_HOST" not in user_env and (job.local or role != "worker"):
        env["DMLC_NODE_HOST"] = "127.0.0.1" if job.local else job.root_uri
    if role != "worker" and "OMP_NUM_THREADS" not in user_env:
        env["OMP_NUM_THREADS"] = "1"  # ps-lite nodes sum and copy; leave the cores to workers
    return env


def roles(num_servers: int) -> list[tuple[str, str]]:
    """(label, role) of the processes accordrun starts besides the workers, scheduler first."""
    return [(SCHEDULER_LABEL, "scheduler")] + [(f"server{i}", "server") for i in range(num_servers)]
