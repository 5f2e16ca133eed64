"""How parameter servers and workers find each other through the job's store.

The store is at ACCORD_PS_ROOT_URI/PORT (MXNet's DMLC_PS_ROOT_URI/PORT), else the job's
ACCORD_STORE_ADDR/PORT (:func:`store_address`). Server ``i`` publishes what workers connect to
(:mod:`accord.kvstore.address`) under :data:`SERVER_KEY`, takes its index from
:data:`SERVER_COUNTER` when the launcher gave it none, and sets :data:`STOPPED_KEY` when it
stops, so that a scheduler knows the job is over. Which address a server binds and which it
advertises follows from where the store is (:func:`server_addresses`): loopback stays on
loopback. Torch-free: servers and workers both use it.
"""
from __future__ import annotations

import socket

from accord.errors import ConfigError, with_hint
from accord.kvstore.settings import NetworkSettings, StoreLocation
from accord.network_interfaces import address_or_interface

__all__ = ["PREFIX", "SERVER_COUNTER", "SERVER_KEY", "STOPPED_KEY", "server_addresses", "store_address",
           "store_bind"]

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
