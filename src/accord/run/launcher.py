"""Run one job: store, workers, output, and the first failure stops everything.

The sequence: start accord's rendezvous store with a fresh 32-byte secret, start the job's
:class:`~accord.run.supervisor.Supervisor` (and with it the guardian of :mod:`accord.run.local`), start every
worker through its host's runner (:mod:`accord.run.runners`: here, or through ssh), watch them. The first
worker that exits non-zero or dies by a signal stops the job: the others get SIGTERM, a grace period, then
SIGKILL of their whole process group; the launcher prints the root cause and exits with that worker's status.
With ``--min-np N`` (elastic jobs, ``hvd.elastic.run``) a failed worker is left out instead while at least N
workers are alive or have succeeded; the others re-form without it, and the job succeeds when they do.
SIGINT/SIGTERM/SIGHUP to the launcher stop the job the same way (the signal received is the one forwarded; a
second one skips the grace period).

With ``--num-servers N`` the launcher also starts N parameter servers before the workers, here
or spread over the worker hosts (:mod:`accord.run.servers`): same session handling, guardian,
ssh path and output multiplexing (``[serverN]``). With ``--sync-dst-dir DIR`` the working
directory is first copied to DIR on every host, and everything runs from there
(:mod:`accord.run.sync`). A server that ends while workers still run is a failure and the root cause;
once every worker has succeeded the servers get SIGTERM (a clean stop, not a failure) and the
exit code is the workers'. With ``--ps mxnet`` they are MXNet's own scheduler and servers
instead (:mod:`accord.run.mxnet_ps`), which ps-lite may end with status 0 as the workers finish.
"""
from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import time
import uuid
from types import FrameType
from typing import Any, BinaryIO, TextIO

from accord import config, worker_contract
from accord.errors import LaunchError, with_hint
from accord.run import job_store, mxnet_ps
from accord.run.assignment import Slot
from accord.run.elastic_driver import ElasticDriver
from accord.run.failures import (
    Failure,
    describe_returncode,
    exit_status,
    format_root_cause,
    pick_root_cause,
    signal_name,
)
from accord.run.hosts import is_local
from accord.run.launch_config import LaunchConfig, describe
from accord.run.output import OutputMux
from accord.run.runners import StartOptions
from accord.run.servers import ps_env, server_command, server_dirname, server_env, server_label
from accord.run.supervisor import Member, Supervisor
from accord.run.sync import sync_dirs
from accord.run.worker_env import JobEnv, elastic_env, omp_threads, worker_env

_POLL = 0.05
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def launch(cfg: LaunchConfig, console_out: BinaryIO | None = None, console_err: BinaryIO | None = None,
           log: TextIO | None = None) -> int:
    """Run the job described by ``cfg``; return the launcher's exit code.

    Raises:
        LaunchError: the store or a worker could not be started (nothing is left running).
    """
    return _Job(cfg, console_out or sys.stdout.buffer, console_err or sys.stderr.buffer,
                log or sys.stderr).run()


def _advertised_address(cfg: LaunchConfig) -> str:
    """The address remote workers use to reach this host."""
    if not cfg.remote:
        return "127.0.0.1"
    if cfg.interface_ip:
        return cfg.interface_ip
    remote = next((h for h in cfg.job_hosts if not is_local(h)), None)
    if remote is None:  # an elastic job on this host only, so far: the address of our name
        try:
            return socket.gethostbyname(socket.gethostname())
        except OSError:
            return socket.gethostname()
    try:  # the source address of the route towards a remote host; UDP connect sends nothing
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect((remote, 9))
            return sock.getsockname()[0]
    except OSError:
        return socket.gethostname()


