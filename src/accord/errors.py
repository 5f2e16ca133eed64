"""The exceptions accord raises.

Every message says what failed, the values seen (per rank for cross-rank problems) and ends
with a ``HINT:`` naming the fix. Build messages with :func:`with_hint` so that shape holds.
"""
from __future__ import annotations

import re
from typing import Iterable


def with_hint(message: str, hint: str) -> str:
    """Join a description of the failure and the suggested fix into one message."""
    return f"{message.rstrip()}\nHINT: {hint.strip()}"


def not_answering(ranks: Iterable[int]) -> str:
    """How an error names the ranks that did not answer within a collective's timeout; the
    launcher's report reads them back (:func:`ranks_not_answering`) to name a frozen rank as the
    root cause instead of the peers whose waits it ended."""
    return f"rank(s) {sorted(ranks)} did not answer"


_NOT_ANSWERING = re.compile(r"rank\(s\) \[([0-9, ]*)\] did not answer")


def ranks_not_answering(text: str) -> list[int]:
    """The ranks :func:`not_answering` named anywhere in ``text``, sorted, each once."""
    return sorted({int(n) for m in _NOT_ANSWERING.finditer(text) for n in m.group(1).split(",") if n.strip()})


class AccordError(Exception):
    """Root of every error accord raises on purpose."""


class ConfigError(AccordError, ValueError):
    """An environment variable or option has a value accord cannot use."""


class LaunchError(AccordError):
    """The launcher could not start the job (bad hosts, ports, commands)."""


class RendezvousError(AccordError, RuntimeError):
    """Ranks could not meet: the store was unreachable, refused us, or timed out."""


class AuthenticationError(RendezvousError):
    """A control message carried a missing or wrong MAC and was refused."""


class BackendError(AccordError, RuntimeError):
    """A communication backend is unknown, unavailable, or cannot do what was asked."""


class CollectiveError(AccordError, RuntimeError):
    """A collective failed on this rank. ``accord.torch.HorovodInternalError`` is this class."""


class MismatchError(CollectiveError):
    """Ranks submitted the same name with different shapes, dtypes, ops or roots."""


class RankFailedError(CollectiveError):
    """Another rank died or stopped answering while this one waited in a collective."""


class StallError(CollectiveError):
    """Some ranks never submitted a name that others are waiting on (stall shutdown)."""


class ShutdownError(CollectiveError):
    """The engine was shut down while the request was still pending."""


class InvalidArgumentError(AccordError, ValueError, RuntimeError):
    """A collective's arguments were refused: on this rank before anything was submitted when no
    peer waits for it (a process set this rank is not in, a name already in flight), else on
    every rank of the set at ``synchronize()`` once all have submitted the name (a tensor,
    root, op or splits that one rank cannot use: refused on that rank alone, its peers would
    wait forever; or alltoall without splits on a dim 0 that does not divide among the ranks).
    Horovod raises a RuntimeError for most of these (HorovodInternalError), so this is both a
    ValueError and a RuntimeError (see docs/horovod-parity.md)."""


class WorkerFailedError(AccordError, RuntimeError):
    """A worker process of the job exited with an error (raised by spawn and the launcher); a
    RuntimeError, as horovod.run's failure is."""

    def __init__(self, message: str, rank: int = -1, exit_code: int | None = None) -> None:
        super().__init__(message)
        self.rank = rank
        self.exit_code = exit_code
