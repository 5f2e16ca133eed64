"""``LaunchConfig``: the command line, typed and validated once.

:func:`config_from_args` turns argparse's namespace into a frozen :class:`LaunchConfig` or
raises :class:`~accord.errors.ConfigError` (the CLI exits 2 and starts nothing). Everything
after this point trusts the config.
"""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, replace
from typing import Any, Mapping

from accord import config
from accord.config import DYNAMIC_TIMELINE
from accord.errors import ConfigError, with_hint
from accord.network_interfaces import interface_address
from accord.run.elastic import config as elastic_config
from accord.run.processes import exit_release
from accord.run.processes.ssh import SshOptions
from accord.run.settings import LauncherSettings
from accord.run.spec import flag_values, mpi_operator, program
from accord.run.spec import tuning as tuning_table
from accord.run.spec.assignment import Slot, assign_slots
from accord.run.spec.hosts import (
    HostSlots,
    is_local,
    parse_devices,
    parse_hostfile,
    parse_hosts,
    parse_ips,
    parse_rank_list,
)
from accord.run.spec.server_roles import server_placement
from accord.run.spec.tuning import Tuning
from accord.run.spec.worker_env import check_devices

LOG_LEVELS = tuple(config.LOG_LEVELS)
DEFAULT_GRACE = 5.0


@dataclass(frozen=True)
class LaunchConfig:
    """Everything the launcher needs, validated."""

    command: tuple[str, ...]
    num_proc: int  # workers started at once (elastic: 0 while the discovery script printed no host)
    hosts: tuple[HostSlots, ...]
    slots: tuple[Slot, ...]  # empty only for an elastic job whose script printed no host yet
    cwd: str
    devices: tuple[str, ...] | None = None
    start_timeout: float | None = None  # enforced check-in deadline (explicit flag only)
    grace_period: float = DEFAULT_GRACE
    ssh: SshOptions = SshOptions()
    output_dir: str | None = None
    prefix: bool = True
    prefix_timestamp: bool = False
    ranks_filter: frozenset[int] | None = None
    tuning: Any = Tuning()
    store_port: int = 0
    master_addr: str | None = None
    master_port: int = 0
    interface_ip: str | None = None
    verbose: bool = False
    num_servers: int = 0  # parameter servers (--num-servers)
    server_hosts: tuple[str, ...] = ()  # the host of each server (run.servers.server_placement)
    ps: str = "accord"  # whose parameter servers: accord's or MXNet's (--ps mxnet)
    min_np: int | None = None  # elastic: failed workers are left out while this many remain
    elastic: elastic_config.ElasticConfig | None = None  # the elastic driver's job (discovery, or -H with --min-np)
    sync_dst_dir: str | None = None  # --sync-dst-dir: workers and servers run from this copy
    exit_release: bool = True  # a Python script's globals are released before teardown (run.exit_release)

    @property
    def remote(self) -> bool:
        """True when some worker or server runs (or, with host discovery, may later run) on
        another host (through ssh): the store then listens beyond loopback. An elastic job on
        fixed hosts that are all this one (``-H localhost:2,127.0.0.1:2 --min-np 2``) never
        leaves it, so its store stays on loopback."""
        may_grow = self.elastic is not None and self.elastic.discovery_script is not None
        return may_grow or any(not is_local(h) for h in self.job_hosts)

    @property
    def job_hosts(self) -> tuple[str, ...]:
        """Every host that runs a worker or a server, in order, each once."""
        return tuple(dict.fromkeys([s.hostname for s in self.slots] + list(self.server_hosts)))

    @property
    def worker_command(self) -> tuple[str, ...]:
        """What a worker runs: the command, with a Python script's exit made orderly
        (:mod:`accord.run.processes.exit_release`) unless ``--no-exit-release``."""
        return exit_release.wrap(self.command) if self.exit_release else self.command

    @property
    def rank_dir_size(self) -> int:
        """The job size that --output-filename's ``rank.N`` folders are padded for
        (:func:`accord.run.processes.rank_files.rank_dirname`): the workers, or in an elastic job the most
        it may grow to, so that its folders keep one width: --max-np, else the most known at
        the start (the first workers, or -np while it waits for hosts)."""
        if self.elastic is None:
            return self.num_proc
        if self.elastic.max_np is not None:
            return self.elastic.max_np
        return max(self.num_proc, self.elastic.start_np or 0)

    @property
    def worker_cwd(self) -> str:
        """Where workers and servers run: the --sync-dst-dir copy, else the launcher's folder."""
        return self.sync_dst_dir or self.cwd


