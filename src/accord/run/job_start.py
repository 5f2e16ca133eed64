"""Starting a job's processes: what each worker, parameter server and MXNet node is.

For every process :class:`JobStarter` decides its command, its environment
(:mod:`accord.run.spec.worker_env`, :mod:`accord.run.spec.server_roles`, :mod:`accord.run.spec.mxnet_roles`), its error
file and its output label, starts it through the job's
:class:`~accord.run.processes.supervisor.Supervisor` and multiplexes its output. A process that cannot be
started is a :class:`~accord.errors.LaunchError` naming it and its host. When a process ends,
and what that means for the job, is the launcher's affair (:mod:`accord.run.launcher`).
"""
from __future__ import annotations

import os
from typing import Callable, Mapping, Sequence

from accord.errors import LaunchError, with_hint
from accord.network_interfaces import interface_address
from accord.run.config.launch_config import LaunchConfig
from accord.run.processes import job_store
from accord.run.processes.output import OutputMux
from accord.run.processes.runners import StartOptions
from accord.run.processes.supervisor import Member, Supervisor
from accord.run.spec import mxnet_roles as mxnet_ps
from accord.run.spec.assignment import Slot
from accord.run.spec.hosts import is_local
from accord.run.spec.server_roles import ps_env, server_dirname, server_env, server_label
from accord.run.spec.worker_env import ELASTIC_FLAG, JobEnv, elastic_env, omp_threads, pick_device, worker_env
from accord.worker_contract import server_command


