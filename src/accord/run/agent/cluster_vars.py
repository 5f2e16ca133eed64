"""One agent per node: the node's place in the job, from the flags or the cluster's variables.

Pure (no I/O but reading the secret file): :func:`agent_spec` turns accordrun's agent flags and
the environment into an :class:`AgentSpec`, or raises :class:`~accord.errors.ConfigError` (exit 2,
nothing started). Each value comes from the first of these that gives it (the precedence
docs/launcher.md documents):

==================  ===================  ==================================  ================================
value               flag                 Kubernetes (PyTorchJob / TrainJob)  SLURM (in an ``srun`` step)
==================  ===================  ==================================  ================================
nodes               ``--nnodes N|A:B``   ``PET_NNODES``                      ``SLURM_NNODES``
node rank           ``--node-rank R``    ``PET_NODE_RANK``                   ``SLURM_NODEID``
workers per node    ``--nproc-per-node`` ``PET_NPROC_PER_NODE``              (the flag; default 1)
endpoint            ``--rdzv-endpoint``  ``PET_RDZV_ENDPOINT``, then         first host of
                                         ``PET_MASTER_ADDR:PET_MASTER_PORT``,  ``SLURM_JOB_NODELIST``
                                         then ``MASTER_ADDR:MASTER_PORT``    (port: ``MASTER_PORT``, else
                                                                             the step's, ``slurm_step_port``)
==================  ===================  ==================================  ================================

Agent mode is on when one of ``--nnodes``, ``--node-rank``, ``--rdzv-endpoint`` is given, or
``PET_NNODES`` is set, or, inside an ``srun`` step (``SLURM_STEP_ID`` and ``SLURM_NODEID`` set),
``--nproc-per-node`` is given alone; never when hosts (``-H``, ``--hostfile``, ``--ips``) or
``-np`` are given, which keep today's launch-host jobs.
"""
from __future__ import annotations

import argparse
import hashlib
import os
from dataclasses import dataclass, field
from typing import Mapping

from accord.config import int_variable
from accord.errors import ConfigError, with_hint
from accord.host_lists import expand_nodelist, slurm_step_port
from accord.run.spec.hosts import check_name
from accord.store.secret import read_secret_file, secret_from_hex

DEFAULT_PORT = 29400  # torchrun's c10d rendezvous port
DEFAULT_START_TIMEOUT = 300.0  # agents of one job may start minutes apart (pods being scheduled)
SECRET_FILE_VAR = "ACCORD_JOB_SECRET_FILE"
SECRET_HEX_VAR = "ACCORD_JOB_SECRET"
# Flags of a launch-host job that make no sense with one agent per node.
_HOST_FLAGS = (("-np", "num_proc"), ("-H/--hosts", "hosts"), ("--hostfile", "hostfile"), ("--ips", "ips"),
               ("--min-np", "min_np"), ("--max-np", "max_np"), ("--host-discovery-script", "host_discovery_script"),
               ("--num-servers", "num_servers"), ("--server-hosts", "server_hosts"), ("--sync-dst-dir", "sync_dst_dir"))


@dataclass(frozen=True)
class AgentSpec:
    """This node's agent: how many nodes, which one this is, where they meet, the secret."""

    min_nodes: int
    max_nodes: int
    node_rank: int | None  # None: given by the order the agents join in
    nproc: int
    endpoint_host: str
    endpoint_port: int
    secret: bytes
    authenticated: bool = True  # False with --no-job-secret (a secret anyone can derive)
    max_restarts: int = 0
    start_timeout: float = DEFAULT_START_TIMEOUT
    sources: dict[str, str] = field(default_factory=dict)  # value -> where it came from

    @property
    def endpoint(self) -> str:
        """``HOST:PORT`` as the user wrote it (IPv6 hosts in brackets)."""
        host = f"[{self.endpoint_host}]" if ":" in self.endpoint_host else self.endpoint_host
        return f"{host}:{self.endpoint_port}"

    @property
    def elastic(self) -> bool:
        """True with ``--nnodes MIN:MAX`` (MIN < MAX): nodes may leave and join the running job."""
        return self.min_nodes < self.max_nodes

    @property
    def nnodes_text(self) -> str:
        """``2`` or ``2:4``, as ``--nnodes`` takes it."""
        return str(self.min_nodes) if self.min_nodes == self.max_nodes else f"{self.min_nodes}:{self.max_nodes}"


def _in_srun(environ: Mapping[str, str]) -> bool:
    return bool(environ.get("SLURM_STEP_ID")) and bool(environ.get("SLURM_NODEID")) \
        and bool(environ.get("SLURM_NNODES") or environ.get("SLURM_JOB_NUM_NODES"))


def _hosts_given(ns: argparse.Namespace) -> bool:
    return any(getattr(ns, name, None) is not None for name in ("num_proc", "hosts", "hostfile", "ips"))