def _hosts(ns: argparse.Namespace, environ: Mapping[str, str]) -> list[HostSlots] | None:
    given = [flag for flag, value in (("-H/--hosts", ns.hosts), ("--hostfile", ns.hostfile), ("--ips", ns.ips))
             if value is not None]
    if len(given) > 1:
        raise ConfigError(with_hint(f"{' and '.join(given)} both name hosts", "use only one way of naming hosts"))
    _check_nproc_per_node(ns, given)
    if ns.hosts is not None:
        return parse_hosts(ns.hosts)
    if ns.hostfile is not None:
        return parse_hostfile(ns.hostfile)
    if ns.ips is not None:
        if ns.nproc_per_node is None:
            raise ConfigError(with_hint("--ips needs --nproc-per-node", "pass --ips a,b --nproc-per-node K"))
        return parse_ips(ns.ips, ns.nproc_per_node)
    if ns.nproc_per_node is not None:  # alone: this host's slots, as --ips gives each address
        return [HostSlots("localhost", ns.nproc_per_node)]
    operator = mpi_operator.default_hostfile(environ)
    if operator is not None and ns.host_discovery_script is None:  # an MPIJob's launcher pod
        return parse_hostfile(operator[1], operator[0])
    return None


def _check_nproc_per_node(ns: argparse.Namespace, given: list[str]) -> None:
    """--nproc-per-node is the slots of each --ips address, or alone of this host; -H, --hostfile
    and a discovery script give every host's slots themselves, so there it would be ignored."""
    if ns.nproc_per_node is None:
        return
    if ns.nproc_per_node < 1:
        raise ConfigError(with_hint(f"--nproc-per-node must be at least 1, got {ns.nproc_per_node}",
                                    "pass --nproc-per-node K with K >= 1"))
    others = [flag for flag in given if flag != "--ips"]
    if ns.host_discovery_script is not None:
        others.append("--host-discovery-script")
    if others:
        raise ConfigError(with_hint(
            f"--nproc-per-node {ns.nproc_per_node} cannot be used with {' and '.join(others)}, which give "
            "every host's slots themselves",
            f"drop --nproc-per-node and give the slots there (e.g. -H node1:{ns.nproc_per_node}), or "
            "use --ips a,b --nproc-per-node K"))


def _elastic(ns: argparse.Namespace, num_proc: int, hosts: list[HostSlots],
             elastic: elastic_config.ElasticConfig | None
             ) -> tuple[int | None, elastic_config.ElasticConfig | None]:
    """--min-np, validated with -np and --max-np (elastic: default -np; ``num_proc`` is then
    the number started, not -np, the fewest workers the job needs), and the elastic settings
    with -np as the slots to wait for at the start."""
    min_np = ns.min_np
    if elastic is None:
        elastic_config.check_counts(num_proc, min_np, ns.max_np)
        return min_np, None
    requested = ns.num_proc if ns.num_proc is not None else num_proc
    # Fixed hosts never gain slots: -np above theirs can never start. A discovery script may
    # print more hosts later: the driver waits for them.
    fixed = None if elastic.discovery_script else sum(h.slots for h in hosts)
    elastic_config.check_counts(requested, min_np if min_np is not None else requested, ns.max_np, fixed)
    min_np = min_np if min_np is not None else requested  # Horovod's default
    return min_np, replace(elastic, start_np=requested)


