"""Reach the job's store, whoever started us (the store half of :mod:`accord.runtime.bootstrap`).

:func:`reach_store` returns a :class:`Rendezvous`: the base store, the job secret, the key
prefix, and what this rank must release when it leaves. See bootstrap's docstring for which
store each launcher gets and why.

Leaving a store that lives inside rank 0 (mpirun/SLURM without accordrun, or a plain env:// job
whose rank 0 hosts torch's TCPStore) needs care: rank 0 must not close it while others still use
it, so every rank marks ``left/<rank>`` and the owner waits (bounded) for all marks before it
closes. When the store comes back on the same port at the next bootstrap (MASTER_PORT), the
others also wait until the old one is gone, so they never join the old store by mistake.
"""
from __future__ import annotations

import hashlib
import logging
import socket
import struct
import time
from dataclasses import dataclass, field
from datetime import timedelta

import torch.distributed as dist

from accord import config
from accord.errors import ConfigError, RendezvousError, with_hint
from accord.network_interfaces import address_or_interface, interface_address, is_ip_address
from accord.runtime import environments as envs
from accord.runtime.store_client import StoreClient
from accord.store import wire
from accord.store.server import StoreServer
from accord.worker_contract import CHECKIN_KEY

log = logging.getLogger("accord.runtime")
DEFAULT_PREFIX = "accord"  # keys of jobs bootstrapped on accord's own store (accordrun, spawn)


@dataclass
class Rendezvous:
    """A reached store and what leaving it involves."""

    store: dist.Store
    secret: bytes
    prefix: str = DEFAULT_PREFIX
    client: StoreClient | None = None
    server: StoreServer | None = None
    owner: bool = False  # this rank hosts the store
    in_rank0: bool = False  # the store lives in rank 0's process
    rebinds: bool = False  # the next bootstrap hosts it again on the same port
    restore_env: dict[str, str | None] = field(default_factory=dict)

    scope: str = ""  # this bootstrap's key prefix, set by generation()

    def generation(self, size: int) -> int:
        """Index of this bootstrap in the job: the n-th bootstrap of every rank gets n - 1.

        All ranks of one bootstrap add before any rank can start the next (the next needs every
        rank to have finished this one), so integer division by the size is exact.
        """
        generation = (int(self.store.add(_counter_key(self.prefix), 1)) - 1) // size
        self.scope = f"{self.prefix}/g{generation}"
        # the newest index in use, so that a job re-formed at another size starts past it
        # (see reserve_new_generation); every rank of the generation writes the same value
        self.store.set(_generation_key(self.prefix), str(generation))
        return generation

    def leave(self, scoped: dist.Store | None, rank: int, size: int, timeout: float) -> None:
        """Release the store; with ``scoped`` (the generation store), do the leaving protocol."""
        try:
            if scoped is not None and self.in_rank0 and size > 1:
                scoped.set(f"left/{rank}", b"1")
                if self.owner:
                    self._wait_for_others(scoped, size, timeout)
                elif self.rebinds:
                    try:  # returns (with an error) once rank 0 has closed the store
                        scoped.wait(["accord/never-set"], timedelta(seconds=timeout))
                    except RuntimeError:
                        pass
        except RuntimeError as exc:  # the store is already gone: nothing left to coordinate
            log.debug("leaving the store: %s", exc)
        finally:
            if self.client is not None:
                self.client.close()
            if self.server is not None:
                self.server.close()
            config.set_variables(self.restore_env)
            self.restore_env = {}

    def loopback_data_plane(self) -> None:
        """Every rank is on this host: make Gloo and NCCL listen on the loopback interface only
        (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME for the life of the runtime; left to itself,
        Gloo binds whatever the host name resolves to, often a LAN address). A variable the
        user set is respected (and logged); one this runtime set from ACCORD_INTERFACE is not."""
        lo = loopback_interface()
        if lo is None:
            log.warning("no network interface holds 127.0.0.1; Gloo keeps its own choice of address")
            return
        wanted = {"GLOO_SOCKET_IFNAME": lo, "NCCL_SOCKET_IFNAME": f"={lo}"}  # NCCL: '=' is exact
        environ = config.snapshot()
        changes = {}
        for name, value in wanted.items():
            if name in environ and name not in self.restore_env:
                log.info("single-host job: keeping %s=%s as set", name, environ[name])
                continue
            self.restore_env.setdefault(name, None)
            changes[name] = value
        config.set_variables(changes)

    def _wait_for_others(self, scoped: dist.Store, size: int, timeout: float) -> None:
        keys = [f"left/{r}" for r in range(size)]
        if self.server is None or self.client is None:  # torch's TCPStore, hosted here
            try:
                scoped.wait(keys, timedelta(seconds=timeout))
            except RuntimeError:
                log.warning("rank 0: not every rank left within %.0fs; closing the store", timeout)
            return
        full = [f"{self.scope}/{k}" for k in keys]
        deadline = time.monotonic() + timeout
        while not self.server.has_keys(full):
            # A rank that ended without close() (crash, plain exit) has dropped its
            # connections: once only ours remain, nobody else can still need the store.
            if self.server.connection_count <= self.client.connection_count:
                return
            if time.monotonic() > deadline:
                log.warning("rank 0: not every rank left within %.0fs; closing the store", timeout)
                return
            time.sleep(0.02)


