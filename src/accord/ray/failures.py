"""A worker's failure, as the error ``run()`` raises: the rank, what happened, its traceback.

Three kinds: the function raised in the worker (its traceback, and the exception itself as
``__cause__`` when it could be sent back), the worker's Ray actor died (killed, out of memory,
its node lost) before the function returned, or Ray could not send the function's result back.
"""
from __future__ import annotations

from typing import Any, Mapping

from accord.errors import WorkerFailedError, with_hint

_RESTART_HINT = "call start() again for a new job, or use min_workers/max_workers for an elastic job that goes on"
STOPPED = "the other workers were stopped; " + _RESTART_HINT
# what an elastic job's failure says: it went on without the worker, then ended without a result
WENT_ON = "the job went on without this worker, and no worker returned a result"


def raised(who: str, rank: int, info: Mapping[str, Any], where: str, then: str = STOPPED) -> WorkerFailedError:
    """The function raised on worker ``who`` ("rank 1 of 2"; ``info``:
    :func:`accord.ray.actor.describe_exception`)."""
    text = f"RayExecutor: {who} ({where}) failed: {info['type']}: {info['message']}"
    tb = (info.get("traceback") or "").rstrip()
    if tb:
        text += f"\n\nTraceback from {who.split(' of ')[0]}:\n{tb}"
    error = WorkerFailedError(with_hint(text, f"the traceback is the worker's own; fix the error there; {then}"),
                              rank=rank)
    error.__cause__ = info.get("exception")
    return error


def died(who: str, rank: int, where: str, reason: BaseException, then: str = STOPPED) -> WorkerFailedError:
    """The Ray actor of worker ``who`` ended before its function returned (``reason``: Ray's error)."""
    error = WorkerFailedError(with_hint(
        f"RayExecutor: {who} ({where}) died before its function returned: the worker's "
        f"Ray actor ended ({_short(reason)})",
        "its process was killed, ran out of memory, or its node left the cluster (`ray status`, the raylet "
        f"logs); {then}"), rank=rank)
    error.__cause__ = reason
    return error


def unsent(who: str, rank: int, where: str, reason: BaseException) -> WorkerFailedError:
    """The function returned on ``who`` but Ray could not send its result (it does not pickle)."""
    error = WorkerFailedError(with_hint(
        f"RayExecutor: {who} ({where}) returned, but Ray could not send the result back ({_short(reason)})",
        f"return something that pickles (numbers, lists, tensors, dicts of them); {STOPPED}"), rank=rank)
    error.__cause__ = reason
    return error


def _short(reason: BaseException) -> str:
    said = " ".join(str(reason).split())
    return f"{type(reason).__name__}: " + (said if len(said) <= 600 else said[:600] + " ...")


def where(description: Mapping[str, Any]) -> str:
    """``node 10.0.0.2, pid 1234``: where a worker ran, for messages."""
    return f"node {description.get('ip', '?')}, pid {description.get('pid', '?')}"