def _server_hosts(ns: argparse.Namespace, num_servers: int, slots: tuple[Slot, ...]) -> tuple[str, ...]:
    """The host of each server (--server-hosts, else spread over the worker hosts)."""
    chosen: list[str] = []
    if ns.server_hosts is not None:
        chosen = [h.hostname for h in parse_hosts(ns.server_hosts)]
        if num_servers == 0:
            raise ConfigError(with_hint("--server-hosts is given but --num-servers is 0",
                                        "add --num-servers N, or drop --server-hosts"))
    return tuple(server_placement(num_servers, chosen, [s.hostname for s in slots]))


def _sync_dir(ns: argparse.Namespace) -> str | None:
    if ns.sync_dst_dir is None:
        return None
    path = ns.sync_dst_dir.rstrip("/") or "/"
    if not os.path.isabs(path) or path == "/":
        raise ConfigError(with_hint(f"--sync-dst-dir must be an absolute folder other than /, got "
                                    f"{ns.sync_dst_dir!r}", "pass e.g. --sync-dst-dir /tmp/myjob"))
    # rsync hands the remote path to the remote shell, which ends it at a newline: the copy
    # would land elsewhere and the workers, started in DIR, would not find their program
    control = sorted({f"{ord(c):#04x}" for c in path if ord(c) < 0x20 or ord(c) == 0x7F})
    if control:
        raise ConfigError(with_hint(f"--sync-dst-dir {ns.sync_dst_dir!r} contains control characters "
                                    f"({', '.join(control)}: a newline, a tab, ...)",
                                    "pass a folder whose name has none, e.g. --sync-dst-dir /tmp/myjob"))
    return path


def _workers(ns: argparse.Namespace, given: list[HostSlots] | None,
             elastic: elastic_config.ElasticConfig | None, cwd: str | None
             ) -> tuple[list[HostSlots], int, tuple[Slot, ...]]:
    """Hosts, worker count and every worker's slot, from -np and the ``given`` hosts (-H,
    --hostfile, --ips) or, with a discovery script, its first answer. An elastic job starts on
    every slot up to --max-np, as horovodrun's (-np is then only the fewest it needs); a script
    that printed no host yet gives no host and no slot (the driver waits for -np slots)."""
    hosts = given
    if elastic is not None and elastic.discovery_script is not None:
        hosts = elastic_config.first_hosts(elastic, ns.num_proc, cwd)
    num_proc = ns.num_proc
    if elastic is not None:
        assert hosts is not None  # fixed elastic hosts are given ones
        if not hosts:
            return [], 0, ()
        total = sum(h.slots for h in hosts)
        num_proc = min(total, ns.max_np) if ns.max_np is not None else total
    if hosts is None:
        if num_proc is None:
            raise ConfigError(with_hint("the number of workers is not given",
                                        "pass -np N (and -H host:slots,... for several hosts)"))
        hosts = [HostSlots("localhost", max(num_proc, 1))]
    elif num_proc is None:
        num_proc = sum(h.slots for h in hosts)
    return hosts, num_proc, tuple(assign_slots(hosts, num_proc))


def _devices(ns: argparse.Namespace, slots: tuple[Slot, ...]) -> tuple[str, ...] | None:
    devices = parse_devices(ns.devices) if ns.devices is not None else None
    # No slot yet (an elastic job waiting for hosts): the elastic driver checks the first
    # workers' slots once the discovery script printed them, before it starts any.
    check_devices(devices, slots)
    return devices


def _ranks_filter(ns: argparse.Namespace, num_proc: int) -> frozenset[int] | None:
    ranks_filter = parse_rank_list(ns.ranks_filter, "--ranks-filter") if ns.ranks_filter is not None else None
    if ranks_filter is not None and max(ranks_filter) >= num_proc:
        raise ConfigError(with_hint(f"--ranks-filter names rank {max(ranks_filter)} but the job has {num_proc} ranks",
                                    f"use ranks 0..{num_proc - 1}"))
    return ranks_filter