def reach_store(env: envs.JobEnvironment, secret: bytes | None, hostname: str,
                timeout: float, op_timeout: float | None = None, *, interface: str | None,
                given: dist.Store | None = None) -> Rendezvous:
    """Connect to (or, on rank 0, start) the store this environment uses.

    ``given``: the store torch.distributed handed over (rendezvous ``given-store``): used as it
    is, the job secret agreed through it when none is set (the first rank to write wins).

    ``timeout`` bounds reaching the store; ``op_timeout`` (default ``timeout``) is how long a
    blocking request may wait afterwards (torch calls ``get`` when creating process groups).
    ``interface`` (ACCORD_INTERFACE, or None) is what a rank 0 that hosts a multi-host store
    binds, and what Gloo uses.

    Raises:
        RendezvousError: the store cannot be reached, or a secret or address is missing.
        ConfigError: ``interface`` names no interface of this host.
    """
    if env.rendezvous == envs.GIVEN_STORE:
        if given is None:
            raise ValueError("the given-store rendezvous needs the store torch handed over")
        rdv = Rendezvous(given, secret or _agreed_secret(given, "accord"))
    else:
        rdv = _reach(env, secret, hostname, _Reach(timeout, op_timeout or timeout, interface))
    if interface and not is_ip_address(interface) and "GLOO_SOCKET_IFNAME" not in config.snapshot():
        # Gloo reads its interface from this variable; set it for the life of the runtime.
        rdv.restore_env = {"GLOO_SOCKET_IFNAME": None}
        config.set_variables({"GLOO_SOCKET_IFNAME": interface})
    return rdv


@dataclass(frozen=True)
class _Reach:
    """How to reach the store: timeouts (seconds) and the interface a multi-host rank 0 binds."""

    connect: float
    ops: float
    interface: str | None

    def client(self, host: str, port: int, secret: bytes) -> StoreClient:
        return StoreClient(host, port, secret, self.ops, connect_timeout=self.connect)


def _reach(env: envs.JobEnvironment, secret: bytes | None, hostname: str,
           reach: _Reach) -> Rendezvous:
    if env.rendezvous == envs.NO_STORE:
        return Rendezvous(dist.HashStore(), secret or _new_secret())
    if env.rendezvous == envs.ACCORD_STORE:
        if secret is None:
            raise RendezvousError(with_hint(
                f"rank {env.rank}: ACCORD_STORE_ADDR/PORT are set but no job secret is",
                "set ACCORD_JOB_SECRET (hex) or ACCORD_SECRET_FILE as the launcher does; start "
                "workers with accordrun or accord.spawn"))
        client = reach.client(env.store_addr, env.store_port, secret)
        client.set(CHECKIN_KEY.format(rank=env.rank), hostname)
        return Rendezvous(client, secret, client=client)
    if env.rendezvous == envs.TORCH_STORE:
        return _torch_store(env, secret, reach)
    if env.is_mpi and _mpi4py_available():
        return _rank0_via_mpi(env, secret, hostname, reach)
    return _rank0_via_master(env, secret, reach)