class JobStarter:
    """Starts the processes of one job.

    Args:
        cfg: the job.
        supervisor: starts and owns every process.
        options: how runners start processes (directories, ssh, the job secret).
        mux: takes each process's output.
        jobdir: the job's private directory (error files, servers' sockets), removed with it.
        say: writes one line of the launcher's own output.
    """

    def __init__(self, cfg: LaunchConfig, supervisor: Supervisor, options: StartOptions, mux: OutputMux,
                 jobdir: str, say: Callable[[str], None]) -> None:
        self.cfg = cfg
        self._supervisor, self._options, self._mux = supervisor, options, mux
        self._jobdir = jobdir
        self._say = say
        self._mxnet: mxnet_ps.MXNetJob | None = None
        self._root_hold: job_store.ReservedPort | None = None  # the MXNet scheduler's port
        self.elastic_slots: dict[int, Slot] = {}  # an elastic job's workers, by id (failures name them)
        self._elastic_devices: dict[int, tuple[Member, str]] = {}  # with --gpus: each one's device

    def close(self) -> None:
        """Let go of what the job held beside its processes (the scheduler's port)."""
        if self._root_hold is not None:
            self._root_hold.release()
            self._root_hold = None

    def _start(self, kind: str, index: int, label: str | int, host: str, argv: Sequence[str],
               environ: Mapping[str, str], added: dict[str, str], error_file: str | None = None,
               dirname: str | None = None) -> Member:
        """Start one process through the supervisor and multiplex its output (files under
        ``dirname`` with --output-filename; workers: ``rank.N``)."""
        files = self._mux.open_files(label, dirname)  # a refused file starts nothing
        try:
            member = self._supervisor.start(kind, index, label, host, argv, environ, added, self._options,
                                            error_file)
        except BaseException:
            for f in files.values():
                f.close()
            raise
        self._mux.add(label, member.proc.stdout, member.proc.stderr, dirname=dirname, files=files)
        return member

    def _error_file(self, host: str, index: int) -> str | None:
        # Only a local worker's error file can be read back; a remote one's traceback reaches
        # the launcher through its output instead.
        return None if not is_local(host) else os.path.join(self._jobdir, f"rank.{index}.error.json")

    def workers(self, job: JobEnv, environ: dict[str, str]) -> None:
        """Start one worker per slot of ``cfg`` (a fixed-size job).

        Raises:
            LaunchError: a worker could not be started.
        """
        cfg = self.cfg
        cpus = os.cpu_count() or 1
        if "OMP_NUM_THREADS" not in environ:
            local_size = max(s.local_size for s in cfg.slots)
            self._say(f"OMP_NUM_THREADS is not set: each worker gets max(1, {cpus} cores // "
                      f"{local_size} workers per host) = {omp_threads(cpus, local_size)} thread(s); "
                      f"set OMP_NUM_THREADS to choose")
        for slot in cfg.slots:
            err_path = self._error_file(slot.hostname, slot.rank)
            added = worker_env(slot, job, tuning=cfg.tuning, user_env=environ, cpu_count=cpus,
                               devices=cfg.devices, error_file=err_path)
            if cfg.num_servers and cfg.ps == "mxnet":
                added.update(mxnet_ps.node_env("worker", self._mxnet_job(job, environ), environ,
                                                remote=not is_local(slot.hostname)))
            elif cfg.num_servers:
                added.update(ps_env("worker", job, cfg.num_servers, cfg.num_proc))
            if cfg.min_np is not None:
                added.update(ELASTIC_FLAG)
            try:
                self._start("worker", slot.rank, slot.rank, slot.hostname, cfg.worker_command, environ, added,
                            err_path)
            except OSError as exc:
                what = "ssh" if not is_local(slot.hostname) else cfg.command[0]
                raise LaunchError(with_hint(f"could not start rank {slot.rank} on {slot.hostname} "
                                            f"({what}): {exc}",
                                            "check that the program exists and is executable")) from None

    def elastic_worker(self, job: JobEnv, environ: dict[str, str], member_id: int, slot: Slot,
                       joining: bool) -> Member:
        """One worker of an elastic job, on ``slot.hostname`` with the coordinates of ``slot``:
        a first worker's slot (its rank is its id), or for one added later (``joining``) the
        place the elastic driver planned for it in the re-formed job, which its admission
        confirms (:mod:`accord.run.elastic.driver`).

        Raises:
            LaunchError: the worker could not be started.
        """
        cfg = self.cfg
        assert cfg.elastic is not None
        host = slot.hostname
        self.elastic_slots[member_id] = slot
        err_path = self._error_file(host, member_id)
        device = None if cfg.devices is None else pick_device(cfg.devices, self._devices_in_use(host),
                                                              slot.local_rank)
        added = worker_env(slot, job, tuning=cfg.tuning, user_env=environ, cpu_count=os.cpu_count() or 1,
                           devices=cfg.devices, error_file=err_path)
        if device is not None:  # a free device rather than its local rank's (see pick_device)
            added["CUDA_VISIBLE_DEVICES"] = device
        added.update(elastic_env(member_id, joining, cfg.min_np,
                                 cfg.elastic.elastic_timeout if cfg.elastic.elastic_timeout_given else None))
        try:
            member = self._start("worker", member_id, member_id, host, cfg.worker_command, environ, added,
                                 err_path)
        except OSError as exc:
            raise LaunchError(with_hint(f"could not start worker {member_id} on {host}: {exc}",
                                        "check that the program exists and is executable")) from None
        if device is not None:
            self._elastic_devices[member_id] = (member, device)
        return member

    def _devices_in_use(self, host: str) -> set[str]:
        """The --gpus devices held by running workers of an elastic job on ``host``: survivors
        keep theirs through re-formations, where local ranks move."""
        return {device for member, device in self._elastic_devices.values()
                if member.host == host and member.returncode is None}

    def servers(self, job: JobEnv, environ: dict[str, str]) -> None:
        """Start the parameter servers (``--num-servers``), or MXNet's scheduler and servers
        with ``--ps mxnet``; before the workers, so they register while the workers start.

        Raises:
            LaunchError: a server could not be started.
        """
        cfg = self.cfg
        if cfg.ps == "mxnet":
            self._mxnet_nodes(job, environ)
            return
        for index, host in enumerate(cfg.server_hosts):
            remote = not is_local(host)
            # multi-host: a server here advertises the address remote workers reach us at; one
            # on another host finds its own (the route to the store, or --network-interface)
            node_host = job.store_addr if cfg.remote and not remote else None
            added = server_env(index, job, cfg.num_servers, cfg.num_proc, tuning=cfg.tuning,
                               user_env=environ, node_host=node_host)
            if not remote:
                # its Unix socket's directory goes inside the job's, removed with it even when the
                # server is SIGKILLed (by the launcher's cleanup, or by the guardian when the launcher is)
                added["ACCORD_KVSTORE_IPC_DIR"] = self._jobdir
            try:
                self._start("server", index, server_label(index), host, server_command(), environ, added,
                            dirname=server_dirname(index))
            except OSError as exc:
                raise LaunchError(with_hint(
                    f"could not start parameter server {index} on {host} "
                    f"({'ssh' if remote else ' '.join(server_command())}): {exc}",
                    "check that accord is installed for this Python")) from None
        servers = self._supervisor.of_kind("server", "scheduler")
        if servers and cfg.verbose:
            self._say(f"started {len(servers)} parameter servers (on "
                      f"{[s.host for s in servers]}); they register at the store "
                      f"{job.store_addr}:{job.store_port}")

    def _mxnet_job(self, job: JobEnv, environ: Mapping[str, str]) -> mxnet_ps.MXNetJob:
        # One for the job: its scheduler's port is shared by the workers and the nodes.
        if self._mxnet is None:
            assert job.store_addr is not None or not self.cfg.remote
            interface = self.cfg.tuning.network_interface
            root_uri = job.store_addr or "127.0.0.1"
            user_interface = environ.get("DMLC_INTERFACE")
            if self.cfg.remote and interface is None and user_interface:
                # the user's DMLC_INTERFACE names the network of the job: the scheduler must be
                # reached on it, as every other node advertises its address there
                root_uri = interface_address(user_interface)
            # held until the job ends: the scheduler binds it once its process has started
            self._root_hold = job_store.ReservedPort(flag="DMLC_PS_ROOT_PORT")
            self._mxnet = mxnet_ps.MXNetJob(
                root_uri=root_uri, root_port=self._root_hold.port,
                num_workers=self.cfg.num_proc, num_servers=self.cfg.num_servers,
                local=not self.cfg.remote, interface=interface)
        return self._mxnet

    def _mxnet_nodes(self, job: JobEnv, environ: dict[str, str]) -> None:
        """MXNet's own scheduler (on the launch host) and servers (on ``cfg.server_hosts``, remote
        ones over ssh like remote workers) with ``--ps mxnet``: the user's command in those roles."""
        mx_job = self._mxnet_job(job, environ)
        for index, (label, role, host) in enumerate(mxnet_ps.nodes(self.cfg.server_hosts)):
            remote = not is_local(host)
            added = mxnet_ps.node_env(role, mx_job, environ, remote=remote)
            kind = "scheduler" if role == "scheduler" else "server"
            try:
                self._start(kind, index - 1 if role == "server" else 0, label, host,
                            self.cfg.command, environ, added, dirname=label)
            except OSError as exc:
                what = "ssh" if remote else self.cfg.command[0]
                raise LaunchError(with_hint(f"could not start MXNet's {label} on {host} ({what}): {exc}",
                                            "check that the program exists on that host")) from None
        if self.cfg.verbose:
            placed = [(s.label, s.host, s.proc.pid) for s in self._supervisor.of_kind("server", "scheduler")]
            self._say(f"started MXNet's scheduler on {mx_job.root_uri}:{mx_job.root_port} and "
                      f"{self.cfg.num_servers} servers ((label, host, pid): {placed})")
