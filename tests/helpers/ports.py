"""Ports for tests to hand to a launcher or server they start.

A port the OS handed out and we let go may go to the next process that asks (another test's
store, on a busy CI machine) before the server we start binds it. These stay bound, with
``SO_REUSEADDR`` and without listening, for the rest of the test process: the kernel gives no
other ``bind(0)`` a held port, while our servers (torch's TCPStore, accord's store, libzmq),
which set ``SO_REUSEADDR`` too, can still bind and listen on it.
"""
from __future__ import annotations

import socket

_HELD: list[socket.socket] = []


def held_port(host: str = "127.0.0.1") -> int:
    """A free port on ``host``, kept from other processes' ``bind(0)`` until this process ends."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    _HELD.append(sock)
    return sock.getsockname()[1]
