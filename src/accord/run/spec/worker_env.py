"""The worker environment contract: what accordrun and accord.spawn give every worker.

This docstring is the one place the contract is written down.

Coordinates (one set per worker; "host" = a name from ``-H``/hostfile):

====================  ==============================================================
ACCORD_RANK           global rank, 0..size-1 (ranks fill hosts in order)
ACCORD_SIZE           number of workers in the job
ACCORD_LOCAL_RANK     rank among the workers on this host
ACCORD_LOCAL_SIZE     number of workers on this host
ACCORD_CROSS_RANK     index of this host among the hosts that have a worker with this local rank
ACCORD_CROSS_SIZE     number of hosts that have a worker with this local rank
ACCORD_HOSTNAME       the host name the launcher assigned (topology is built from these names)
====================  ==============================================================

Rendezvous and job:

======================  ============================================================
ACCORD_STORE_ADDR/PORT  accord's authenticated rendezvous store (started by the launcher)
ACCORD_JOB_SECRET       hex of 32 random bytes that authenticates control messages. Local
                        workers get it in their environment; remote workers read it from
                        ssh's stdin (never argv, never logs). ``ACCORD_SECRET_FILE`` (a 0600
                        file holding the hex) is the accepted alternative.
ACCORD_JOB_ID           identifier of the job (logs, error files)
ACCORD_ERROR_FILE       where :mod:`accord.worker_contract` writes an uncaught exception
                        (JSON) for the launcher's root-cause report (local workers only)
ACCORD_START_TIMEOUT    seconds every rank has to reach the rendezvous (when given)
======================  ============================================================

Check-in: a worker that uses accord's init sets the store key ``CHECKIN_KEY.format(rank=r)``
(``accord/checkin/<rank>``, :mod:`accord.worker_contract`) once it has connected. The launcher
enforces ``--start-timeout`` against these keys only when that flag is given explicitly, because
plain scripts (a DDP script using ``env://``) never touch accord's store.

Compatibility, so that Horovod and torchrun scripts run unchanged:

- ``HOROVOD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE/CROSS_RANK/CROSS_SIZE/HOSTNAME`` = the values above.
- torchrun's ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK`` (index
  of the host), ``MASTER_ADDR``, ``MASTER_PORT``. ``MASTER_PORT`` is a *different* free port from
  accord's store: rank 0 of a ``env://`` script binds torch's own TCPStore there.

Resources:

- ``OMP_NUM_THREADS = max(1, cores // local_size)`` unless the user set it (the launcher says so
  once on stderr). ``cores`` is the launch host's CPU count (also used for remote hosts).
- ``CUDA_VISIBLE_DEVICES`` = the local rank's device from ``--gpus/--devices`` (one per worker).

Tuning flags map to the variables of :data:`accord.run.spec.tuning.OPTIONS` (the one table of them):
``ACCORD_FUSION_THRESHOLD`` (bytes), ``ACCORD_CYCLE_TIME`` (ms), ``ACCORD_TIMELINE``,
``ACCORD_STALL_CHECK_TIME_SECONDS``, ``ACCORD_STALL_SHUTDOWN_TIME_SECONDS``,
``ACCORD_STALL_CHECK_DISABLE``, ``ACCORD_HIERARCHICAL_ALLREDUCE``, ``ACCORD_LOG_LEVEL``,
``ACCORD_INTERFACE``, ``ACCORD_VERBOSE`` (a level: ``--verbose`` gives 1, ``PS_VERBOSE=2``
stays 2; see :mod:`accord.config`) and ``ACCORD_START_TIMEOUT``.

Elastic jobs (``--min-np`` or ``--host-discovery-script``) add ``ACCORD_ELASTIC=1`` and
Horovod's ``HOROVOD_ELASTIC=1`` (:data:`ELASTIC_FLAG`). Those the elastic driver runs (with
``--host-discovery-script``, or ``--min-np`` with ``-H`` naming two or more hosts) also get
``ACCORD_ELASTIC_ID`` (the worker's stable id: its first rank; workers added later get the next
ids), ``ACCORD_ELASTIC_JOIN=1`` (a worker
added to the running job: its init waits to be admitted), ``ACCORD_ELASTIC_MIN_NP`` and, with
``--elastic-timeout``, ``ACCORD_ELASTIC_TIMEOUT`` (see :func:`elastic_env`). A worker added to
the running job gets as coordinates (``ACCORD_RANK``, ``HOROVOD_RANK``, ``RANK``, ...) the place
the re-formation that admits it will give it, as horovodrun gives its planned rank
(:mod:`accord.run.elastic.driver`); its ``init()`` then takes the place actually published.

One agent per node (``accordrun --nnodes N --node-rank R --nproc-per-node P``,
:mod:`accord.run.agent`): node R's workers are ranks ``R*P .. R*P+P-1`` with the coordinates
above (``ACCORD_HOSTNAME`` = the agent's host name, made distinct as ``host-nodeR`` where several
agents share a host), ``ACCORD_STORE_ADDR/PORT`` = a fresh store node 0's agent serves for each
attempt, ``MASTER_ADDR`` = the endpoint's host; and every worker gets the restart counts:
``TORCHELASTIC_RESTART_COUNT`` and ``ACCORD_RESTART_COUNT`` (0, then one more per whole-job
restart, ``--max-restarts``) and ``TORCHELASTIC_MAX_RESTARTS``.

Parameter-server jobs (``--num-servers N`` > 0) add MXNet's ``DMLC_ROLE=worker``,
``DMLC_NUM_WORKER``, ``DMLC_NUM_SERVER``, ``DMLC_PS_ROOT_URI``, ``DMLC_PS_ROOT_PORT`` and their
``ACCORD_*`` twins to every worker; :mod:`accord.run.spec.server_roles` documents them and the servers'
own environment.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from accord.errors import ConfigError, with_hint
from accord.run.spec.assignment import Slot
from accord.run.spec.tuning import Tuning, render_number, tuning_env

SECRET_VAR = "ACCORD_JOB_SECRET"
SECRET_FILE_VAR = "ACCORD_SECRET_FILE"

# Variables a remote worker gets from the launcher's environment besides the contract
# (locally the whole environment is inherited).
FORWARD_PREFIXES = ("ACCORD_", "HOROVOD_", "NCCL_", "GLOO_", "TORCH_", "PYTORCH_", "CUDA_", "OMP_", "MKL_",
                    "DMLC_", "MXNET_", "PS_")  # the last three: MXNet's and ps-lite's settings
# PATH and the active environment's root, as horovodrun forwards them (it forwards nearly all):
# `accordrun -H a:2,b:2 python train.py` from an activated venv or conda environment runs that
# environment's python on every host that has it at the same path (a shared file system).
FORWARD_NAMES = ("PYTHONPATH", "PYTHONUNBUFFERED", "LD_LIBRARY_PATH", "PATH", "VIRTUAL_ENV", "CONDA_PREFIX",
                 "CONDA_DEFAULT_ENV")


@dataclass(frozen=True)
class JobEnv:
    """What every worker of one job shares."""

    job_id: str
    master_addr: str
    master_port: int
    store_addr: str | None = None
    store_port: int | None = None


def omp_threads(cpu_count: int, local_size: int) -> int:
    """Threads per worker so that the local workers share the cores: max(1, cores // local)."""
    return max(1, cpu_count // max(1, local_size))


def contract_env(slot: Slot, job: JobEnv) -> dict[str, str]:
    """The coordinates, rendezvous and compatibility variables for one worker (no secret)."""
    coords = {
        "RANK": slot.rank,
        "SIZE": slot.size,
        "LOCAL_RANK": slot.local_rank,
        "LOCAL_SIZE": slot.local_size,
        "CROSS_RANK": slot.cross_rank,
        "CROSS_SIZE": slot.cross_size,
        "HOSTNAME": slot.hostname,
    }
    env = {f"ACCORD_{k}": str(v) for k, v in coords.items()}
    env.update({f"HOROVOD_{k}": str(v) for k, v in coords.items()})
    env.update({
        "ACCORD_JOB_ID": job.job_id,
        "RANK": str(slot.rank),
        "WORLD_SIZE": str(slot.size),
        "LOCAL_RANK": str(slot.local_rank),
        "LOCAL_WORLD_SIZE": str(slot.local_size),
        "GROUP_RANK": str(slot.host_index),
        "MASTER_ADDR": job.master_addr,
        "MASTER_PORT": str(job.master_port),
    })
    if job.store_addr is not None and job.store_port is not None:
        env["ACCORD_STORE_ADDR"] = job.store_addr
        env["ACCORD_STORE_PORT"] = str(job.store_port)
    return env


def worker_env(
    slot: Slot,
    job: JobEnv,
    *,
    tuning: Any = None,
    user_env: Mapping[str, str] | None = None,
    cpu_count: int = 1,
    devices: tuple[str, ...] | None = None,
    error_file: str | None = None,
) -> dict[str, str]:
    """Everything the launcher adds to a worker's environment (no secret: see :data:`SECRET_VAR`).

    Args:
        user_env: the launcher's environment; an ``OMP_NUM_THREADS`` there wins over ours.
        devices: ``--gpus`` list; local rank i gets ``devices[i]``.
    """
    env = contract_env(slot, job)
    env.update(tuning_env(tuning or Tuning()))
    if "OMP_NUM_THREADS" not in (user_env or {}):
        env["OMP_NUM_THREADS"] = str(omp_threads(cpu_count, slot.local_size))
    if devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = devices[slot.local_rank]
    if error_file is not None:
        env["ACCORD_ERROR_FILE"] = error_file
    return env


# Every worker of an elastic job (--min-np or --host-discovery-script), as horovodrun marks them:
# a DistributedOptimizer built while the job has one worker still hooks its gradients.
ELASTIC_FLAG = {"ACCORD_ELASTIC": "1", "HOROVOD_ELASTIC": "1"}


def elastic_env(member_id: int, joining: bool, min_np: int | None,
                elastic_timeout: float | None) -> dict[str, str]:
    """What a worker run by the elastic driver adds: :data:`ELASTIC_FLAG`, its stable id
    (``ACCORD_ELASTIC_ID``), ``ACCORD_ELASTIC_JOIN=1`` for a worker added to the running job,
    ``ACCORD_ELASTIC_MIN_NP`` and, when given, ``ACCORD_ELASTIC_TIMEOUT``."""
    env = {"ACCORD_ELASTIC_ID": str(member_id), **ELASTIC_FLAG}
    if joining:
        env["ACCORD_ELASTIC_JOIN"] = "1"
    if min_np is not None:
        env["ACCORD_ELASTIC_MIN_NP"] = str(min_np)
    if elastic_timeout is not None:
        env["ACCORD_ELASTIC_TIMEOUT"] = render_number(elastic_timeout)
    return env


def local_environment(base: Mapping[str, str], added: Mapping[str, str], secret_hex: str) -> dict[str, str]:
    """The full environment of a local worker: the launcher's, the contract, the secret.

    A secret file named in the launcher's environment is dropped: the job's own secret is the
    one that counts.
    """
    env = {k: v for k, v in base.items() if k != SECRET_FILE_VAR}
    env.update(added)
    env[SECRET_VAR] = secret_hex
    return env


def forwarded_env(base: Mapping[str, str], added: Mapping[str, str]) -> dict[str, str]:
    """What a remote (ssh) worker gets exported: chosen launcher variables plus the contract.

    The secret is never part of it (it travels on ssh's stdin).
    """
    env = {
        k: v for k, v in base.items()
        if (k.startswith(FORWARD_PREFIXES) or k in FORWARD_NAMES)
        and k not in (SECRET_VAR, SECRET_FILE_VAR, "ACCORD_ERROR_FILE")
    }
    env.update({k: v for k, v in added.items() if k not in (SECRET_VAR, "ACCORD_ERROR_FILE")})
    return env


def check_devices(devices: tuple[str, ...] | None, slots: Sequence[Slot]) -> None:
    """Refuse a ``--gpus`` list shorter than the workers some host runs in ``slots`` (local
    rank i gets ``devices[i]``); no slot (an elastic job still waiting for hosts) passes.

    Raises:
        ConfigError: naming the device count, the host and its workers, with a HINT.
    """
    if devices is None or not slots:
        return
    busiest = max(slots, key=lambda s: s.local_size)
    if busiest.local_size > len(devices):
        raise ConfigError(with_hint(
            f"--gpus/--devices lists {len(devices)} device(s) but host {busiest.hostname} runs "
            f"{busiest.local_size} workers",
            f"list at least {busiest.local_size} devices, or lower the workers per host"))


def pick_device(devices: Sequence[str], in_use: set[str], local_rank: int) -> str:
    """The ``--gpus`` device of a worker started into a running elastic job: its local rank's
    (as a fixed job's) when no running worker on the host holds it, else the first free one.
    Survivors keep their device through re-formations while local ranks move, so a joiner's
    local rank may name a busy one. With none free (workers still leaving), its local rank's."""
    wanted = devices[local_rank % len(devices)]
    if wanted not in in_use:
        return wanted
    return next((d for d in devices if d not in in_use), wanted)
