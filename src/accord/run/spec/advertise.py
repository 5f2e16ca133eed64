"""The address the launcher gives workers on other hosts to reach its store (and rank 0's
``MASTER_ADDR`` when rank 0 runs here).

Towards a known remote host: the source address of the route to it (a UDP ``connect`` sends
nothing). An elastic job whose hosts so far are all local (or none yet) has no remote host to
route to, but its discovery script may print one later: then this host's name's address, unless
that is a loopback address (Debian maps the hostname to 127.0.1.1), in which case the source
address of the default route. When even that is loopback (no network), the job still runs on
this host, and the launcher warns that later remote hosts could not reach it.
"""
from __future__ import annotations

import socket
from typing import Sequence

from accord.run.spec.hosts import is_local

# TEST-NET-1 (RFC 5737): never a real host; connecting a UDP socket there only consults the
# routing table, so its source address is the default route's.
_ANY_REMOTE = "192.0.2.1"


def advertised_address(job_hosts: Sequence[str], interface_ip: str | None) -> str:
    """The address remote workers use to reach this host (see the module doc)."""
    if interface_ip:
        return interface_ip
    remote = next((h for h in job_hosts if not is_local(h)), None)
    if remote is not None:
        return route_source(remote) or socket.gethostname()
    named = name_address()
    if named is not None and not named.startswith("127."):
        return named
    return route_source(_ANY_REMOTE) or named or socket.gethostname()


def is_loopback(address: str) -> bool:
    """True for 127.x.y.z and ``localhost``: an address no other host can use."""
    return address.startswith("127.") or address == "localhost"


def name_address() -> str | None:
    """The IPv4 address this host's name resolves to, or None."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return None


def route_source(host: str) -> str | None:
    """The source address of this host's route towards ``host``, or None without a route."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect((host, 9))
            address = sock.getsockname()[0]
    except OSError:
        return None
    return None if address in ("0.0.0.0", "") else address
