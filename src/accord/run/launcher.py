"""Run one job: store, workers, output, and the first failure stops everything.

The sequence: start accord's rendezvous store with a fresh 32-byte secret, start the job's
:class:`~accord.run.processes.supervisor.Supervisor` (and with it the guardian of
:mod:`accord.run.processes.guardian`), start every worker through its host's runner
(:mod:`accord.run.processes.runners`: here, or through ssh), watch them. The first
worker that exits non-zero or dies by a signal stops the job: the others get SIGTERM, a grace period, then
SIGKILL of their whole process group; the launcher prints the root cause and exits with that worker's status.
With ``--min-np N`` (elastic jobs, ``hvd.elastic.run``) a failed worker is left out instead while at least N
workers are alive or have succeeded; the others re-form without it, and the job succeeds when they do.
SIGINT/SIGTERM/SIGHUP to the launcher stop the job the same way (the signal received is the one forwarded; a
second one skips the grace period). What each process is (its command, environment, error file and output
label) is decided by :mod:`accord.run.job_start`; this module is the job's life: start-up, watching, stopping,
reporting and the exit code.

With ``--num-servers N`` the launcher also starts N parameter servers before the workers, here
or spread over the worker hosts (:mod:`accord.run.spec.server_roles`): same session handling, guardian,
ssh path and output multiplexing (``[serverN]``). With ``--sync-dst-dir DIR`` the working
directory is first copied to DIR on every host, and everything runs from there
(:mod:`accord.run.processes.folder_copy`; a host an elastic job grows onto is copied to before its first worker,
:mod:`accord.run.elastic.sync`). A server that ends while workers still run is a failure and the root cause;
once every worker has succeeded the servers get SIGTERM (a clean stop, not a failure) and the
exit code is the workers'. With ``--ps mxnet`` they are MXNet's own scheduler and servers
instead (:mod:`accord.run.spec.mxnet_roles`), which ps-lite may end with status 0 as the workers finish.
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
from accord.errors import ConfigError, with_hint
from accord.run.config.launch_config import LaunchConfig, describe
from accord.run.elastic.driver import ElasticDriver
from accord.run.elastic.sync import HostCopies
from accord.run.job_start import JobStarter
from accord.run.processes import job_store
from accord.run.processes.failures import (
    Failure,
    describe_returncode,
    exit_status,
    format_root_cause,
    not_answered,
    pick_root_cause,
    signal_name,
)
from accord.run.processes.folder_copy import FolderCopy
from accord.run.processes.output import OutputMux
from accord.run.processes.runners import StartOptions
from accord.run.processes.supervisor import Member, Supervisor
from accord.run.spec.advertise import advertised_address, is_loopback
from accord.run.spec.hosts import is_local
from accord.run.spec.worker_env import JobEnv

_POLL = 0.05
# When every failure seen so far was caused by a peer (see failures.PEER_CAUSED), how long the
# job keeps watching for that peer's own failure before stopping: the failing worker may still be
# running its exit handlers, and stopping it then would report the peer's error as the root cause.
_SETTLE_S = 3.0
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def launch(cfg: LaunchConfig, console_out: BinaryIO | None = None, console_err: BinaryIO | None = None,
           log: TextIO | None = None) -> int:
    """Run the job described by ``cfg``; return the launcher's exit code.

    Raises:
        LaunchError: the store or a worker could not be started (nothing is left running).
        ConfigError: the command line proved unusable before any worker started: the output
            folder cannot be made, or the hosts an elastic job waited for do not fit --gpus.
    """
    return _Job(cfg, console_out or sys.stdout.buffer, console_err or sys.stderr.buffer,
                log or sys.stderr).run()


def _make_output_dir(path: str) -> None:
    """Create --output-filename's folder, first of all: a path that cannot be one is the command
    line's error (exit 2, nothing started)."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        problem = f"--output-filename {path!r} cannot be created as a folder: {exc.strerror}"
        raise ConfigError(with_hint(problem, "pass a folder you can write to (made if missing), not a file")) from None


def _advertised_address(cfg: LaunchConfig) -> str:
    """The address remote workers use to reach this host (:mod:`accord.run.spec.advertise`)."""
    if not cfg.remote:
        return "127.0.0.1"
    return advertised_address(cfg.job_hosts, cfg.interface_ip)