def agent_mode(ns: argparse.Namespace, environ: Mapping[str, str]) -> bool:
    """Whether this accordrun is one node's agent (see the module docstring)."""
    if any(getattr(ns, name, None) is not None for name in ("nnodes", "node_rank", "rdzv_endpoint")):
        return True
    if _hosts_given(ns):
        return False
    if environ.get("PET_NNODES"):
        return True
    return ns.nproc_per_node is not None and _in_srun(environ)


def parse_nnodes(text: str, where: str) -> tuple[int, int]:
    """``"2"`` -> (2, 2); ``"2:4"`` -> (2, 4).

    Raises:
        ConfigError: not ``N`` or ``MIN:MAX`` with 1 <= MIN <= MAX.
    """
    parts = text.strip().split(":")
    try:
        low, high = (int(parts[0]), int(parts[-1])) if len(parts) in (1, 2) else (0, -1)
    except ValueError:
        low, high = 0, -1
    if low < 1 or high < low:
        raise ConfigError(with_hint(f"{where} {text!r} is not a node count N or a range MIN:MAX with "
                                    "1 <= MIN <= MAX", f"pass e.g. {where.split('=')[0]} 2 or 2:4"))
    return low, high


def parse_endpoint(text: str, where: str, default_port: int = DEFAULT_PORT) -> tuple[str, int]:
    """``"host:29400"`` -> ("host", 29400); ``"[::1]:5"`` -> ("::1", 5); ``"host"`` gets ``default_port``.

    Raises:
        ConfigError: an empty host, a port that is not a number in 1..65535, or a bad host name.
    """
    text = text.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    else:
        host, port_text = text, ""
    try:
        port = int(port_text) if port_text else default_port
    except ValueError:
        port = -1
    if not host or not 1 <= port <= 65535:
        raise ConfigError(with_hint(f"{where} {text!r} is not HOST:PORT (a port in 1..65535)",
                                    "pass e.g. --rdzv-endpoint node0:29400 (the host of node rank 0)"))
    if ":" not in host:
        check_name(host, where)
    return host, port


def _first(candidates: list[tuple[str, str | None]]) -> tuple[str, str] | None:
    """The first (source, value) whose value is given."""
    return next(((src, val) for src, val in candidates if val not in (None, "")), None)  # type: ignore[misc]


def _endpoint(ns: argparse.Namespace, environ: Mapping[str, str]) -> tuple[str, str, int]:
    """(source, host, port) of the rendezvous endpoint."""
    if ns.rdzv_endpoint is not None:
        return ("--rdzv-endpoint", *parse_endpoint(ns.rdzv_endpoint, "--rdzv-endpoint"))
    if environ.get("PET_RDZV_ENDPOINT"):
        return ("PET_RDZV_ENDPOINT", *parse_endpoint(environ["PET_RDZV_ENDPOINT"], "PET_RDZV_ENDPOINT"))
    for addr, port in (("PET_MASTER_ADDR", "PET_MASTER_PORT"), ("MASTER_ADDR", "MASTER_PORT")):
        if environ.get(addr):
            default = int_variable(environ, port) or DEFAULT_PORT
            return (addr, *parse_endpoint(environ[addr], addr, default))
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if nodelist and _in_srun(environ):
        try:
            first = expand_nodelist(nodelist)[0]
        except (ValueError, IndexError) as exc:
            raise ConfigError(with_hint(f"SLURM_JOB_NODELIST={nodelist!r} cannot be read: {exc}",
                                        "pass --rdzv-endpoint HOST:PORT")) from None
        # the step's own port, as its workers' store would use: two jobs' agents sharing a
        # node must not both serve one fixed port
        default = int_variable(environ, "MASTER_PORT") or slurm_step_port(environ) or DEFAULT_PORT
        return "SLURM_JOB_NODELIST", first, default
    raise ConfigError(with_hint(
        "one agent per node needs the endpoint where the agents meet, and none was given",
        "pass --rdzv-endpoint HOST:PORT (the host of node rank 0) on every node, or set "
        "PET_MASTER_ADDR/PET_MASTER_PORT (PyTorchJob sets them) or MASTER_ADDR/MASTER_PORT"))