def _ssh(ns: argparse.Namespace, environ: Mapping[str, str]) -> SshOptions:
    if ns.ssh_identity_file is not None and not os.path.isfile(ns.ssh_identity_file):
        raise ConfigError(with_hint(f"-i/--ssh-identity-file {ns.ssh_identity_file!r} does not exist",
                                    "pass the path of your private key, e.g. ~/.ssh/id_ed25519"))
    return SshOptions(port=flag_values.port(ns.ssh_port, "-p/--ssh-port") or None, identity_file=ns.ssh_identity_file,
                      strict_host_key_checking=ns.ssh_strict_host_key_checking,
                      rsh_agent=mpi_operator.rsh_agent(environ), extra_args=mpi_operator.rsh_args(environ))


def _interface(ns: argparse.Namespace, configured: str | None) -> tuple[str | None, str | None]:
    """The interface to bind and advertise (the flag's, else ``configured``), and its address."""
    interface = ns.network_interface or configured
    if interface is None:
        return None, None
    return interface, interface_address(interface)


def _servers(ns: argparse.Namespace, num_proc: int, slots: tuple[Slot, ...]) -> tuple[str, int, tuple[str, ...]]:
    """Whose servers (--ps), how many and on which hosts."""
    ps = getattr(ns, "ps", None) or "accord"
    num_servers = flag_values.count(ns.num_servers, "--num-servers")
    if ps == "mxnet":
        if ns.num_servers is None:
            num_servers = num_proc  # as MXNet's tools/launch.py: -s defaults to -n
        if num_servers < 1:
            raise ConfigError(with_hint("--ps mxnet needs at least one server, got --num-servers 0",
                                        "pass --num-servers 1 (or more), or leave it out for one per worker"))
    return ps, num_servers, _server_hosts(ns, num_servers, slots)


def _no_servers_when_elastic(ns: argparse.Namespace, elastic: elastic_config.ElasticConfig | None) -> None:
    """Refuse parameter servers in an elastic job run by the elastic driver: its workers come and
    go, while accord's servers and MXNet's ps-lite count a fixed number of workers (and the
    driver's workers are not told about servers at all)."""
    if elastic is None:
        return
    servers = [flag for flag, given in (("--ps mxnet", getattr(ns, "ps", None) == "mxnet"),
                                        (f"--num-servers {ns.num_servers}",
                                         flag_values.count(ns.num_servers, "--num-servers") > 0)) if given]
    if servers:
        kind = ("--host-discovery-script" if elastic.discovery_script else
                "--min-np with -H/--hostfile/--ips naming two or more hosts")
        raise ConfigError(with_hint(
            f"{' and '.join(servers)} cannot be used in an elastic job ({kind}): parameter servers "
            "serve a fixed number of workers, and an elastic job's workers change",
            f"drop {' and '.join(servers)} (hvd.elastic keeps the training state without servers), "
            "or run a fixed-size job (no --host-discovery-script, no --min-np)"))


def _tuning(ns: argparse.Namespace, configured_verbose: int, interface: str | None) -> Any:
    """The tuning table's options (:mod:`accord.run.spec.tuning`) from the flags."""
    log_level = ns.log_level.lower() if ns.log_level is not None else None
    if log_level is not None and log_level not in LOG_LEVELS:
        raise ConfigError(with_hint(f"--log-level {ns.log_level!r} is not a level",
                                    f"use one of {', '.join(LOG_LEVELS)}"))
    # a level: --verbose means at least 1; PS_VERBOSE=2 keeps its 2 for the servers
    verbose = max(1 if ns.verbose else 0, configured_verbose)
    given = {o.name: getattr(ns, o.name) for o in tuning_table.OPTIONS if o.cli}
    # DYNAMIC is Horovod's keyword (no file until hvd.start_timeline), not a file name
    if ns.timeline_filename and ns.timeline_filename != DYNAMIC_TIMELINE:
        given["timeline_filename"] = os.path.abspath(ns.timeline_filename)
    return tuning_table.make_tuning({**given, "log_level": log_level, "network_interface": interface,
                                     "verbose": verbose, "start_timeout": ns.start_timeout}, "accordrun")


