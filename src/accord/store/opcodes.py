"""The codes of the store protocol, shared by :mod:`accord.store.server` and its client.

A request is ``[Op, *arguments]`` and a response ``[Status, *values]``, each encoded by
:mod:`accord.store.wire`; the codes are plain integers on the wire.
"""
from __future__ import annotations

import enum

__all__ = ["Op", "Status"]


class Op(enum.IntEnum):
    """Request codes of the store protocol."""

    PING = 0
    SET = 1
    GET = 2
    ADD = 3
    COMPARE_SET = 4
    WAIT = 5
    CHECK = 6
    DELETE = 7
    NUM_KEYS = 8
    MULTI_GET = 9
    MULTI_SET = 10
    APPEND = 11


class Status(enum.IntEnum):
    """First value of every response."""

    OK = 0
    TIMEOUT = 1
    ERROR = 2
