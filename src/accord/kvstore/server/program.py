"""Parameter-server processes: ``python -m accord.kvstore.server`` (no torch: starts in ~0.2 s).

A server reads its configuration from the environment (accord names, MXNet's accepted)::

    ACCORD_ROLE / DMLC_ROLE                 server (or scheduler, see below)
    ACCORD_NUM_WORKERS / DMLC_NUM_WORKER    workers in the job (default ACCORD_SIZE)
    ACCORD_PS_ROOT_URI/PORT (DMLC_PS_ROOT_URI/PORT), else ACCORD_STORE_ADDR/PORT
                                            the job's authenticated store, where servers register
    ACCORD_JOB_SECRET / ACCORD_SECRET_FILE  the per-job secret
    ACCORD_NODE_HOST / DMLC_NODE_HOST       address to advertise (multi-host runs)
    ACCORD_VERBOSE / PS_VERBOSE             1: log registration and connections to stderr;
                                            2: also every message (op, key, rank, bytes)
    ACCORD_SERVER_INDEX                     this server's index (accordrun sets it; default:
                                            the next value of a store counter)

It takes its index from ACCORD_SERVER_INDEX (else the next value of a store counter), listens on
a free TCP port (loopback when the store is on loopback, else every
interface: :mod:`accord.kvstore.directory`) and a Unix socket (ACCORD_KVSTORE_IPC), publishes
its address (:mod:`accord.kvstore.directory`: endpoints, a random token, its frame limit) under
``accord/kvstore/server/<index>`` (workers on the same host take the Unix socket), admits only
peers that prove they hold the job secret (:mod:`accord.kvstore.server.network`) and serves until a
``stop`` request, SIGTERM/SIGINT, or the store stops answering (the job is over), so no server
outlives its job. This module is that program: configuration, registration, signals and the
scheduler role.

``ACCORD_ROLE=scheduler`` runs the store itself on ACCORD_PS_ROOT_URI:ACCORD_PS_ROOT_PORT, for
jobs started MXNet-style (a scheduler, servers and workers started by another tool, e.g. MXNet's
``tools/launch.py``, with DMLC_* variables and ACCORD_JOB_SECRET). In such jobs rank 0's store
stops the servers when it closes (at exit at the latest), as MXNet's does, and the scheduler
exits once every server has stopped.

``accordrun --num-servers N`` starts N of these programs itself (:mod:`accord.run.spec.server_roles`;
the launcher does not import this module); :func:`accord.kvstore.cluster.start_servers` does it
for tests and :class:`~accord.kvstore.cluster.LocalCluster`.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import time

from accord.errors import ConfigError, RendezvousError, with_hint
from accord.kvstore import protocol
from accord.kvstore.directory import (
    SERVER_COUNTER,
    SERVER_KEY,
    STOPPED_KEY,
    server_addresses,
    store_address,
    store_bind,
)
from accord.kvstore.server.memory import raise_open_file_limit, retain_freed_memory
from accord.kvstore.server.network import ParameterServer
from accord.kvstore.settings import (
    NetworkSettings,
    ServerSettings,
    StoreLocation,
    process_role,
    server_count,
    verbosity,
)

log = logging.getLogger("accord.kvstore")


def _setup_logging(verbose: int, label: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"[{label}] %(message)s"))
    log.addHandler(handler)
    # level 2 also shows the core's per-request debug lines (e.g. each async push)
    log.setLevel(logging.WARNING if verbose <= 0 else logging.INFO if verbose == 1 else logging.DEBUG)
    log.propagate = False


def _run_scheduler(secret: bytes) -> int:
    from accord.store.server import StoreServer

    host, port = store_address(StoreLocation.from_config())
    servers = server_count()
    stopped = [STOPPED_KEY.format(index=i) for i in range(servers)]
    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(1))
    with StoreServer(host=store_bind(host, NetworkSettings.from_config()), port=port, secret=secret) as store:
        log.info("scheduler: store serving on %s:%d for %d servers", host, port, servers)
        # As ps-lite's scheduler, leave once the job is over: every server has stopped.
        while not stop and not (stopped and store.has_keys(stopped)):
            time.sleep(0.1)
    log.info("scheduler: stopping")
    return 0


def main() -> int:
    """Run a server (or the scheduler) from the environment; returns the exit code.

    0 after a stop request, SIGTERM/SIGINT, or once the job's store is gone; 2 when the
    configuration is unusable or the store cannot be reached at start.
    """
    verbose = verbosity()
    role = process_role()
    _setup_logging(verbose, f"accord-kvstore {role} pid {os.getpid()}")
    try:
        secret = protocol.load_secret()
        if role == "scheduler":
            return _run_scheduler(secret)
        if role != "server":
            raise ConfigError(with_hint(f"ACCORD_ROLE/DMLC_ROLE is {role!r}; this program runs "
                                        "parameter servers", "set DMLC_ROLE=server (or scheduler)"))
        settings = ServerSettings.from_config()
        if not settings.num_workers:
            raise ConfigError(with_hint("a parameter server needs the number of workers",
                                        "set ACCORD_NUM_WORKERS (or DMLC_NUM_WORKER)"))
        return _serve(secret, settings, verbose)
    except (ConfigError, RendezvousError, OSError) as exc:
        log.error("%s", exc)
        return 2


def _serve(secret: bytes, settings: ServerSettings, verbose: int) -> int:
    from accord.store.connection import StoreConnection

    workers = int(settings.num_workers or 0)

    if settings.payload_mac:
        protocol.require_payload_mac()  # fail at start, not at the first message
    retain_freed_memory()  # process wide, so here in the server process, not in ServerCore
    raise_open_file_limit()  # strangers' connections must not use up the descriptors
    host, port = store_address(StoreLocation.from_config())
    conn = StoreConnection(host, port, secret, timeout=settings.start_timeout)
    server = None
    try:
        index = settings.index
        server_id = int(index) if index is not None else conn.add(SERVER_COUNTER, 1) - 1
        bind, advertise = server_addresses(host, NetworkSettings.from_config())
        server = ParameterServer(secret, workers, server_id, verbose, settings.payload_mac,
                                 protocol.frame_limit(settings.chunk_elements))
        endpoint = server.bind(bind, advertise, ipc=settings.ipc, ipc_parent=settings.ipc_dir)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: server.request_stop())
        conn.set(SERVER_KEY.format(index=server_id), endpoint)
        log.info("server %d registered at %s for %d workers (store %s:%d)", server_id, endpoint,
                 workers, host, port)
        try:
            server.serve(conn.ping)  # the ping raises once the store (the job) is gone
            conn.set(STOPPED_KEY.format(index=server_id), b"1")  # lets a scheduler exit
        except RendezvousError:
            log.info("server %d: the job's store at %s:%d is gone; stopping", server_id, host, port)
        log.info("server %d stopped", server_id)
        return 0
    finally:
        if server is not None:
            server.close()
        conn.close()