class _Job:
    def __init__(self, cfg: LaunchConfig, out: BinaryIO, err: BinaryIO, log: TextIO) -> None:
        self.cfg = cfg
        self._out, self._err, self._log = out, err, log
        self._signals: list[int] = []
        self._stopped_servers: list[int] = []
        self._store: job_store.JobStore | None = None
        self._supervisor: Supervisor | None = None
        self._mux: OutputMux | None = None
        self._jobdir: str | None = None
        self._previous: dict[int, Any] = {}
        self._mxnet: mxnet_ps.MXNetJob | None = None
        self._options: StartOptions | None = None
        self._elastic_slots: dict[int, Slot] = {}

    # --- helpers -------------------------------------------------------------------------------
    def _say(self, text: str) -> None:
        self._log.write(f"accordrun: {text}\n")
        self._log.flush()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals.append(signum)

    @property
    def _workers(self) -> list[Member]:
        assert self._supervisor is not None
        return self._supervisor.of_kind("worker")

    @property
    def _servers(self) -> list[Member]:
        assert self._supervisor is not None
        return self._supervisor.of_kind("server", "scheduler")

    # --- the job -------------------------------------------------------------------------------
    def run(self) -> int:
        cfg = self.cfg
        if cfg.output_dir is not None:
            os.makedirs(cfg.output_dir, exist_ok=True)
        environ = config.snapshot()
        secret = secrets.token_bytes(32)
        job_id = uuid.uuid4().hex[:12]
        for sig in _FORWARDED:
            self._previous[sig] = signal.signal(sig, self._on_signal)
        try:
            job = self._prepare(job_id, secret)
            if cfg.sync_dst_dir is not None:
                self._sync(environ)
            self._mux = OutputMux(self._out, self._err, prefix=cfg.prefix, timestamps=cfg.prefix_timestamp,
                                  ranks_filter=cfg.ranks_filter, output_dir=cfg.output_dir)
            self._start_servers(job, environ)  # first: they register while workers start
            if cfg.elastic is not None:
                return self._run_elastic(job, environ)
            self._start_workers(job, environ)
            self._mux.start()
            return self._watch()
        finally:
            self._cleanup()

    def _prepare(self, job_id: str, secret: bytes) -> JobEnv:
        cfg = self.cfg
        address = _advertised_address(cfg)
        bind = "127.0.0.1" if not cfg.remote else (cfg.interface_ip or "0.0.0.0")
        rank0_local = is_local(cfg.slots[0].hostname)
        if cfg.master_port and rank0_local:
            job_store.check_port_free(cfg.master_port, "--master-port")
        master_port = cfg.master_port or job_store.free_port()
        master_addr = cfg.master_addr or (address if rank0_local else cfg.slots[0].hostname)
        self._store = job_store.start_store(bind, cfg.store_port, secret)
        if self._store is None and cfg.verbose:
            self._say("accord's rendezvous store is not available; workers get MASTER_ADDR/PORT only")
        self._jobdir = tempfile.mkdtemp(prefix=f"accord-{job_id}-")
        self._supervisor = Supervisor(cfg.grace_period)
        self._supervisor.guardian.remove_on_death(self._jobdir)  # even a SIGKILLed launcher leaves nothing
        self._options = StartOptions(cwd=cfg.cwd, worker_cwd=cfg.worker_cwd, grace=cfg.grace_period,
                                     ssh=cfg.ssh, secret_hex=secret.hex())
        if cfg.verbose:
            store = f"{address}:{self._store.port}" if self._store else "none"
            self._say(f"job {job_id}: {describe(cfg)}; store {store}; MASTER {master_addr}:{master_port}")
        return JobEnv(job_id=job_id, master_addr=master_addr, master_port=master_port,
                      store_addr=address if self._store else None,
                      store_port=self._store.port if self._store else None)

    def _sync(self, environ: dict[str, str]) -> None:
        cfg = self.cfg
        assert cfg.sync_dst_dir is not None
        hosts = [None if is_local(h) else h for h in cfg.job_hosts]
        if cfg.verbose:
            self._say(f"--sync-dst-dir: copying {cfg.cwd} to {cfg.sync_dst_dir} on "
                      f"{', '.join(h or 'this host' for h in dict.fromkeys(hosts))}")
        sync_dirs(cfg.cwd, list(dict.fromkeys(hosts)), cfg.sync_dst_dir, cfg.ssh, environ)

    def _start(self, kind: str, index: int, label: str | int, host: str, argv: Any,
               environ: dict[str, str], added: dict[str, str], error_file: str | None = None,
               dirname: str | None = None) -> Member:
        """Start one process through the supervisor and multiplex its output (files under
        ``dirname`` with --output-filename; workers: ``rank.N``)."""
        assert self._supervisor is not None and self._options is not None and self._mux is not None
        member = self._supervisor.start(kind, index, label, host, argv, environ, added, self._options,
                                        error_file)
        self._mux.add(label, member.proc.stdout, member.proc.stderr, dirname=dirname)
        return member

    def _start_workers(self, job: JobEnv, environ: dict[str, str]) -> None:
        cfg = self.cfg
        cpus = os.cpu_count() or 1
        if "OMP_NUM_THREADS" not in environ:
            local_size = max(s.local_size for s in cfg.slots)
            self._say(f"OMP_NUM_THREADS is not set: each worker gets max(1, {cpus} cores // "
                      f"{local_size} workers per host) = {omp_threads(cpus, local_size)} thread(s); "
                      f"set OMP_NUM_THREADS to choose")
        assert self._jobdir is not None
        for slot in cfg.slots:
            remote = not is_local(slot.hostname)
            err_path = None if remote else os.path.join(self._jobdir, f"rank.{slot.rank}.error.json")
            added = worker_env(slot, job, tuning=cfg.tuning, user_env=environ, cpu_count=cpus,
                               devices=cfg.devices, error_file=err_path)
            if cfg.num_servers and cfg.ps == "mxnet":
                added.update(mxnet_ps.node_env("worker", self._mxnet_job(job), environ))
            elif cfg.num_servers:
                added.update(ps_env("worker", job, cfg.num_servers, cfg.num_proc))
            try:
                self._start("worker", slot.rank, slot.rank, slot.hostname, cfg.command, environ, added,
                            err_path)
            except OSError as exc:
                what = "ssh" if remote else cfg.command[0]
                raise LaunchError(with_hint(f"could not start rank {slot.rank} on {slot.hostname} "
                                            f"({what}): {exc}",
                                            "check that the program exists and is executable")) from None

    def _run_elastic(self, job: JobEnv, environ: dict[str, str]) -> int:
        """Start the first workers and watch the job with the elastic driver (discovery)."""
        assert self._supervisor is not None and self._store is not None and self._mux is not None
        assert self.cfg.elastic is not None
        driver = ElasticDriver(self.cfg, self.cfg.elastic, self._supervisor, self._store.connection(),
                               lambda i, host, joining: self._start_elastic_worker(job, environ, i, host, joining),
                               self._failure, self._say)
        try:
            driver.start()
            self._mux.start()
            while not self._signals and not driver.poll():
                time.sleep(_POLL)
        finally:
            driver.close()
        out = driver.outcome
        if out.error:
            self._say(out.error)
        return self._finish(out.failures, out.lost, [], failed=bool(out.error))

    def _start_elastic_worker(self, job: JobEnv, environ: dict[str, str], member_id: int, host: str,
                              joining: bool) -> Member:
        """One worker of an elastic job: the first ones get their rank as id; the ones added later
        (``joining``) get a provisional place that their admission replaces."""
        cfg = self.cfg
        on_host = sum(1 for w in self._workers if w.host == host and w.returncode is None)
        if joining:
            slot = Slot(rank=member_id, size=member_id + 1, local_rank=on_host, local_size=on_host + 1,
                        cross_rank=0, cross_size=1, hostname=host, host_index=0)
        else:
            slot = cfg.slots[member_id]
        self._elastic_slots[member_id] = slot
        remote = not is_local(host)
        assert self._jobdir is not None
        err_path = None if remote else os.path.join(self._jobdir, f"rank.{member_id}.error.json")
        added = worker_env(slot, job, tuning=cfg.tuning, user_env=environ, cpu_count=os.cpu_count() or 1,
                           devices=cfg.devices, error_file=err_path)
        added.update(elastic_env(member_id, joining, cfg.min_np,
                                 cfg.elastic.elastic_timeout if cfg.elastic.elastic_timeout_given else None))
        try:
            return self._start("worker", member_id, member_id, host, cfg.command, environ, added, err_path)
        except OSError as exc:
            raise LaunchError(with_hint(f"could not start worker {member_id} on {host}: {exc}",
                                        "check that the program exists and is executable")) from None

    def _mxnet_job(self, job: JobEnv) -> mxnet_ps.MXNetJob:
        if self._mxnet is None:
            assert job.store_addr is not None or not self.cfg.remote
            self._mxnet = mxnet_ps.MXNetJob(
                root_uri=job.store_addr or "127.0.0.1", root_port=job_store.free_port(),
                num_workers=self.cfg.num_proc, num_servers=self.cfg.num_servers,
                local=not self.cfg.remote, interface=self.cfg.tuning.network_interface)
        return self._mxnet

    def _start_mxnet_nodes(self, job: JobEnv, environ: dict[str, str]) -> None:
        """MXNet's own scheduler and servers (--ps mxnet): the user's command in those roles."""
        mx_job = self._mxnet_job(job)
        for index, (label, role) in enumerate(mxnet_ps.roles(self.cfg.num_servers)):
            added = mxnet_ps.node_env(role, mx_job, environ)
            kind = "scheduler" if role == "scheduler" else "server"
            try:
                self._start(kind, index - 1 if role == "server" else 0, label, "localhost",
                            self.cfg.command, environ, added, dirname=label)
            except OSError as exc:
                raise LaunchError(with_hint(f"could not start MXNet's {label} ({self.cfg.command[0]}): "
                                            f"{exc}", "check that the program exists")) from None
        if self.cfg.verbose:
            self._say(f"started MXNet's scheduler on {mx_job.root_uri}:{mx_job.root_port} and "
                      f"{self.cfg.num_servers} servers (pids {[s.proc.pid for s in self._servers]})")

    def _start_servers(self, job: JobEnv, environ: dict[str, str]) -> None:
        cfg = self.cfg
        if cfg.ps == "mxnet":
            self._start_mxnet_nodes(job, environ)
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
                # server is SIGKILLed (by _cleanup, or by the guardian when the launcher is)
                added["ACCORD_KVSTORE_IPC_DIR"] = self._jobdir or ""
            try:
                self._start("server", index, server_label(index), host, server_command(), environ, added,
                            dirname=server_dirname(index))
            except OSError as exc:
                raise LaunchError(with_hint(
                    f"could not start parameter server {index} on {host} "
                    f"({'ssh' if remote else ' '.join(server_command())}): {exc}",
                    "check that accord is installed for this Python")) from None
        if self._servers and cfg.verbose:
            self._say(f"started {len(self._servers)} parameter servers (on "
                      f"{[s.host for s in self._servers]}); they register at the store "
                      f"{job.store_addr}:{job.store_port}")

    def _watch(self) -> int:
        cfg = self.cfg
        checkin = None
        if cfg.start_timeout is not None and self._store is not None:
            checkin = job_store.CheckinWatch(self._store, [s.rank for s in cfg.slots], cfg.start_timeout)
        failures: list[Failure] = []
        lost: list[Failure] = []  # elastic (--min-np): failed workers the job went on without
        missing: list[int] = []
        while True:
            if self._signals:
                break
            assert self._supervisor is not None
            for m in self._supervisor.reap():
                if m.kind == "worker":
                    if m.returncode != 0:
                        failure = self._failure(m)
                        if self._can_continue_without(m):
                            lost.append(failure)
                        else:
                            failures.extend(lost + [failure])  # the earliest is the root cause
                            lost = []
                # any end of a server, even status 0, is too early, except for MXNet's nodes,
                # which ps-lite ends as its workers finish
                elif m.returncode != 0 or cfg.ps != "mxnet":
                    failures.append(self._server_failure(m))
            if failures or all(w.returncode is not None for w in self._workers):
                break
            if checkin is not None:
                missing = checkin.poll()
                if missing:
                    break
            time.sleep(_POLL)
        return self._finish(failures, lost, missing)

    def _finish(self, failures: list[Failure], lost: list[Failure], missing: list[int],
                failed: bool = False) -> int:
        """Stop what still runs, report, and return the exit code (``failed``: an error the
        caller already reported)."""
        cfg = self.cfg
        stopped = self._stop_all(self._signals[0] if self._signals else signal.SIGTERM)
        assert self._mux is not None
        self._mux.close(timeout=2.0)
        if failures:
            for f in failures:
                key = self._label(f) if f.kind in ("server", "scheduler") else f.rank
                f.stderr_tail = self._mux.stderr_tail(key)[-20:]
            root = pick_root_cause(failures)
            others = [f for f in failures if f is not root]
            self._log.write(format_root_cause(root, others, stopped,
                                              stopped_servers=self._stopped_servers) + "\n")
            self._log.flush()
            return exit_status(root.returncode) or 1  # a server that ended with 0 still failed
        if self._signals:
            sig = self._signals[0]
            self._say(f"received {signal_name(sig)}; stopped ranks {stopped or 'none (all had ended)'}")
            return 128 + sig
        if failed:
            return 1
        if lost:
            left = sorted(w.index for w in self._workers if w.returncode == 0 and not w.stopped)
            who = "workers" if cfg.elastic is not None else "ranks"
            self._say(f"elastic: the job finished on {who} {left} (--min-np {cfg.min_np}) without "
                      + "; ".join(f"rank {f.rank} on {f.host} ({describe_returncode(f.returncode)})"
                                  for f in lost))
        if missing:
            hosts = sorted({cfg.slots[r].hostname for r in missing})
            self._say(with_hint(
                f"error: ranks {missing} (on {', '.join(hosts)}) did not check in at the rendezvous "
                f"within --start-timeout {cfg.start_timeout:g}s; stopped every worker",
                "look at those ranks' output above: a crash or hang before accord's init, a slow "
                "import, or a host that cannot reach the launcher; or raise --start-timeout",
            ))
            return 1
        return 0

    def _can_continue_without(self, failed: Member) -> bool:
        """Elastic jobs (--min-np) go on while enough workers are alive or have succeeded: the
        survivors re-form without the failed one (hvd.elastic.run)."""
        min_np = self.cfg.min_np
        if min_np is None:
            return False
        healthy = sum(1 for w in self._workers if w is not failed and w.returncode in (None, 0))
        if healthy < min_np:
            return False
        self._say(f"elastic: rank {failed.index} on {failed.host} ended "
                  f"({describe_returncode(failed.returncode or 0)}); continuing with {healthy} "
                  f"workers (--min-np {min_np})")
        return True

    def _failure(self, w: Member) -> Failure:
        assert w.returncode is not None
        error = worker_contract.read_error_file(w.error_file) if w.error_file else None
        slot = self._elastic_slots.get(w.index) if self.cfg.elastic else self.cfg.slots[w.index]
        return Failure(rank=w.index, host=w.host, pid=w.proc.pid, returncode=w.returncode,
                       error=error, local_rank=slot.local_rank if slot else 0, remote=w.remote)

    def _server_failure(self, s: Member) -> Failure:
        assert s.returncode is not None
        host = s.host if s.remote else socket.gethostname() if self.cfg.remote else "localhost"
        return Failure(rank=s.index, host=host, pid=s.proc.pid, returncode=s.returncode, kind=s.kind,
                       remote=s.remote)

    def _label(self, f: Failure) -> str:
        return next(s.label for s in self._servers if s.kind == f.kind and s.index == f.rank)

    def _stop_all(self, sig: int) -> list[int]:
        """Stop every worker's and server's process group; return the ranks that were still
        running (the servers still running go to ``_stopped_servers``)."""
        assert self._supervisor is not None
        running = [m for m in self._supervisor.members if m.proc.poll() is None]
        ranks = [m.index for m in running if m.kind == "worker"]
        self._stopped_servers = [m.index for m in running if m.kind == "server"]
        if ranks and self.cfg.verbose:
            self._say(f"stopping ranks {ranks} with {signal_name(sig)}")
        if self._stopped_servers and self.cfg.verbose:
            self._say(f"stopping parameter servers {self._stopped_servers} with {signal_name(sig)}")
        self._supervisor.stop(sig, skip_grace=lambda: len(self._signals) >= 2)
        unclean = [s.index for s in self._servers
                   if s.index in self._stopped_servers and s.proc.returncode not in (0, None)]
        if unclean and self.cfg.verbose:
            self._say(f"parameter servers {unclean} did not stop cleanly (killed after the grace period?)")
        return ranks

    def _cleanup(self) -> None:
        if self._supervisor is not None:
            self._supervisor.kill()  # after an exception mid-start: nothing may survive
        if self._mux is not None:
            self._mux.close(timeout=0.5)
        if self._supervisor is not None:
            self._supervisor.close()
        if self._store is not None:
            self._store.close()
        if self._jobdir is not None:
            shutil.rmtree(self._jobdir, ignore_errors=True)
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
