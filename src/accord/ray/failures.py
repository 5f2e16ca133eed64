"""A worker's failure, as the error ``run()`` raises: the rank, what happened, its traceback.

Two kinds: the function raised in the worker (its traceback, and the exception itself as
``__cause__`` when it could be sent back), or the worker's Ray actor died (killed, out of
memory, its node lost) before the function returned.
"""
from __future__ import annotations

from typing import Any, Mapping

from accord.errors import WorkerFailedError, with_hint

_RESTART_HINT = "call start() again for a new job, or use min_workers/max_workers for an elastic job that goes on"


def raised(who: str, rank: int, info: Mapping[str, Any], where: str) -> WorkerFailedError:
    """The function raised on worker ``who`` ("rank 1 of 2"; ``info``:
    :func:`accord.ray.actor.describe_exception`)."""
    text = f"RayExecutor: {who} ({where}) failed: {info['type']}: {info['message']}"
    tb = (info.get("traceback") or "").rstrip()
    if tb:
        text += f"\n\nTraceback from {who.split(' of ')[0]}:\n{tb}"
    error = WorkerFailedError(with_hint(text, "the traceback is the worker's own; fix the error there (the "
                                              "other workers were stopped); " + _RESTART_HINT), rank=rank)
    error.__cause__ = info.get("exception")
    return error


def died(who: str, rank: int, where: str, reason: BaseException) -> WorkerFailedError:
    """The Ray actor of worker ``who`` ended before its function returned (``reason``: Ray's error)."""
    said = " ".join(str(reason).split())
    if len(said) > 600:
        said = said[:600] + " ..."
    error = WorkerFailedError(with_hint(
        f"RayExecutor: {who} ({where}) died before its function returned: the worker's "
        f"Ray actor ended ({type(reason).__name__}: {said})",
        "its process was killed, ran out of memory, or its node left the cluster (`ray status`, the raylet "
        "logs); the other workers were stopped; " + _RESTART_HINT), rank=rank)
    error.__cause__ = reason
    return error


def where(description: Mapping[str, Any]) -> str:
    """``node 10.0.0.2, pid 1234``: where a worker ran, for messages."""
    return f"node {description.get('ip', '?')}, pid {description.get('pid', '?')}"
