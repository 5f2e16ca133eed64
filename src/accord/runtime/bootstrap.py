"""Meet the other ranks: detect the launcher, reach a store, learn the topology, start c10d.

``bootstrap()`` does, in order:

1. detect the environment (:mod:`accord.runtime.environments`) and load the job secret
   (ACCORD_JOB_SECRET as hex, or ACCORD_SECRET_FILE, a file nobody but its owner may read);
2. reach a rendezvous store, depending on who started us:

   - accordrun / accord.spawn: connect to the launcher's authenticated store;
   - torchrun (or any env:// job): use torch's own TCPStore at MASTER_ADDR:MASTER_PORT as a
     client, exactly as ``init_process_group("env://")`` would (torchrun's agent hosts it; for
     plain env:// jobs rank 0 hosts it). That store is torch's and is not authenticated: accord
     adds no exposure beyond what torchrun already has, and the job secret is then agreed
     through it (first writer wins), so it is only as private as torchrun's store;
   - mpirun / SLURM without accordrun: rank 0 starts accord's store (loopback when the job
     runs on one host; else ACCORD_INTERFACE's address, or 0.0.0.0) and the others learn its
     address, port and a fresh secret through MPI (mpi4py, when importable under an MPI
     launcher), else from MASTER_ADDR/MASTER_PORT plus the secret from the environment;
   - nothing: one process with an in-memory store;

3. scope every key to this bootstrap's *generation* (a store counter: the n-th bootstrap of
   the job uses ``accord/g<n>``), so shutdown and a second bootstrap in the same processes work;
4. exchange host names (ACCORD_HOSTNAME overrides socket.gethostname()) under one key per rank;
   this is also the start barrier: ranks missing at the deadline are named in the error;
5. when every rank is on one host, pin Gloo and NCCL to the loopback interface
   (:meth:`Rendezvous.loopback_data_plane`), so the data plane listens on 127.0.0.1 only.

torch.distributed's default process group is left to the program (as Horovod leaves it): the
engine builds private groups on the store (:mod:`accord.comm.groups`), so a program may start
its own default group before or after, ``init_process_group("accord")`` included. A process group
backend that already met the ranks passes its store as ``given`` (rendezvous ``given-store``).
"""
from __future__ import annotations

import atexit
import logging
import socket
from dataclasses import dataclass, replace
from datetime import timedelta

import torch.distributed as dist

from accord import config, worker_contract
from accord.errors import RendezvousError, with_hint
from accord.logs import apply_log_level
from accord.runtime import environments as envs
from accord.runtime.rendezvous import Rendezvous, reach_store
from accord.runtime.settings import BootstrapSettings
from accord.runtime.topology import Topology, topology_from_hostnames
from accord.store.secret import read_secret_file, secret_from_hex

log = logging.getLogger("accord.runtime")

_active: "Runtime | None" = None


class Runtime:
    """The result of :func:`bootstrap`: where this rank is, and the job's store and secret.

    ``store`` is scoped to this bootstrap's generation (keys do not collide with an earlier or
    later bootstrap). ``close()`` closes the store client and any store server this rank hosts;
    it is idempotent. torch.distributed's default process group is the program's own: a runtime
    neither makes nor destroys it (the engine's groups are private, see :mod:`accord.comm.groups`).
    """

    def __init__(self, topology: Topology, rdv: Rendezvous, store: dist.Store,
                 environment: envs.JobEnvironment, close_timeout: float) -> None:
        self.topology = topology
        self.store = store
        self.secret = rdv.secret
        self.source = environment.source
        self.environment = environment
        self._rdv = rdv
        self._close_timeout = close_timeout
        self._closed = False

    @property
    def closed(self) -> bool:
        """True after close()."""
        return self._closed

    def close(self) -> None:
        """Leave the job: release the store (idempotent)."""
        global _active
        if self._closed:
            return
        self._closed = True
        if _active is self:
            _active = None
        atexit.unregister(self.close)
        self._rdv.leave(self.store, self.topology.rank, self.topology.size, self._close_timeout)

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        t = self.topology
        return (f"Runtime(source={self.source!r}, rank={t.rank}, size={t.size}, "
                f"local_rank={t.local_rank}, closed={self._closed})")


def active_runtime() -> Runtime | None:
    """The runtime of the last bootstrap in this process, unless closed."""
    return _active


