"""The job's store, hosted by the driver (the process that made the RayExecutor), as accordrun
and accord.spawn host theirs: a fresh secret per job, and the address the workers reach it at.

The store binds loopback when every worker runs on the driver's machine (a one-node cluster),
else the driver's Ray node address (the address Ray itself uses between nodes), or the
address of the interface named by ``nics`` (``ACCORD_INTERFACE``); an elastic job binds that
address from the start, since nodes that join later may be other machines. Every connection
is authenticated with the secret (SECURITY.md, "The rendezvous store").
"""
from __future__ import annotations

import secrets
import uuid
from typing import Any, Iterable

from accord.errors import LaunchError, with_hint
from accord.network_interfaces import interface_address
from accord.run.processes.job_store import JobStore, start_store

LOOPBACK = "127.0.0.1"


def bind_address(driver_ip: str, worker_ips: Iterable[str], elastic: bool, interface: str | None) -> str:
    """The address the store binds and the workers connect to (see the module doc)."""
    if interface:
        return interface_address(interface)
    if not elastic and all(ip == driver_ip for ip in worker_ips):
        return LOOPBACK
    return driver_ip


class HostedStore:
    """The store of one job started on the driver (``close()`` stops it)."""

    def __init__(self, address: str) -> None:
        self.secret = secrets.token_bytes(32)
        self.job_id = uuid.uuid4().hex[:12]
        self.address = address
        store = start_store(address, 0, self.secret)
        if store is None:
            raise LaunchError(with_hint("accord.ray needs accord's store server, which could not be imported",
                                        "reinstall accord: pip install --force-reinstall 'accord[ray]'"))
        self._store: JobStore | None = store
        self.port = store.port

    @property
    def secret_hex(self) -> str:
        return self.secret.hex()

    def connection(self) -> Any:
        """The driver's own authenticated connection to the store."""
        assert self._store is not None
        return self._store.connection()

    def close(self) -> None:
        """Stop the store (idempotent)."""
        if self._store is not None:
            self._store.close()
            self._store = None
