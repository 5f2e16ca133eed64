"""What a parameter server publishes in the job's store, and how a worker reads it.

The value under ``accord/kvstore/server/<index>`` is ``|``-separated::

    tcp://host:port | ipc:///dir/server.sock | to=<token> | max=<bytes>

- ``tcp://`` is always there; ``ipc://`` when the server also listens on a Unix socket (a
  worker on the same host takes it only from a private directory of its own user, see
  :func:`usable_ipc`);
- ``to``: a random token drawn by each server process. Every request names it and every
  answer carries it back, under the MAC, so a message recorded for one server is refused by
  every other server, of this job or any later job with the same secret;
- ``max``: the largest message frame the server accepts (ZeroMQ's ZMQ_MAXMSGSIZE), so that a
  worker configured with larger chunks fails with a clear error instead of a dropped connection.

Torch-free: servers and workers both use it.
"""
from __future__ import annotations

import os
import secrets
import stat
from dataclasses import dataclass

__all__ = ["Advertised", "new_token", "usable_ipc"]


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