def config_from_args(ns: argparse.Namespace, environ: Mapping[str, str], cwd: str | None = None) -> LaunchConfig:
    """Validate the parsed command line into a LaunchConfig.

    Args:
        environ: the launcher's environment (``config.snapshot()``), for DMLC_INTERFACE,
            PS_VERBOSE and PATH.

    Raises:
        ConfigError: anything unusable, with a HINT.
    """
    flag_values.no_empty_values(ns)
    workdir = cwd or os.getcwd()
    given = _hosts(ns, environ)
    elastic = elastic_config.elastic_from_args(ns, given)
    _no_servers_when_elastic(ns, elastic)  # before the discovery script's first run
    hosts, num_proc, slots = _workers(ns, given, elastic, cwd)
    min_np, elastic = _elastic(ns, num_proc, hosts, elastic)
    devices = _devices(ns, slots)
    # an elastic job that waits for -np slots starts with that many workers at least
    ranks_filter = _ranks_filter(ns, max(num_proc, elastic.start_np or 0) if elastic else num_proc)
    flag_values.grace_period(ns.grace_period)
    ssh = _ssh(ns, environ)
    launcher = LauncherSettings.from_environ(environ)
    interface, interface_ip = _interface(ns, launcher.interface)
    tuning = _tuning(ns, launcher.verbose, interface)
    ps, num_servers, server_hosts = _servers(ns, num_proc, slots)
    return LaunchConfig(
        # no slot yet (a discovery script that printed no host): the hosts to come may be remote,
        # where the command need not be on this host's PATH
        command=program.worker_command(ns, environ, bool(slots) and all(is_local(s.hostname) for s in slots), workdir),
        num_proc=num_proc,
        hosts=tuple(hosts),
        slots=slots,
        cwd=workdir,
        devices=devices,
        start_timeout=ns.start_timeout,
        grace_period=DEFAULT_GRACE if ns.grace_period is None else ns.grace_period,
        ssh=ssh,
        output_dir=os.path.abspath(ns.output_filename) if ns.output_filename else None,
        prefix=not ns.no_prefix,
        prefix_timestamp=ns.prefix_timestamp,
        ranks_filter=ranks_filter,
        tuning=tuning,
        store_port=flag_values.port(ns.store_port, "--store-port"),
        master_addr=flag_values.master_addr(ns.master_addr),
        master_port=flag_values.port(ns.master_port, "--master-port"),
        interface_ip=interface_ip,
        verbose=tuning.verbose > 0,
        num_servers=num_servers,
        server_hosts=server_hosts,
        min_np=min_np,
        elastic=elastic,
        ps=ps,
        sync_dst_dir=_sync_dir(ns),
        exit_release=not ns.no_exit_release,
    )


def describe(cfg: LaunchConfig) -> dict[str, Any]:
    """A loggable summary (never contains the secret: the config does not hold it)."""
    return {
        "command": list(cfg.command),
        # an elastic job: the workers it starts with, and the -np it needs first (waiting for
        # slots when its discovery script showed fewer)
        "np": cfg.num_proc,
        "start_np": cfg.elastic.start_np if cfg.elastic else None,
        "hosts": [f"{h.hostname}:{h.slots}" for h in cfg.hosts],
        "remote": cfg.remote,
        "grace_period": cfg.grace_period,
        "start_timeout": cfg.start_timeout,
        "num_servers": cfg.num_servers,
        "ps": cfg.ps,
        "server_hosts": list(cfg.server_hosts),
        "sync_dst_dir": cfg.sync_dst_dir,
        "exit_release": cfg.exit_release,
        "min_np": cfg.min_np,
        "host_discovery_script": cfg.elastic.discovery_script if cfg.elastic else None,
    }
