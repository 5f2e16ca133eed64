"""Host lists: ``-H h1:2,h2:4``, hostfiles (MPI and MXNet formats), ``--ips``, local names.

Pure functions (no processes, no DNS; only hostfiles are read, bounded): the launcher turns
every way of naming hosts into one ordered list of :class:`HostSlots`. A host named twice gets
the sum of its slots, in the order it first appeared (``mpirun -H a,a`` means two slots on ``a``).
"""
from __future__ import annotations

import ipaddress
import os
import re
import socket
import stat
from dataclasses import dataclass
from typing import Iterable, Sequence

from accord.errors import ConfigError, with_hint
from accord.network_interfaces import interface_address

# Host names and IPv4 addresses; IPv6 literals must be bracketed: "[fe80::1]:2".
_NAME = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9._-]*[A-Za-z0-9_])?$")
_BRACKETED = re.compile(r"^\[([0-9A-Fa-f:.%a-zA-Z]+)\]$")
# A count as written: ASCII digits (int() also takes "+2", " 2", "1_0", non-ASCII digits); a
# minus sign is let through to each count's "at least" message. Also used by flag_values.
PLAIN_INTEGER = re.compile(r"-?[0-9]+")
# A hostfile larger than this is refused before it is read whole: 1 MiB holds tens of thousands
# of host lines, far more than any job has.
MAX_HOSTFILE_BYTES = 1 << 20
LOCAL_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "localhost.localdomain", "ip6-localhost"})


@dataclass(frozen=True)
class HostSlots:
    """A host and how many workers it may run."""

    hostname: str
    slots: int


def check_name(name: str, where: str) -> str:
    """The host a name as written means (``[fe80::1]`` -> ``fe80::1``), as ``-H`` takes it.

    Raises:
        ConfigError: not a host name, an IPv4 address or a bracketed IPv6 address.
    """
    match = _BRACKETED.match(name)
    if match:
        return match.group(1)
    if ":" in name:
        raise ConfigError(with_hint(
            f"{where}: {name!r} is not a host name (IPv6 addresses need brackets)",
            "write IPv6 addresses as [addr] or [addr]:slots, e.g. -H [fe80::1]:2",
        ))
    if not _NAME.match(name):
        raise ConfigError(with_hint(
            f"{where}: {name!r} is not a valid host name",
            "use names like node1, node1.example.com or 10.0.0.5",
        ))
    return name


def is_host_name(text: str) -> bool:
    """True for a host name or IPv4 address as ``-H`` takes them (no port, no brackets)."""
    return _NAME.fullmatch(text) is not None


def _check_slots(text: str, host: str, where: str) -> int:
    """A slot count of plain digits (int() alone would also take "+2", " 2", "1_0", "٢")."""
    if not PLAIN_INTEGER.fullmatch(text):
        raise ConfigError(with_hint(
            f"{where}: slots for {host!r} must be an integer in plain digits, got {text!r}",
            f"write {host}:N (or '{host} slots=N' in a hostfile) with N the number of workers that "
            "host may run, without a sign or spaces",
        ))
    slots = int(text)
    if slots <= 0:
        raise ConfigError(with_hint(
            f"{where}: host {host!r} has {slots} slots; every host needs at least 1",
            f"remove {host} from the host list or give it a positive slot count",
        ))
    return slots


def split_host_item(item: str, where: str) -> tuple[str, str | None]:
    """``host``, ``host:N``, ``[v6]``, ``[v6]:N`` -> (the name as written, the slot count's text
    or None), for every parser of host lists (``-H``, hostfiles, discovery scripts, MXNet's
    hostfiles), so that they read the same items alike. A bare IPv6 address (several colons)
    is returned whole, for :func:`check_name` to refuse.

    Raises:
        ConfigError: an unclosed bracket, or something after it that is not ``:N``.
    """
    if item.startswith("["):
        close = item.find("]")
        if close < 0:
            raise ConfigError(with_hint(f"{where}: unclosed bracket in {item!r}",
                                        "write IPv6 hosts as [addr]:slots"))
        name, rest = item[: close + 1], item[close + 1:]
        if rest and not rest.startswith(":"):
            raise ConfigError(with_hint(f"{where}: cannot read {item!r}", "write [addr]:slots"))
        return name, (rest[1:] if rest else None)
    if item.count(":") == 1:
        name, slots_text = item.split(":")
        return name, slots_text
    return item, None