def _secret(ns: argparse.Namespace, environ: Mapping[str, str], endpoint: str) -> tuple[bytes, bool, str]:
    """(secret, authenticated, source)."""
    if ns.no_job_secret:
        if ns.secret_file is not None:
            raise ConfigError(with_hint("--no-job-secret and --secret-file both given",
                                        "pass only one of them (a secret file, on a shared network)"))
        # every agent derives the same bytes from the endpoint: nothing is authenticated
        return hashlib.sha256(b"accord-unauthenticated-job\0" + endpoint.encode()).digest(), False, "--no-job-secret"
    path_source = _first([("--secret-file", ns.secret_file), (SECRET_FILE_VAR, environ.get(SECRET_FILE_VAR))])
    if path_source is not None:
        source, path = path_source
        # a Kubernetes Secret volume's files are links into a timestamped folder: the file
        # checked and read is the one they lead to
        return read_secret_file(os.path.realpath(path), source), True, source
    if environ.get(SECRET_HEX_VAR):
        return secret_from_hex(environ[SECRET_HEX_VAR], SECRET_HEX_VAR), True, SECRET_HEX_VAR
    raise ConfigError(with_hint(
        "one agent per node needs the job's secret, the same on every node (it authenticates every "
        "message at the endpoint), and none was given",
        "make one (`python -c \"import secrets; print(secrets.token_hex(32))\" > secret; chmod 600 "
        "secret`) and give every node that file: --secret-file PATH or ACCORD_JOB_SECRET_FILE=PATH "
        "(Kubernetes: a Secret mounted as a volume, defaultMode 0400), or its hex in "
        "ACCORD_JOB_SECRET; or pass --no-job-secret on every node to run unauthenticated on a "
        "network you trust"))


def _check_no_host_flags(ns: argparse.Namespace) -> None:
    given = [flag for flag, name in _HOST_FLAGS if getattr(ns, name, None) not in (None, False)]
    if given:
        raise ConfigError(with_hint(
            f"{', '.join(given)} cannot be used with one agent per node (--nnodes/--node-rank/"
            "--rdzv-endpoint, or PET_*/SLURM_* variables): each agent starts only its own node's workers",
            "drop them and pass --nproc-per-node P on every node, or drop the agent flags to start "
            "every worker from this host"))


def agent_spec(ns: argparse.Namespace, environ: Mapping[str, str]) -> AgentSpec:
    """This node's :class:`AgentSpec` from the flags, else the cluster's variables.

    Raises:
        ConfigError: a value is missing or unusable, or a launch-host flag (-np, -H, ...) is
            given too; each with a HINT.
    """
    _check_no_host_flags(ns)
    sources: dict[str, str] = {}
    nodes = _first([("--nnodes", ns.nnodes), ("PET_NNODES", environ.get("PET_NNODES")),
                    ("SLURM_NNODES", (environ.get("SLURM_NNODES") or environ.get("SLURM_JOB_NUM_NODES"))
                     if _in_srun(environ) else None)])
    if nodes is None:
        raise ConfigError(with_hint("the number of nodes is not given",
                                    "pass --nnodes N (or MIN:MAX) on every node, or set PET_NNODES"))
    sources["nnodes"] = nodes[0]
    low, high = parse_nnodes(nodes[1], nodes[0])
    rank_given = _first([("--node-rank", None if ns.node_rank is None else str(ns.node_rank)),
                         ("PET_NODE_RANK", environ.get("PET_NODE_RANK")),
                         ("SLURM_NODEID", environ.get("SLURM_NODEID") if _in_srun(environ) else None)])
    node_rank = None
    if rank_given is not None:
        sources["node_rank"] = rank_given[0]
        try:
            node_rank = int(rank_given[1])
        except ValueError:
            node_rank = -1
        if not 0 <= node_rank < high:
            raise ConfigError(with_hint(f"{rank_given[0]} {rank_given[1]} is not a node rank of a job of "
                                        f"{nodes[1]} nodes ({nodes[0]})",
                                        f"node ranks run from 0 to {high - 1}: one per node"))
    nproc_given = _first([("--nproc-per-node", None if ns.nproc_per_node is None else str(ns.nproc_per_node)),
                          ("PET_NPROC_PER_NODE", environ.get("PET_NPROC_PER_NODE"))])
    nproc = 1
    if nproc_given is not None:
        sources["nproc_per_node"] = nproc_given[0]
        try:
            nproc = int(nproc_given[1])
        except ValueError:
            nproc = 0
        if nproc < 1:
            raise ConfigError(with_hint(f"{nproc_given[0]} {nproc_given[1]!r} is not a worker count >= 1",
                                        "pass --nproc-per-node P with P >= 1 (workers on each node)"))
    source, host, port = _endpoint(ns, environ)
    sources["endpoint"] = source
    endpoint = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    secret, authenticated, secret_source = _secret(ns, environ, endpoint)
    sources["secret"] = secret_source
    max_restarts = ns.max_restarts or 0
    if max_restarts < 0:
        raise ConfigError(with_hint(f"--max-restarts must be 0 or more, got {max_restarts}",
                                    "pass --max-restarts N (whole-job restarts after a failure)"))
    timeout = DEFAULT_START_TIMEOUT if ns.start_timeout is None else ns.start_timeout
    if timeout <= 0:
        raise ConfigError(with_hint(f"--start-timeout must be above 0, got {timeout:g}",
                                    "pass the seconds the agents may take to meet, e.g. --start-timeout 300"))
    return AgentSpec(min_nodes=low, max_nodes=high, node_rank=node_rank, nproc=nproc, endpoint_host=host,
                     endpoint_port=port, secret=secret, authenticated=authenticated, max_restarts=max_restarts,
                     start_timeout=timeout, sources=sources)
