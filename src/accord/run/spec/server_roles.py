"""Parameter servers for ``accordrun --num-servers N``: their command line and environment.

``-np`` counts workers and ``--num-servers`` adds server processes, as MXNet's
``tools/launch.py -n W -s S`` does. On one host the servers run on the launch host. When the
workers span several hosts, server ``i`` runs on the ``i``-th worker host, round robin (as
MXNet's ssh launcher places servers), so that no single host carries every server's traffic;
``--server-hosts a,b`` chooses the hosts instead (``--server-hosts localhost``: all on the launch
host). Each server is ``python -m accord.kvstore.server`` in its own session (remote ones through
ssh, like remote workers), with piped output (``[serverN]`` prefixes), under the guardian, and
watched like the workers. The launcher's authenticated store
plays ps-lite's scheduler: servers register their address there and workers find them there.

This module only builds argv and environments (pure functions, unit-tested). It does not import
:mod:`accord.kvstore` (the launcher sits below the frontends, and must start without torch or
numpy): the server is started as a program.

Variables of a parameter-server job (both names are set, so a stale value of either in the
launcher's environment cannot win):

===========================================  ======================================================
``DMLC_ROLE`` / ``ACCORD_ROLE``              ``worker`` or ``server``
``DMLC_NUM_WORKER`` / ``ACCORD_NUM_WORKERS``  number of workers (``-np``)
``DMLC_NUM_SERVER`` / ``ACCORD_NUM_SERVERS``  number of servers (``--num-servers``)
``DMLC_PS_ROOT_URI`` / ``ACCORD_PS_ROOT_URI``  address of the launcher's store (= ACCORD_STORE_ADDR)
``DMLC_PS_ROOT_PORT`` / ``ACCORD_PS_ROOT_PORT``  port of the launcher's store (= ACCORD_STORE_PORT)
===========================================  ======================================================

Servers also get ``ACCORD_SERVER_INDEX`` (0..N-1, the N in ``[serverN]``), ``ACCORD_JOB_ID``,
``ACCORD_STORE_ADDR/PORT``, the secret (``ACCORD_JOB_SECRET``, added by the launcher), the tuning
variables (``ACCORD_VERBOSE``, ``ACCORD_START_TIMEOUT``, ...) and, in multi-host jobs, the
address to advertise (``ACCORD_NODE_HOST``, unless the user set it). With ``--num-servers 0``
nothing here is added: workers get exactly the environment they got before.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from accord.errors import LaunchError, with_hint
from accord.run.settings import LauncherSettings
from accord.run.spec.tuning import Tuning, tuning_env
from accord.run.spec.worker_env import JobEnv

ROLES = ("worker", "server")


def server_placement(num_servers: int, server_hosts: Sequence[str], worker_hosts: Sequence[str]) -> list[str]:
    """The host of each server: round robin over ``server_hosts`` when given, else over the
    worker hosts when there are several, else ``localhost`` (the launch host).

    Example: ``server_placement(3, [], ["a", "b"])`` -> ``["a", "b", "a"]``.
    """
    hosts = list(server_hosts) or (list(dict.fromkeys(worker_hosts)) if len(set(worker_hosts)) > 1
                                   else ["localhost"])
    return [hosts[i % len(hosts)] for i in range(num_servers)]


def server_label(index: int) -> str:
    """The console prefix key of server ``index``: ``server0`` (printed ``[server0]``)."""
    return f"server{index}"


def server_dirname(index: int) -> str:
    """The ``--output-filename`` folder of server ``index``: ``server.0`` (next to ``rank.0``)."""
    return f"server.{index}"


def ps_env(role: str, job: JobEnv, num_servers: int, num_workers: int) -> dict[str, str]:
    """MXNet's and accord's parameter-server variables for a ``worker`` or ``server``.

    Raises:
        LaunchError: the job has no store (servers register there) or ``role`` is unknown.
    """
    if role not in ROLES:
        raise LaunchError(with_hint(f"unknown parameter-server role {role!r}", f"use one of {ROLES}"))
    if job.store_addr is None or job.store_port is None:
        raise LaunchError(with_hint(
            f"--num-servers {num_servers} needs accord's rendezvous store, which is not available",
            "check that accord is fully installed (accord.store.server imports), or run "
            "without --num-servers"))
    values = {
        "ROLE": role,
        "NUM_WORKER": str(num_workers),
        "NUM_SERVER": str(num_servers),
        "PS_ROOT_URI": job.store_addr,
        "PS_ROOT_PORT": str(job.store_port),
    }
    env = {f"DMLC_{k}": v for k, v in values.items()}
    env.update({
        "ACCORD_ROLE": role,
        "ACCORD_NUM_WORKERS": values["NUM_WORKER"],
        "ACCORD_NUM_SERVERS": values["NUM_SERVER"],
        "ACCORD_PS_ROOT_URI": values["PS_ROOT_URI"],
        "ACCORD_PS_ROOT_PORT": values["PS_ROOT_PORT"],
    })
    return env


def server_env(
    index: int,
    job: JobEnv,
    num_servers: int,
    num_workers: int,
    *,
    tuning: Any = None,
    user_env: Mapping[str, str] | None = None,
    node_host: str | None = None,
) -> dict[str, str]:
    """Everything the launcher adds to server ``index``'s environment (no secret).

    Args:
        user_env: the launcher's environment; a user's ACCORD_NODE_HOST/DMLC_NODE_HOST wins
            over ``node_host``.
        node_host: the address to advertise to workers (multi-host jobs; None on one host,
            where servers bind and advertise loopback).
    """
    env = ps_env("server", job, num_servers, num_workers)
    env.update(tuning_env(tuning or Tuning()))
    env.update({
        "ACCORD_SERVER_INDEX": str(index),
        "ACCORD_JOB_ID": job.job_id,
        "ACCORD_STORE_ADDR": str(job.store_addr),
        "ACCORD_STORE_PORT": str(job.store_port),
    })
    if node_host is not None and LauncherSettings.from_environ(user_env or {}).node_host is None:
        env["ACCORD_NODE_HOST"] = node_host
    return env
