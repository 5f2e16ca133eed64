"""Horovod-style integer handles over engine requests: submit, ``poll`` and ``synchronize``.

Horovod hands out small integers from a per-process counter and names unnamed requests after
them (``allreduce.noname.7``), so ranks that call the same collectives in the same order agree
on every name. A handle here may stand for several engine requests (grouped ops, Adasum's
gather) plus a ``finish`` function that turns their results into what the caller gets back.
"""
from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from accord.engine.request import Handle as EngineHandle
from accord.engine.request import Request
from accord.errors import AccordError, CollectiveError, with_hint
from accord.torch import basics

Finish = Callable[[list[Any]], Any]


@dataclass
class _Pending:
    handles: list[EngineHandle]
    finish: Finish
    keep: tuple  # tensors that must stay alive until the handle is synchronized


_lock = threading.Lock()
_counter = itertools.count(1)
_table: dict[int, _Pending] = {}
_auto: dict[int, int] = {}  # process set id -> last automatic name number


def reset() -> None:
    """Forget every handle (init and shutdown do this, like Horovod's ``_handle_map = {}``)."""
    with _lock:
        _table.clear()
        _auto.clear()


def allocate() -> int:
    """The next handle number."""
    with _lock:
        return next(_counter)


def op_name(prefix: str, name: str | None, set_id: int = 0) -> str:
    """Horovod's naming, ``prefix.name`` or ``prefix.noname.<n>``, scoped to the process set.

    Unnamed requests are numbered per process set (not per process as in Horovod), so ranks
    outside a set calling fewer collectives does not shift the numbers of later global ones.
    Names in a non-global set carry ``@ps<id>``: like Horovod's per-set controllers, two sets
    may use the same name at once.
    """
    if not name:
        with _lock:
            n = _auto.get(set_id, 0) + 1
            _auto[set_id] = n
        name = f"noname.{n}"
    return f"{prefix}.{name}" if set_id == 0 else f"{prefix}.{name}@ps{set_id}"


def group_names(prefix: str, name: str | None, count: int, set_id: int = 0) -> list[str]:
    """Per-tensor names of a grouped op: ``<base>_1of3``, ``<base>_2of3``, ..."""
    base = op_name(prefix, name, set_id)
    return [f"{base}_{i + 1}of{count}" for i in range(count)]


def check_tensor(tensor: Any, what: str) -> torch.Tensor:
    """Reject what Horovod rejects before submitting: non-tensors and non-contiguous tensors."""
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(with_hint(f"{what} expects a torch.Tensor, got {type(tensor).__name__}",
                                   "pass a tensor (torch.as_tensor(value))"))
    if tensor.is_sparse:
        raise ValueError(with_hint(f"{what} does not take sparse tensors",
                                   "use sparse_allreduce_async, or .to_dense() first"))
    if not tensor.is_contiguous():
        raise ValueError(with_hint("Tensor is required to be contiguous.",
                                   f"call .contiguous() on the tensor before {what} "
                                   f"(shape {list(tensor.shape)}, strides {list(tensor.stride())})"))
    return tensor


def submit(handle: int, requests: Sequence[Request], finish: Finish, keep: tuple = ()) -> int:
    """Enqueue ``requests`` under ``handle``; ``finish(results)`` builds the caller's value."""
    engine_handles = basics.enqueue_group(requests)  # all or none: never half a group
    with _lock:
        _table[handle] = _Pending(engine_handles, finish, keep)
    return handle


def poll(handle: int) -> bool:
    """True when the operation behind ``handle`` has completed; ``synchronize`` then won't block.

    Raises:
        ValueError: ``handle`` was never created or was already synchronized.
    """
    with _lock:
        pending = _table.get(handle)
    if pending is None:
        raise ValueError(f"Handle {handle} was not created or has been cleared.")
    return all(basics.poll(h) for h in pending.handles)


def synchronize(handle: Any) -> Any:
    """Wait for ``handle`` and return its result (None for an unknown handle, as in Horovod).

    Raises:
        HorovodInternalError (accord.errors.CollectiveError): the collective failed, including
            mismatches detected across ranks and lost ranks.
    """
    if callable(handle):  # sparse_allreduce_async returns a function, as in Horovod
        return handle()
    with _lock:
        pending = _table.get(handle)
    if pending is None:
        return None
    try:
        results = [basics.wait(h) for h in pending.handles]
    except (AccordError, ValueError, TypeError):
        _drop(handle)
        raise
    except RuntimeError as exc:  # anything else from a collective: Horovod's internal error
        _drop(handle)
        raise CollectiveError(with_hint(f"collective failed: {exc}",
                                        "see the cause above; other ranks' logs may name the "
                                        "rank that failed first")) from exc
    _drop(handle)
    return pending.finish(results)


def _drop(handle: int) -> None:
    with _lock:
        _table.pop(handle, None)


def pending_count() -> int:
    """Handles not yet synchronized (tests use it)."""
    with _lock:
        return len(_table)