def is_plain_count(text: str) -> bool:
    """True for a count written in plain ASCII digits (a leading minus let through, for the
    caller's "at least" message): the rule of every slot count (:data:`PLAIN_INTEGER`)."""
    return PLAIN_INTEGER.fullmatch(text) is not None


def _split_host_slots(item: str, where: str) -> HostSlots:
    """``host``, ``host:N``, ``[v6]``, ``[v6]:N`` -> HostSlots (bare host: 1 slot)."""
    name, slots_text = split_host_item(item, where)
    host = check_name(name, where)
    slots = 1 if slots_text is None else _check_slots(slots_text, host, where)
    return HostSlots(host, slots)


def merge_hosts(hosts: Iterable[HostSlots]) -> list[HostSlots]:
    """Sum the slots of repeated hosts, keeping first-appearance order."""
    totals: dict[str, int] = {}
    for h in hosts:
        totals[h.hostname] = totals.get(h.hostname, 0) + h.slots
    return [HostSlots(name, slots) for name, slots in totals.items()]


def parse_hosts(text: str) -> list[HostSlots]:
    """Parse ``-H``: comma-separated ``host[:slots]`` (bare host = 1 slot).

    Example: ``parse_hosts("a:2,b")`` -> ``[HostSlots("a", 2), HostSlots("b", 1)]``.

    Raises:
        ConfigError: empty list, bad name, or a slot count that is not a positive integer.
    """
    items = [part.strip() for part in text.split(",")]
    if not text.strip() or any(not item for item in items):
        raise ConfigError(with_hint(
            f"-H/--hosts: cannot read host list {text!r} (empty entry)",
            "write hosts as host1:2,host2:4 (host:slots, comma separated, no spaces)",
        ))
    return merge_hosts(_split_host_slots(item, "-H/--hosts") for item in items)


def parse_hostfile_text(text: str, source: str = "hostfile") -> list[HostSlots]:
    """Parse hostfile lines: ``host slots=N [max_slots=M]``, ``host:N`` or bare ``host``.

    ``#`` starts a comment; blank lines are skipped; ``max_slots`` is accepted and ignored.

    Raises:
        ConfigError: a line that fits none of the formats, naming the file and line number.
    """
    hosts: list[HostSlots] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source}:{number}"
        first, *rest = line.split()
        if not rest:
            hosts.append(_split_host_slots(first, where))
            continue
        if ":" in first and not first.startswith("["):
            raise ConfigError(with_hint(f"{where}: cannot read {raw.strip()!r}",
                                        "use either 'host slots=N' or 'host:N', not both"))
        host = check_name(first, where)
        slots = 1
        for token in rest:
            key, sep, value = token.partition("=")
            if sep and key == "slots":
                slots = _check_slots(value, host, where)
            elif sep and key == "max_slots":
                _check_slots(value, host, where)
            else:
                raise ConfigError(with_hint(
                    f"{where}: unknown field {token!r} in {raw.strip()!r}",
                    "hostfile lines look like 'host slots=4', 'host:4' or 'host'",
                ))
        hosts.append(HostSlots(host, slots))
    if not hosts:
        raise ConfigError(with_hint(f"{source}: no hosts found",
                                    "list one host per line, e.g. 'node1 slots=4'"))
    return merge_hosts(hosts)


