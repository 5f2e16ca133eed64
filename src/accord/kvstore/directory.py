"""How parameter servers and workers find each other through the job's store: the keys, and
what a server publishes under them.

The store is at ACCORD_PS_ROOT_URI/PORT (MXNet's DMLC_PS_ROOT_URI/PORT), else the job's
ACCORD_STORE_ADDR/PORT (:func:`store_address`). Server ``i`` publishes what workers connect to
(:class:`Advertised`) under :data:`SERVER_KEY`, takes its index from :data:`SERVER_COUNTER`
when the launcher gave it none, and sets :data:`STOPPED_KEY` when it stops, so that a scheduler
knows the job is over. Which address a server binds and which it advertises follows from where
the store is (:func:`server_addresses`): loopback stays on loopback.

The value under ``accord/kvstore/server/<index>`` is ``|``-separated::

    tcp://host:port | ipc:///dir/server.sock | to=<token> | max=<bytes>

- ``tcp://`` is always there; ``ipc://`` when the server also listens on a Unix socket (a
  worker on the same host takes it only from a private directory of its own user, see
  :func:`usable_ipc`);
- ``to``: a random token drawn by each server process. Every request names it and every
  answer carries it back, under the MAC, so a message recorded for one server is refused by
  every other server, of this job or any later job with the same secret;
- ``max``: the largest payload frame the server accepts, so that a worker configured with larger
  chunks fails with a clear error before it sends one (the server would refuse the message).

Torch-free: servers and workers both use it.
"""
from __future__ import annotations

import os
import secrets
import socket
import stat
from dataclasses import dataclass

from accord.errors import ConfigError, with_hint
from accord.kvstore.settings import NetworkSettings, StoreLocation
from accord.network_interfaces import address_or_interface

__all__ = ["Advertised", "PREFIX", "SERVER_COUNTER", "SERVER_KEY", "STOPPED_KEY", "new_token", "server_addresses",
           "store_address", "store_bind", "usable_ipc"]

PREFIX = "accord/kvstore"
SERVER_KEY = PREFIX + "/server/{index}"
SERVER_COUNTER = PREFIX + "/server_count"
STOPPED_KEY = PREFIX + "/server/{index}/stopped"


def store_address(location: StoreLocation) -> tuple[str, int]:
    """Where servers register: ACCORD_PS_ROOT_URI/PORT, else ACCORD_STORE_ADDR/PORT (``location``).

    Raises:
        ConfigError: neither pair is set.
    """
    host, port = location.host, location.port
    if not host or not port:
        raise ConfigError(with_hint(
            "parameter servers need the job's store address, and neither ACCORD_PS_ROOT_URI/"
            "ACCORD_PS_ROOT_PORT (DMLC_PS_ROOT_URI/PORT) nor ACCORD_STORE_ADDR/PORT is set",
            "start the job with `accordrun --num-servers N`, or set DMLC_PS_ROOT_URI and "
            "DMLC_PS_ROOT_PORT to the scheduler's address"))
    return str(host), int(port)


def store_bind(store_host: str, network: NetworkSettings) -> str:
    """The address a scheduler binds to serve the store at ``store_host``: loopback for a
    loopback store, else ACCORD_INTERFACE's address, else every interface.

    Raises:
        ConfigError: ACCORD_INTERFACE names no usable interface.
    """
    return "127.0.0.1" if _is_loopback(store_host) else (_interface_bind(network.interface) or "0.0.0.0")


def server_addresses(store_host: str, network: NetworkSettings) -> tuple[str, str]:
    """(bind address, advertised address) for a server whose store is at ``store_host``.

    Multi-host: the named interface's address when there is one (nothing on 0.0.0.0), else
    every interface, advertising ACCORD_NODE_HOST or the source address of the route to the store.

    Raises:
        ConfigError: ACCORD_INTERFACE names no usable interface.
    """
    node = network.node_host
    if _is_loopback(store_host):
        return "127.0.0.1", node or "127.0.0.1"
    bind = _interface_bind(network.interface)
    if bind is not None:
        return bind, node or bind
    if node:
        return "0.0.0.0", node
    try:  # the source address of the route towards the store; UDP connect sends nothing
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect((store_host, 9))
            return "0.0.0.0", sock.getsockname()[0]
    except OSError:
        return "0.0.0.0", socket.gethostname()


def _is_loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


def _interface_bind(interface: str | None) -> str | None:
    """The address of ``interface`` (ACCORD_INTERFACE: --network-interface, DMLC_INTERFACE), or None if unset.

    Raises:
        ConfigError: the interface does not exist here or has no IPv4 address.
    """
    return address_or_interface(interface) if interface else None


# --- what a server publishes ---------------------------------------------------------------

def new_token() -> str:
    """A fresh server token (128 random bits, hex)."""
    return secrets.token_hex(16)


@dataclass(frozen=True)
class Advertised:
    """A server's published address: endpoints, token and frame limit."""

    tcp: str
    ipc: str | None = None
    to: str = ""
    max_frame: int | None = None

    def text(self) -> str:
        """The value to publish in the store."""
        parts = [self.tcp] + ([self.ipc] if self.ipc else [])
        parts += [f"to={self.to}"] if self.to else []
        parts += [f"max={self.max_frame}"] if self.max_frame is not None else []
        return "|".join(parts)

    @classmethod
    def parse(cls, text: str) -> "Advertised":
        """Read a published value (unknown fields are ignored)."""
        tcp, *rest = text.split("|")
        ipc, to, max_frame = None, "", None
        for part in rest:
            if part.startswith("ipc://"):
                ipc = part
            elif part.startswith("to="):
                to = part[3:]
            elif part.startswith("max=") and part[4:].isdigit():
                max_frame = int(part[4:])
        return cls(tcp, ipc, to, max_frame)


def usable_ipc(endpoint: str) -> bool:
    """True when ``ipc://path`` is a Unix socket on this host in a directory that this process's
    user owns and nobody else may enter (mode 0700, not a symlink): only then can no other user
    have put it there or be listening in its place."""
    path = endpoint[len("ipc://"):]
    try:
        parent = os.lstat(os.path.dirname(path) or ".")
        sock = os.lstat(path)
    except OSError:
        return False  # another host, or the server is gone: TCP it is
    return (stat.S_ISDIR(parent.st_mode) and parent.st_uid == os.geteuid()
            and stat.S_IMODE(parent.st_mode) == 0o700 and stat.S_ISSOCK(sock.st_mode)
            and sock.st_uid == os.geteuid())
