"""Per-run ssh material of a simulated cluster: keys, sshd and ssh client configuration.

One client key pair and one host key per run, generated fresh (nothing from ``~/.ssh`` is read or
written). Inside every simulated host, ``/etc/ssh/ssh_config`` is replaced (a bind mount in the
host's private mount namespace) by :func:`client_config`, so a plain ``ssh h2`` works there, as
it does between the machines of a real cluster, and known host keys go to the run folder.
"""
from __future__ import annotations

import os
import subprocess

SSHD = "/usr/sbin/sshd"


def generate_keys(folder: str) -> None:
    """Create ``id_ed25519`` (client), ``host_ed25519`` (every host's sshd) and ``authorized_keys``."""
    os.makedirs(folder, mode=0o700, exist_ok=True)
    for name in ("id_ed25519", "host_ed25519"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"accsim-{name}",
                        "-f", os.path.join(folder, name)], check=True, capture_output=True)
    with open(os.path.join(folder, "id_ed25519.pub"), encoding="ascii") as src:
        key = src.read()
    _write(os.path.join(folder, "authorized_keys"), key)


def _write(path: str, text: str) -> None:
    # in place (same inode): files bind-mounted into running hosts see the new content
    with open(path, "w", encoding="ascii") as fh:
        fh.write(text)


def write_known_hosts(folder: str, hosts: list[tuple[str, str]]) -> None:
    """known_hosts naming every ``(name, address)`` with the run's host key."""
    with open(os.path.join(folder, "host_ed25519.pub"), encoding="ascii") as fh:
        kind, key = fh.read().split()[:2]
    _write(os.path.join(folder, "known_hosts"),
           "".join(f"{name},{addr} {kind} {key}\n" for name, addr in hosts))


def client_config(folder: str) -> str:
    """The ssh client configuration used inside every host."""
    return (
        "Host *\n"
        f"  IdentityFile {folder}/id_ed25519\n"
        "  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {folder}/known_hosts\n"
        "  GlobalKnownHostsFile /dev/null\n"
        "  StrictHostKeyChecking yes\n"
        "  BatchMode yes\n"
        "  ConnectTimeout 5\n"
        "  LogLevel ERROR\n"
    )


def sshd_config(folder: str) -> str:
    """sshd's configuration (the listen address is given per host on the command line)."""
    return (
        "Port 22\n"
        f"HostKey {folder}/host_ed25519\n"
        f"AuthorizedKeysFile {folder}/authorized_keys\n"
        "PidFile none\n"
        "UsePAM no\n"
        "StrictModes no\n"
        "PermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\n"
        "PrintMotd no\n"
        "PrintLastLog no\n"
        "MaxStartups 200\n"
        "MaxSessions 200\n"
        "LogLevel ERROR\n"
    )


def write_configs(folder: str) -> tuple[str, str]:
    """Write ``ssh_config`` and ``sshd_config`` into ``folder``; return their paths."""
    client, server = os.path.join(folder, "ssh_config"), os.path.join(folder, "sshd_config")
    _write(client, client_config(folder))
    _write(server, sshd_config(folder))
    return client, server