def bootstrap(*, timeout: float | None = None, given: GivenGroup | None = None) -> Runtime:
    """Detect the environment and meet every rank.

    Args:
        timeout: seconds for every rank to reach the rendezvous (default ACCORD_START_TIMEOUT).
        given: the group torch.distributed already formed (``init_process_group("accord")``):
            its store, this rank and the world size. Under accordrun the job's authenticated
            store is used all the same (the rank and size must agree with the launcher's).

    Raises:
        RendezvousError: the store is unreachable or refuses us, or ranks are missing at the
            deadline (the message names them), or this process is already bootstrapped.
        ConfigError: the environment or the secret file is unusable.
    """
    global _active
    if _active is not None:
        raise RendezvousError(with_hint(
            f"accord is already bootstrapped in this process ({_active!r})",
            "call close() (hvd.shutdown()) before bootstrapping again"))
    _install_error_file()
    apply_log_level()
    environ = config.snapshot()
    env = envs.detect(environ)
    if given is not None:
        env = _with_given(env, given)
    settings = BootstrapSettings.from_config(start_timeout=timeout)
    start_timeout, collective_timeout = settings.start_timeout, settings.collective_timeout
    hostname = env.hostname or socket.gethostname()
    rdv = reach_store(env, load_secret(env), hostname, start_timeout,
                      max(start_timeout, collective_timeout), interface=settings.interface,
                      given=given.store if given is not None else None)
    try:
        generation = rdv.generation(env.size)
        store = dist.PrefixStore(f"{rdv.prefix}/g{generation}", rdv.store)
        hostnames = _exchange_hostnames(store, env, hostname, start_timeout)
        topology = topology_from_hostnames(env.rank, hostnames)
        _check_agrees(env, topology)
        if topology.local_size == topology.size:
            rdv.loopback_data_plane()  # one host: nothing of the data plane listens beyond it
        _check_default_group(env)
    except BaseException:
        rdv.leave(None, env.rank, env.size, 0.0)
        raise
    runtime = Runtime(topology, rdv, store, env, start_timeout)
    _active = runtime
    # Ranks that exit without shutdown() still leave cleanly (rank 0 may host the store).
    atexit.register(runtime.close)
    log.debug("bootstrapped %r", runtime)
    return runtime


def load_secret(env: envs.JobEnvironment) -> bytes | None:
    """The job secret from ACCORD_JOB_SECRET (hex) or ACCORD_SECRET_FILE, or None.

    Raises:
        ConfigError: the hex is invalid, or the file is missing, unreadable, empty, or readable
            or writable by group or others.
    """
    if env.secret_hex:
        return secret_from_hex(env.secret_hex, "ACCORD_JOB_SECRET")
    if not env.secret_file:
        return None
    return read_secret_file(env.secret_file)


def _exchange_hostnames(store: dist.Store, env: envs.JobEnvironment, hostname: str,
                        timeout: float) -> list[str]:
    """Publish this rank's host, wait for every rank's; name the missing ranks on timeout."""
    store.set(f"host/{env.rank}", hostname)
    keys = [f"host/{r}" for r in range(env.size)]
    try:
        store.wait(keys, timedelta(seconds=timeout))
    except RuntimeError as exc:  # RendezvousError, or torch's DistStoreError under torchrun
        try:
            missing = [r for r in range(env.size) if not store.check([keys[r]])]
        except RuntimeError:
            missing = []
        if not missing:
            raise
        present = sorted(set(range(env.size)) - set(missing))
        raise RendezvousError(with_hint(
            f"rank {env.rank}: {len(missing)} of {env.size} ranks did not reach the rendezvous "
            f"within {timeout:.1f}s: missing ranks {missing} (present: {present}; "
            f"environment {env.source})",
            "check that every rank was started and has not crashed (see the missing ranks' "
            "logs), that size/world size is right, or raise ACCORD_START_TIMEOUT")) from exc
    return [v.decode("utf-8", "replace") for v in store.multi_get(keys)]


def _check_agrees(env: envs.JobEnvironment, topology: Topology) -> None:
    given = {"local_rank": env.local_rank, "local_size": env.local_size,
             "cross_rank": env.cross_rank, "cross_size": env.cross_size}
    differ = {k: (v, getattr(topology, k)) for k, v in given.items()
              if v is not None and v != getattr(topology, k)}
    if differ:
        log.warning("rank %d: the %s environment's %s disagree with the host names exchanged at "
                    "init (environment, from host names); using the host names. Set "
                    "ACCORD_HOSTNAME per rank to control grouping.",
                    env.rank, env.source, differ)


@dataclass(frozen=True)
class GivenGroup:
    """A group torch.distributed formed before accord started: its store, this rank, the size."""

    store: dist.Store
    rank: int
    size: int


def _with_given(env: envs.JobEnvironment, given: GivenGroup) -> envs.JobEnvironment:
    """The environment of a job torch.distributed formed: its rank and size, and its store unless
    the job runs under accordrun (whose authenticated store serves it)."""
    if env.rendezvous == envs.ACCORD_STORE:
        if (env.rank, env.size) != (given.rank, given.size):
            raise RendezvousError(with_hint(
                f"init_process_group gave rank {given.rank} of {given.size}, but the launcher "
                f"(accordrun) started this process as rank {env.rank} of {env.size}",
                "pass rank and world_size as the launcher set them (or leave them out: env:// reads them)"))
        return env
    return replace(env, rank=given.rank, size=given.size, rendezvous=envs.GIVEN_STORE,
                               source=f"{env.source}+torch.distributed" if env.source != "single"
                               else "torch.distributed")


def _check_default_group(env: envs.JobEnvironment) -> None:
    """accord's groups are its own, but a default group the program started must be this job."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    if (dist.get_rank(), dist.get_world_size()) != (env.rank, env.size):
        raise RendezvousError(with_hint(
            f"torch.distributed is already initialised as rank {dist.get_rank()} of "
            f"{dist.get_world_size()}, but the {env.source} environment says rank {env.rank} "
            f"of {env.size}",
            "destroy that process group first, or start accord in the same job"))


def _install_error_file() -> None:
    """Let the launcher show this rank's traceback (see :mod:`accord.worker_contract`)."""
    worker_contract.install()