def _torch_store(env: envs.JobEnvironment, secret: bytes | None,
                 reach: _Reach) -> Rendezvous:
    addr, port = _need_master(env)
    owner = env.rank == 0 and not env.agent_store
    try:
        store = dist.TCPStore(addr, port, env.size, owner, timedelta(seconds=reach.ops),
                              wait_for_workers=False, multi_tenant=True)
    except RuntimeError as exc:
        raise RendezvousError(with_hint(
            f"rank {env.rank}: could not reach torch's store at {addr}:{port}: {exc}",
            "check MASTER_ADDR/MASTER_PORT and that rank 0 (or torchrun's agent) is running"
        )) from None
    prefix = f"accord/r{env.restart_count}"
    secret = secret or _agreed_secret(store, prefix)
    return Rendezvous(store, secret, prefix, owner=owner, in_rank0=not env.agent_store)


def _agreed_secret(store: dist.Store, prefix: str) -> bytes:
    """One secret for every rank of a store that is not accord's: the first rank to write wins."""
    agreed = store.compare_set(f"{prefix}/secret", "", _new_secret().hex())
    return bytes.fromhex(agreed.decode() if isinstance(agreed, bytes) else agreed)


def _rank0_via_master(env: envs.JobEnvironment, secret: bytes | None,
                      reach: _Reach) -> Rendezvous:
    addr, port = _need_master(env)
    if secret is None and env.source == "slurm":
        raise RendezvousError(with_hint(
            f"rank {env.rank}: under srun without accordrun, rank 0 hosts the store at {addr}:{port} "
            "(the step's first node) and every rank needs the job secret, but none is set",
            "export ACCORD_JOB_SECRET=$(python -c 'import secrets; print(secrets.token_hex(32))') "
            "before srun (srun passes the environment to every task), or ACCORD_SECRET_FILE=PATH of a "
            "0600 file on the shared file system; or run one agent per node: srun --ntasks-per-node 1 "
            "accordrun --nproc-per-node P ..."))
    if secret is None:
        raise RendezvousError(with_hint(
            f"rank {env.rank}: under {env.source} without accordrun and without mpi4py, rank 0 "
            f"hosts the store at MASTER_ADDR:MASTER_PORT ({addr}:{port}) and every rank needs "
            "the job secret, but none is set",
            "set ACCORD_JOB_SECRET (the same hex on every rank) or ACCORD_SECRET_FILE (a 0600 "
            "file), or `pip install mpi4py` so rank 0 can send a fresh secret through MPI, or "
            "launch with accordrun"))
    single = env.single_host
    server = None
    if single:
        addr = "127.0.0.1"
    if env.rank == 0:
        bind = "127.0.0.1" if single else _bind_host(reach.interface)
        try:
            server = StoreServer(bind, port, secret).start()
        except RendezvousError as exc:
            reason = str(exc).splitlines()[0]  # the server's own hint is about ports in general
            raise RendezvousError(with_hint(
                f"rank 0 (under {env.source}) could not start the job's store: {reason}",
                f"set MASTER_PORT to a free port on {addr} for every rank (under srun: export it "
                "before srun), or launch with accordrun")) from None
    try:
        client = reach.client(addr, port, secret)
    except BaseException:
        if server is not None:
            server.close()
        raise
    return Rendezvous(client, secret, client=client, server=server, owner=env.rank == 0,
                      in_rank0=True, rebinds=True)


def _rank0_via_mpi(env: envs.JobEnvironment, secret: bytes | None, hostname: str,
                   reach: _Reach) -> Rendezvous:
    from accord.mpi_init import initialized_mpi

    MPI = initialized_mpi()  # noqa: N806 (mpi4py's module name)
    comm = MPI.COMM_WORLD
    if (comm.Get_rank(), comm.Get_size()) != (env.rank, env.size):
        raise RendezvousError(with_hint(
            f"MPI says rank {comm.Get_rank()} of {comm.Get_size()} but the {env.source} "
            f"environment says rank {env.rank} of {env.size}",
            "do not mix launchers: run the script directly under one mpirun"))
    single = env.single_host
    if single is None:
        single = _same_host(comm, MPI, hostname)
    server = None
    if env.rank == 0:
        try:
            bind = "127.0.0.1" if single else _bind_host(reach.interface)
            chosen = secret or _new_secret()
            server = StoreServer(bind, 0, chosen).start()
            advertise = "127.0.0.1" if single else (bind if bind != "0.0.0.0" else _this_host())
            payload = wire.encode([advertise, server.port, chosen])
        except Exception as exc:  # the others wait in Bcast: tell them why nothing comes
            payload = wire.encode([None, 0, f"{type(exc).__name__}: {exc}"])
            _bcast(comm, MPI, payload, 0)
            raise
    addr, port, third = wire.decode(_bcast(comm, MPI, payload if env.rank == 0 else b"", env.rank))
    if addr is None:
        raise RendezvousError(with_hint(f"rank 0 could not start the rendezvous store: {third}",
                                        "see rank 0's error"))
    try:
        client = reach.client(addr, port, third)
    except BaseException:
        if server is not None:
            server.close()
        raise
    return Rendezvous(client, third, client=client, server=server, owner=env.rank == 0,
                      in_rank0=True)