class _Job:
    def __init__(self, cfg: LaunchConfig, out: BinaryIO, err: BinaryIO, log: TextIO) -> None:
        self.cfg = cfg
        self._out, self._err, self._log = out, err, log
        self._signals: list[int] = []
        self._stopped_servers: list[int] = []
        self._store: job_store.JobStore | None = None
        self._master_hold: job_store.ReservedPort | None = None
        self._supervisor: Supervisor | None = None
        self._mux: OutputMux | None = None
        self._jobdir: str | None = None
        self._previous: dict[int, Any] = {}
        self._options: StartOptions | None = None
        self._starter: JobStarter | None = None

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
            _make_output_dir(cfg.output_dir)
        environ = config.snapshot()
        secret = secrets.token_bytes(32)
        job_id = uuid.uuid4().hex[:12]
        for sig in _FORWARDED:
            self._previous[sig] = signal.signal(sig, self._on_signal)
        try:
            job = self._prepare(job_id, secret)
            if cfg.sync_dst_dir is not None and not self._sync(environ):
                sig = self._signals[0]
                self._say(f"received {signal_name(sig)} while copying --sync-dst-dir; nothing was started")
                return 128 + sig
            self._mux = OutputMux(self._out, self._err, prefix=cfg.prefix, timestamps=cfg.prefix_timestamp,
                                  ranks_filter=cfg.ranks_filter, output_dir=cfg.output_dir,
                                  size=cfg.rank_dir_size)
            assert self._supervisor is not None and self._options is not None and self._jobdir is not None
            self._starter = JobStarter(cfg, self._supervisor, self._options, self._mux, self._jobdir, self._say)
            self._starter.servers(job, environ)  # first: they register while workers start
            if cfg.elastic is not None:
                return self._run_elastic(job, environ)
            self._starter.workers(job, environ)
            self._mux.start()
            return self._watch()
        finally:
            self._cleanup()

    def _prepare(self, job_id: str, secret: bytes) -> JobEnv:
        cfg = self.cfg
        address = _advertised_address(cfg)
        if cfg.remote and is_loopback(address) and cfg.elastic is not None and cfg.elastic.discovery_script:
            self._say(with_hint(f"warning: workers on hosts the discovery script prints later would be told "
                                f"to reach this host at {address}, a loopback address",
                                "pass --network-interface NAME (the interface the other hosts reach this one on)"))
        # an elastic job is remote (cfg.remote) even before its script prints a host: a host
        # printed later, maybe another machine, must reach the store
        bind = "127.0.0.1" if not cfg.remote else (cfg.interface_ip or "0.0.0.0")
        # No slot yet (a discovery script that printed no host): rank 0's host is not known, so
        # MASTER_ADDR (for env:// scripts; accord's workers meet at the store) names this host.
        rank0 = cfg.slots[0].hostname if cfg.slots else "localhost"
        rank0_local = is_local(rank0)
        if rank0_local:
            self._master_hold = job_store.ReservedPort(cfg.master_port, "--master-port")
            master_port = self._master_hold.port
        else:
            master_port = cfg.master_port or job_store.free_port()
        master_addr = cfg.master_addr or (address if rank0_local else rank0)
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

    def _copier(self, environ: dict[str, str]) -> FolderCopy:
        assert self.cfg.sync_dst_dir is not None
        return FolderCopy(self.cfg.cwd, self.cfg.sync_dst_dir, self.cfg.ssh, environ)

    def _sync(self, environ: dict[str, str]) -> bool:
        """Copy the working folder to the first hosts; False when a signal cut the copies short."""
        cfg = self.cfg
        hosts = list(dict.fromkeys(None if is_local(h) else h for h in cfg.job_hosts))
        if not hosts:  # an elastic job whose script printed no host yet: copied as hosts come
            return True
        if cfg.verbose:
            self._say(f"--sync-dst-dir: copying {cfg.cwd} to {cfg.sync_dst_dir} on "
                      f"{', '.join(h or 'this host' for h in hosts)}")
        return self._copier(environ).run(hosts, stop_when=lambda: bool(self._signals))

    def _run_elastic(self, job: JobEnv, environ: dict[str, str]) -> int:
        """Start the first workers and watch the job with the elastic driver (discovery)."""
        assert self._supervisor is not None and self._store is not None and self._mux is not None
        assert self.cfg.elastic is not None and self._starter is not None
        starter = self._starter
        # hosts printed later get the --sync-dst-dir copy before their first worker; the first
        # ones got it in run()
        copies = HostCopies(self._copier(environ), self.cfg.job_hosts) if self.cfg.sync_dst_dir else None
        driver = ElasticDriver(self.cfg, self.cfg.elastic, self._supervisor, self._store.connection(),
                               lambda i, slot, joining: starter.elastic_worker(job, environ, i, slot, joining),
                               self._failure, self._say, copies=copies)
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
        return self._finish(out.failures, out.lost, [], failed=bool(out.error), finished=out.succeeded)

    def _watch(self) -> int:
        cfg = self.cfg
        checkin = None
        if cfg.start_timeout is not None and self._store is not None:
            checkin = job_store.CheckinWatch(self._store, [s.rank for s in cfg.slots], cfg.start_timeout)
        failures: list[Failure] = []
        lost: list[Failure] = []  # elastic (--min-np): failed workers the job went on without
        missing: list[int] = []
        settle_until: float | None = None
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
            if failures and settle_until is None:
                settle_until = time.monotonic() + _SETTLE_S
            if failures and (not all(f.peer_caused for f in failures) or time.monotonic() >= settle_until):
                break
            if all(w.returncode is not None for w in self._workers):
                break
            if checkin is not None:
                missing = checkin.poll()
                if missing:
                    break
            time.sleep(_POLL)
        return self._finish(failures, lost, missing)

    def _finish(self, failures: list[Failure], lost: list[Failure], missing: list[int],
                failed: bool = False, finished: list[int] | None = None) -> int:
        """Stop what still runs, report, and return the exit code (``failed``: an error the
        caller already reported; ``finished``: the elastic driver's workers that finished their
        training, not those that left the job with status 0 when their host was removed)."""
        cfg = self.cfg
        stopped = self._stop_all(self._signals[0] if self._signals else signal.SIGTERM)
        assert self._mux is not None
        self._mux.close(timeout=2.0)
        if failures:
            for f in failures:
                key = self._label(f) if f.kind in ("server", "scheduler") else f.rank
                f.stderr_tail = self._mux.stderr_tail(key)[-20:]
            first = pick_root_cause(failures)
            root, others = first, [f for f in failures if f is not first]
            # (elastic errors name ranks of a re-formed world, not the launcher's worker ids)
            silent = not_answered(failures, stopped) if cfg.elastic is None else {}
            if silent:  # a frozen rank: its peers' timeouts came first, but it is the cause
                rank, named_by = next(iter(silent.items()))
                root = self._silent_failure(rank, named_by)
                others = list(failures)
            self._log.write(format_root_cause(root, others, stopped,
                                              stopped_servers=self._stopped_servers) + "\n")
            self._log.flush()
            return exit_status(first.returncode) or 1  # a server that ended with 0 still failed
        if self._signals:
            sig = self._signals[0]
            if not self._workers:  # an elastic job still waiting for its first slots
                self._say(f"received {signal_name(sig)} before any worker started")
            else:
                self._say(f"received {signal_name(sig)}; stopped ranks {stopped or 'none (all had ended)'}")
            return 128 + sig
        if failed:
            return 1
        if lost:
            left = sorted(finished if finished is not None else
                          (w.index for w in self._workers if w.returncode == 0 and not w.stopped))
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
        assert self._starter is not None
        slot = self._starter.elastic_slots.get(w.index) if self.cfg.elastic else self.cfg.slots[w.index]
        return Failure(rank=w.index, host=w.host, pid=w.proc.pid, returncode=w.returncode,
                       error=error, local_rank=slot.local_rank if slot else 0, remote=w.remote)

    def _silent_failure(self, rank: int, named_by: tuple[int, ...]) -> Failure:
        """The report's entry for a worker that did not answer ``named_by`` and was stopped."""
        member = next(w for w in self._workers if w.index == rank)
        if member.returncode is None:  # the stop's wait gave up; SIGKILL was sent
            member.returncode = -signal.SIGKILL
        failure = self._failure(member)
        failure.silent_to = named_by
        assert self._mux is not None
        failure.stderr_tail = self._mux.stderr_tail(rank)[-20:]
        return failure

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
        if self._master_hold is not None:
            self._master_hold.release()
        if self._starter is not None:
            self._starter.close()
        if self._jobdir is not None:
            shutil.rmtree(self._jobdir, ignore_errors=True)
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