def read_hostfile_text(path: str, flag: str = "--hostfile") -> str:
    """The text of a hostfile: a regular file of at most :data:`MAX_HOSTFILE_BYTES`, UTF-8.

    Opened with ``O_NONBLOCK`` and checked on the descriptor before anything is read, so that
    a FIFO cannot hang the launcher and a device (``/dev/zero``) cannot fill its memory.

    Raises:
        ConfigError: it cannot be opened, is not a regular file, is too large or not UTF-8.
    """
    hint = "pass a text file with one host per line, e.g. 'node1 slots=4'"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(with_hint(f"{flag}: cannot read {path!r}: {exc.strerror}",
                                    "pass the path of an existing, readable hostfile")) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a folder" if stat.S_ISDIR(mode)
                    else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file")
            raise ConfigError(with_hint(f"{flag}: {path!r} is {kind}, not a regular file", hint))
        chunks, size = [], 0
        while size <= MAX_HOSTFILE_BYTES:
            chunk = os.read(fd, MAX_HOSTFILE_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise ConfigError(with_hint(f"{flag}: cannot read {path!r}: {exc.strerror}", hint)) from None
    finally:
        os.close(fd)
    if size > MAX_HOSTFILE_BYTES:
        raise ConfigError(with_hint(f"{flag}: {path!r} is larger than {MAX_HOSTFILE_BYTES} bytes, too large "
                                    "for a hostfile", hint))
    try:
        return b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(with_hint(f"{flag}: {path!r} is not UTF-8 text (byte {exc.start}: {exc.reason})",
                                    hint)) from None


def parse_hostfile(path: str, flag: str = "--hostfile") -> list[HostSlots]:
    """Read and parse a hostfile (see :func:`read_hostfile_text`, :func:`parse_hostfile_text`);
    ``flag`` names where its path came from in errors."""
    return parse_hostfile_text(read_hostfile_text(path, flag), source=path)


def parse_ips(ips: str, nproc_per_node: int) -> list[HostSlots]:
    """Paddle-style ``--ips a,b --nproc-per-node K``: every address gets K slots."""
    if nproc_per_node <= 0:
        raise ConfigError(with_hint(f"--nproc-per-node must be at least 1, got {nproc_per_node}",
                                    "pass --nproc-per-node K with K >= 1"))
    names = [part.strip() for part in ips.split(",")]
    if not ips.strip() or any(not n for n in names):
        raise ConfigError(with_hint(f"--ips: cannot read address list {ips!r}",
                                    "write --ips 10.0.0.1,10.0.0.2"))
    return merge_hosts(HostSlots(check_name(n, "--ips"), nproc_per_node) for n in names)


def parse_devices(text: str) -> tuple[str, ...]:
    """``--gpus 0,1`` -> ``("0", "1")``; ids are non-negative integers or UUID-like names."""
    items = tuple(part.strip() for part in text.split(","))
    if not text.strip() or any(not i for i in items) or len(set(items)) != len(items):
        raise ConfigError(with_hint(f"--gpus/--devices: cannot read device list {text!r}",
                                    "write distinct device ids separated by commas, e.g. --gpus 0,1"))
    for item in items:
        if not re.match(r"^[A-Za-z0-9_-]+$", item):
            raise ConfigError(with_hint(f"--gpus/--devices: bad device id {item!r}",
                                        "use indices (0,1) or GPU UUIDs"))
    return items


def parse_rank_list(text: str, flag: str) -> frozenset[int]:
    """``"0,2"`` -> ``frozenset({0, 2})`` for flags such as ``--ranks-filter``."""
    try:
        ranks = frozenset(int(part) for part in text.split(","))
    except ValueError:
        raise ConfigError(with_hint(f"{flag}: cannot read rank list {text!r}",
                                    f"write ranks separated by commas, e.g. {flag} 0,1")) from None
    if any(r < 0 for r in ranks):
        raise ConfigError(with_hint(f"{flag}: ranks must be >= 0, got {sorted(ranks)}",
                                    f"write {flag} 0,1"))
    return ranks


def this_host_names() -> frozenset[str]:
    """Names that mean "this machine": loopback names and this host's name (short and full)."""
    name = socket.gethostname()
    return LOCAL_NAMES | {name, name.split(".")[0]}


def this_host_addresses() -> frozenset[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """The IPv4 and IPv6 addresses of this machine's network interfaces (those that are up or
    down alike; an interface without an address adds nothing)."""
    found: set[ipaddress.IPv4Address | ipaddress.IPv6Address] = set()
    for _, name in socket.if_nameindex():
        try:
            found.add(ipaddress.ip_address(interface_address(name)))
        except ConfigError:
            pass
    try:  # Linux lists every IPv6 address, one per line: 32 hex digits first
        with open("/proc/net/if_inet6") as table:
            for line in table:
                digits = line.split()[0] if line.split() else ""
                if len(digits) == 32:
                    found.add(ipaddress.IPv6Address(int(digits, 16)))
    except (OSError, ValueError):
        pass
    return frozenset(found)


def is_local(hostname: str, local_names: Sequence[str] | frozenset[str] | None = None) -> bool:
    """True when ``hostname`` names this machine (run directly, without ssh): a loopback name
    or address, this host's name, or an address of one of its interfaces (``--ips`` and
    hostfiles often list the launch host by address). Other names are not resolved."""
    names = this_host_names() if local_names is None else local_names
    if hostname in names or hostname.startswith("127."):
        return True
    try:
        address = ipaddress.ip_address(hostname.strip("[]"))
    except ValueError:
        return False
    if local_names is not None:
        return False
    return address.is_loopback or address in this_host_addresses()