def _bcast(comm, MPI, payload: bytes, rank: int) -> bytes:
    # Raw bytes (Bcast on buffers), not mpi4py's pickle-based bcast.
    size = bytearray(struct.pack("!Q", len(payload)) if rank == 0 else 8)
    comm.Bcast([size, MPI.BYTE], root=0)
    data = bytearray(payload) if rank == 0 else bytearray(struct.unpack("!Q", size)[0])
    comm.Bcast([data, MPI.BYTE], root=0)
    return bytes(data)


def _same_host(comm, MPI, hostname: str) -> bool:
    digest = bytearray(hashlib.sha256(hostname.encode()).digest()[:16])
    every = bytearray(16 * comm.Get_size())
    comm.Allgather([digest, MPI.BYTE], [every, MPI.BYTE])
    return all(every[i:i + 16] == digest for i in range(0, len(every), 16))


def _need_master(env: envs.JobEnvironment) -> tuple[str, int]:
    if not env.store_addr or env.store_port is None:
        raise RendezvousError(with_hint(
            f"rank {env.rank}: the {env.source} environment gives no store address "
            f"(MASTER_ADDR={env.store_addr!r}, MASTER_PORT={env.store_port!r})",
            "set MASTER_ADDR and MASTER_PORT to rank 0's host and a free port on it, or launch "
            "with accordrun"))
    return env.store_addr, env.store_port


def _bind_host(interface: str | None) -> str:
    """Where a multi-host store listens: ``interface``'s address (ACCORD_INTERFACE), else every interface."""
    return address_or_interface(interface) if interface else "0.0.0.0"


def _this_host() -> str:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return socket.gethostname()


def loopback_interface() -> str | None:
    """The name of the interface that holds 127.0.0.1 (``lo`` on Linux), or None."""
    for _, name in socket.if_nameindex():
        try:
            if interface_address(name).startswith("127."):
                return name
        except ConfigError:
            continue
    return None


def _mpi4py_available() -> bool:
    try:
        import mpi4py  # noqa: F401  (importing the package does not initialise MPI)
    except ImportError:
        return False
    return True


def _new_secret() -> bytes:
    import secrets

    return secrets.token_bytes(32)


def _counter_key(prefix: str) -> str:
    return f"{prefix}/bootstraps"


def _generation_key(prefix: str) -> str:
    return f"{prefix}/generation"


def reserve_new_generation(store: dist.Store, size: int, prefix: str = DEFAULT_PREFIX) -> None:
    """Advance the bootstrap counter of ``store`` so that the next ``size`` ranks bootstrapping
    on it together get one generation index never used before (an elastic re-formation)."""
    count = int(store.add(_counter_key(prefix), 0))
    key = _generation_key(prefix)
    last = int(store.get(key)) if store.check([key]) else -1
    target = next_bootstrap_count(count, size, last)
    if target > count:
        store.add(_counter_key(prefix), target - count)


def next_bootstrap_count(count: int, size: int, last_generation: int) -> int:
    """Where the bootstrap counter must stand before ``size`` ranks bootstrap together, so that
    they get one generation index (counter // size) and a new one: past ``last_generation``.

    Rounding ``count`` up to a multiple of ``size`` alone is not enough when the size changes:
    2 ranks (counter 2, generation 0), then 4 (counter 8, generation 1), then 2 (counter 10,
    generation 4), then 3 rounded to 12 would bootstrap as generation 4 again, whose keys (the
    old ranks' Gloo addresses) are still in the store.
    """
    rounded = -(-count // size) * size
    return max(rounded, (last_generation + 1) * size)
