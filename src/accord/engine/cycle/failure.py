"""Why a controller stopped, as the errors its pending requests fail with.

:class:`CommunicationFailure` is raised on the engine's thread (by :mod:`accord.engine.cycle.execute`
and the negotiation) when a library call failed mid-collective: a peer died, a timeout. The
controller turns it into the :class:`~accord.errors.RankFailedError` every pending request fails
with (:meth:`CommunicationFailure.rank_failed`). A negotiated stop fails them with the
ShutdownError of :func:`pending_at_stop`.
"""
from __future__ import annotations

import traceback
from typing import Sequence

from accord.engine.request import Request
from accord.engine.sets import GLOBAL_ID
from accord.errors import RankFailedError, ShutdownError, with_hint


class CommunicationFailure(Exception):
    """A collective failed in a way that leaves its communicator unusable."""

    def __init__(self, requests: Sequence[Request], cause: BaseException) -> None:
        super().__init__(f"{cause.__class__.__name__}: {cause}")
        self.requests = list(requests)
        self.cause = cause

    def rank_failed(self, rank: int, size: int, where: str, timeout: float) -> RankFailedError:
        """The error callers get: what failed on ``rank`` of ``size`` (``where``: the process
        set, or ""), caused by the library's error. Releases the frames the failure went
        through (see :meth:`release_frames`)."""
        error = RankFailedError(with_hint(
            f"a collective failed on rank {rank} of {size}{where}: {self}",
            f"another rank probably died or stopped answering (ACCORD_COLLECTIVE_TIMEOUT={timeout:g}s); "
            "the launcher's output and per-rank logs name the rank that failed first and its root cause"))
        error.__cause__ = self.cause
        self.release_frames()
        return error

    def release_frames(self) -> None:
        """Drop the local variables of the finished frames this failure and its causes went
        through, keeping their files and lines for tracebacks.

        Those frames hold the broken communicator and its process group, and the error handed
        to callers chains to them. A caller that keeps the error (a handle in an optimizer, an
        elastic retry loop) would keep the group's connections open after shutdown, so a peer
        blocked on this rank in the same collective would wait out ACCORD_COLLECTIVE_TIMEOUT
        instead of failing as soon as this rank leaves.
        """
        seen: set[int] = set()
        exc: BaseException | None = self
        while exc is not None and id(exc) not in seen:
            seen.add(id(exc))
            traceback.clear_frames(exc.__traceback__)  # frames still running are skipped
            exc = exc.__cause__ or exc.__context__


def pending_at_stop(set_id: int, members: Sequence[int], rank: int, by_peers: bool) -> ShutdownError:
    """The error of a request still pending when its set stopped by agreement; ``by_peers``:
    only other members asked (their process is ending: it failed, or finished without this
    collective), so this rank's caller did nothing wrong."""
    if by_peers:
        return ShutdownError(with_hint(
            f"another rank of {list(members)} shut down while this request was pending on rank {rank}: "
            "its process is ending (it failed, or finished without submitting this collective)",
            "the launcher's output names the rank that ended first and why"))
    return ShutdownError(with_hint(
        "the accord engine shut down while this request was pending" + (
            "" if set_id == GLOBAL_ID else
            f" (process set {set_id} stopped: shutdown or remove_process_set on a member)"),
        "synchronize every handle before shutdown(), and submit the same names on every rank"))
