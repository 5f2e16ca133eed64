"""Checks of single accordrun flag values: numbers, ports and counts in range, flags that name
something (a file, an address) given empty, and ``--master-addr`` in a form no host has. Each
raises ConfigError with a HINT (exit 2)."""
from __future__ import annotations

import argparse
import re
import urllib.parse

from accord.errors import ConfigError, with_hint
from accord.network_interfaces import is_ip_address
from accord.run.spec.assignment import check_count
from accord.run.spec.hosts import PLAIN_INTEGER, is_host_name
from accord.run.spec.tuning import check_number

# The longest --grace-period: a stop waits this long between SIGTERM and SIGKILL, so a longer one
# would leave a hung worker (and its devices) held for more than an hour after its job failed;
# a much longer one overflows the timeouts it is added to.
MAX_GRACE_S = 3600.0


def grace_period(value: float | None, flag: str = "--grace-period") -> None:
    """Refuse a grace period outside 0..:data:`MAX_GRACE_S` seconds (or NaN, infinite)."""
    check_number(value, flag, ">=0")
    if value is not None and value > MAX_GRACE_S:
        raise ConfigError(with_hint(
            f"{flag} must be at most {MAX_GRACE_S:g} seconds (an hour between SIGTERM and SIGKILL), "
            f"got {value:g}",
            f"pass {flag} with the seconds a worker needs to stop cleanly, e.g. {flag} 10"))


def positive(value: float | None, flag: str, allow_zero: bool = False) -> None:
    """Refuse a number flag below 0 (or at 0 unless ``allow_zero``)."""
    check_number(value, flag, ">=0" if allow_zero else ">0")


def port(value: int | None, flag: str) -> int:
    """A port flag: 0 (a free port) when not given; refused outside 0..65535."""
    if value is None:
        return 0
    if not 0 <= value <= 65535:
        raise ConfigError(with_hint(f"{flag} must be between 0 and 65535, got {value}",
                                    f"pass {flag} 0 (or leave it out) for a free port"))
    return value


def count(text: str | None, flag: str) -> int:
    """A non-negative integer flag given as text (so that "two" and "-1" get a precise HINT)."""
    if text is None:
        return 0
    try:
        value = int(text.strip())
    except ValueError:
        value = -1
    if value < 0:
        raise ConfigError(with_hint(f"{flag} must be a whole number >= 0, got {text!r}",
                                    f"pass {flag} 0 (no servers, the default) or a count, e.g. {flag} 2"))
    check_count(value, flag)  # a placement list of that length is built next
    return value


# Flags whose value names something: an empty one (often an unset shell variable) is a mistake,
# not a request for the default, which leaving the flag out gives.
_NAMING_FLAGS = (("master_addr", "--master-addr"), ("network_interface", "--network-interface"),
                 ("output_filename", "--output-filename"), ("timeline_filename", "--timeline-filename"))


def no_empty_values(ns: argparse.Namespace) -> None:
    """Refuse a flag of :data:`_NAMING_FLAGS` given as an empty or blank value."""
    for dest, flag in _NAMING_FLAGS:
        value = getattr(ns, dest, None)
        if value is not None and not value.strip():
            raise ConfigError(with_hint(f"{flag} is empty, got {value!r}",
                                        f"pass {flag} with a value, or leave it out for the default"))


_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")  # tcp://, env://, http://
_PORT_SUFFIX = re.compile(r"^(?P<host>.+):(?P<port>[0-9]+)$")


def _url_as_flags(url: str) -> str:
    """``tcp://node1:29500`` -> ``--master-addr node1 --master-port 29500`` (for a HINT)."""
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port
    except ValueError:  # not a number: leave it out of the suggestion
        port = None
    return f"--master-addr {parts.hostname or 'HOST'}" + (f" --master-port {port}" if port else "")


def master_addr(value: str | None) -> str | None:
    """``--master-addr``: a host name or an IP address, else refused: env:// scripts would only
    fail later, on every rank, when torch.distributed resolves it. None (not given) stays None.

    A bracketed IPv6 address (``[fe80::1]``) is let through: scripts that build
    ``tcp://{MASTER_ADDR}:{MASTER_PORT}`` need the brackets."""
    flag = "--master-addr"
    bare = None if value is None else value.removeprefix("[").removesuffix("]")
    if value is None or is_ip_address(value) or is_ip_address(bare) or is_host_name(value):
        return value
    if any(c.isspace() for c in value):
        raise ConfigError(with_hint(f"{flag} {value!r} contains whitespace; a host name or IP address has none",
                                    f"pass {flag} with one host name or address, e.g. {flag} node1"))
    if _SCHEME.match(value):
        raise ConfigError(with_hint(
            f"{flag} {value!r} is a URL; {flag} is a host name or IP address (MASTER_ADDR)",
            f"drop the scheme: {_url_as_flags(value)}"))
    port = _PORT_SUFFIX.match(value)
    if port and (is_ip_address(port["host"].strip("[]")) or is_host_name(port["host"])):
        raise ConfigError(with_hint(
            f"{flag} {value!r} has a port ({port['port']}); {flag} is the host only",
            f"pass {flag} {port['host']} --master-port {port['port']}"))
    raise ConfigError(with_hint(f"{flag} {value!r} is not a host name or IP address",
                                f"pass {flag} with a name like node1 or node1.example.com, or an address "
                                "like 10.0.0.5 or fe80::1"))


def whole_number(text: str) -> int:
    """An argparse ``type`` for counts and ports: plain digits only (``int()`` would also take
    "+2", " 2", "1_0" or non-ASCII digits, so a typo like ``-np 1_0`` would start 10 workers)."""
    if not PLAIN_INTEGER.fullmatch(text):
        raise argparse.ArgumentTypeError(f"must be a whole number in plain digits, got {text!r}")
    return int(text)
