"""This host's network interfaces: the IPv4 address of one, by name (Linux ioctl, no external
tools). The launcher (``--network-interface``), the rendezvous (``ACCORD_INTERFACE``) and the
parameter servers (``DMLC_INTERFACE``) all resolve interfaces here, below every one of them."""
from __future__ import annotations

import ipaddress
import socket
import struct

from accord.errors import ConfigError, with_hint

_SIOCGIFADDR = 0x8915


def interface_names() -> list[str]:
    """The names of this host's network interfaces (``lo``, ``eth0``...)."""
    return [name for _, name in socket.if_nameindex()]


def interface_address(name: str) -> str:
    """The IPv4 address of network interface ``name``.

    Raises:
        ConfigError: no interface of that name here, or it has no IPv4 address.
    """
    known = interface_names()
    if name not in known:
        raise ConfigError(with_hint(f"network interface {name!r} not found; this host has {known}",
                                    "pass --network-interface (or ACCORD_INTERFACE) with one of the "
                                    "names listed"))
    try:
        import fcntl

        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            packed = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
    except (OSError, ImportError) as exc:
        raise ConfigError(with_hint(f"network interface {name!r} has no IPv4 address: {exc}",
                                    f"pick an interface that is up and has an address: {known}")) from None
    return socket.inet_ntoa(packed[20:24])


def address_or_interface(text: str) -> str:
    """``text`` itself when it is an IP address, else the IPv4 address of the interface it names
    (ACCORD_INTERFACE and DMLC_INTERFACE may hold either).

    Raises:
        ConfigError: neither an address nor an interface with an IPv4 address.
    """
    return str(ipaddress.ip_address(text)) if is_ip_address(text) else interface_address(text)


def is_ip_address(text: str) -> bool:
    """Whether ``text`` is an IPv4 or IPv6 address (not an interface name)."""
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True
