"""accord.torch's one way into the engine: Horovod-style integer handles over the session door.

Every collective of the facade goes through :func:`start`, which names the requests the
Horovod way (``allreduce.<name>``; unnamed ones are numbered by the session, see
:mod:`accord.engine.naming`), submits them through :func:`accord.engine.submit_group`
(all or none) and hands out a small integer. A handle may stand for several engine requests
(grouped ops) plus a ``finish`` function that turns their results into what the caller gets
back. The who-am-I queries (:mod:`accord.frontend.queries`) are reached through here by the
facade's other modules.
"""
from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from accord import engine
from accord.engine import Handle as EngineHandle
from accord.errors import AccordError, CollectiveError, with_hint

# re-exported: the facade's modules ask who they are through the gateway, where tests stand in
from accord.frontend.queries import NOT_INITIALIZED, is_initialized, process_set_members, rank, size, topology  # noqa: F401

Finish = Callable[[list[Any]], Any]


@dataclass
class _Pending:
    handles: list[EngineHandle]
    finish: Finish
    keep: tuple  # tensors that must stay alive until the handle is synchronized


_lock = threading.Lock()
_counter = itertools.count(1)
_table: dict[int, _Pending] = {}
_elastic = False


def require_initialized() -> None:
    """Raise what Horovod's collectives raise before init (HorovodInternalError)."""
    if not engine.is_initialized():
        raise CollectiveError(NOT_INITIALIZED)


def set_elastic(active: bool) -> None:
    """Inside ``hvd.elastic.run`` the job may grow: optimizers hook gradients even alone."""
    global _elastic
    _elastic = active


def elastic() -> bool:
    """True inside ``hvd.elastic.run``."""
    return _elastic


# --- submitting and waiting ----------------------------------------------------------------------

_STRIDED = torch.strided  # (a module global: read for every tensor submitted)


def tensor_problem(tensor: Any, what: str) -> str:
    """What Horovod refuses in a tensor before submitting ("" when nothing): a non-tensor, a
    sparse or a non-contiguous tensor. Not raised here: whether a tensor is usable may differ
    between ranks, so the request carries the problem (``problems`` of :func:`start`) and the
    engine raises it on every rank of the set at ``synchronize()``; refused here, on this rank
    alone, the other ranks would wait for it forever."""
    if isinstance(tensor, torch.Tensor) and tensor.layout is _STRIDED and tensor.is_contiguous():
        return ""  # the common case first: gradients, one call per tensor
    if not isinstance(tensor, torch.Tensor):
        return with_hint(f"{what} expects a torch.Tensor, got {type(tensor).__name__}",
                         "pass a tensor (torch.as_tensor(value))")
    if tensor.layout is not _STRIDED:
        return with_hint(f"{what} does not take sparse tensors (layout {tensor.layout})",
                         "use sparse_allreduce_async, or .to_dense() first")
    return with_hint(f"Tensor is required to be contiguous. (shape {list(tensor.shape)}, "
                     f"strides {list(tensor.stride())})", f"call .contiguous() on the tensor before {what}")


def wire(tensor: Any) -> torch.Tensor:
    """What the engine gets for ``tensor``: a detached alias (the engine's thread must neither
    record autograd history nor trip the in-place check on leaves), or an empty stand-in for a
    non-tensor or a sparse tensor, which cannot be submitted (their request is refused, see
    :func:`tensor_problem`, and never runs)."""
    if isinstance(tensor, torch.Tensor) and tensor.layout is _STRIDED:
        return tensor.detach()
    return torch.empty(0)


def start(op: str, tensors: Sequence[torch.Tensor | None], name: str | None, process_set_id: int,
          finish: Finish, *, grouped: bool = False, keep: tuple = (), prefix: str | None = None,
          problems: Sequence[str] = (), **request: Any) -> int:
    """Submit one (grouped) call and return its integer handle.

    ``name`` is the user's: the requests are named ``<prefix>.<name>`` (``prefix`` defaults to
    ``op``); ``finish(results)`` builds the caller's value from the engine results. ``request``
    goes to :func:`accord.engine.submit_group` (``in_place``, ``compression``, ...).
    ``problems``: per tensor, what this rank refuses in its arguments ("" where nothing): such
    a request is submitted all the same and fails on every rank of the set at ``synchronize()``
    (InvalidArgumentError), see :attr:`accord.engine.request.Request.problem`.

    Raises:
        HorovodInternalError: accord is not initialized.
        ValueError: a request is invalid for this rank alone (a process set it is not in) or its
            name is in flight (nothing was submitted).
    """
    require_initialized()
    full = None if name is None else f"{prefix or op}.{name}"
    if any(problems):
        request["problems"] = problems
    engine_handles = engine.submit_group(op, tensors, full, process_set_id=process_set_id,
                                         grouped=grouped, **request)
    with _lock:
        handle = next(_counter)
        _table[handle] = _Pending(engine_handles, finish, keep)
    return handle


def poll(handle: int) -> bool:
    """True when the operation behind ``handle`` has completed; ``synchronize`` then won't block.

    Args:
        handle: what an ``*_async`` function returned.

    Returns:
        Whether the operation has completed (successfully or not). Polling an unfinished
        handle starts the engine's next cycle at once.

    Raises:
        ValueError: ``handle`` was never created or was already synchronized.
    """
    with _lock:
        pending = _table.get(handle)
    if pending is None:
        raise ValueError(f"Handle {handle} was not created or has been cleared.")
    return all(engine.poll(h) for h in pending.handles)


def synchronize(handle: Any) -> Any:
    """Wait for ``handle`` and return its result (None for an unknown handle, as in Horovod).

    Args:
        handle: what an ``*_async`` function returned (or the function
            ``sparse_allreduce_async`` returns, which is called).

    Returns:
        The operation's result: the output tensor, the input tensor for in-place forms, a list
        for grouped forms, ``(output, received_splits)`` for ``alltoall`` with splits.

    Raises:
        HorovodInternalError (accord.errors.CollectiveError): the collective failed, including
            mismatches detected across ranks and lost ranks.
    """
    if callable(handle):  # sparse_allreduce_async returns a function, as in Horovod
        return handle()
    with _lock:
        pending = _table.pop(handle, None)
    if pending is None:
        return None
    try:
        results = [engine.synchronize(h) for h in pending.handles]
    except (AccordError, ValueError, TypeError):
        raise
    except RuntimeError as exc:  # anything else from a collective: Horovod's internal error
        raise CollectiveError(with_hint(f"collective failed: {exc}",
                                        "see the cause above; other ranks' logs may name the "
                                        "rank that failed first")) from exc
    value = pending.finish(results)
    used_on_callers_stream(value)
    return value


def used_on_callers_stream(value: Any) -> None:
    """Tell torch's caching allocator that CUDA results are used on the caller's stream.

    The engine allocates results on its own thread's stream; a caller working on a side stream
    that drops a result while its kernels still read it would otherwise let the allocator hand
    that memory to the engine's next allocation at once. ``record_stream`` delays the reuse until
    the caller's stream has passed this point (what outputs allocated on the caller's side get
    for free). On the default stream there is nothing to do."""
    for t in value if isinstance(value, (list, tuple)) else (value,):
        if isinstance(t, torch.Tensor) and t.is_cuda:
            stream = torch.cuda.current_stream(t.device)
            if stream != torch.cuda.default_stream(t.device):
                t.record_stream(stream)


def reset() -> None:
    """Forget every handle (init and shutdown do this, like Horovod's ``_handle_map = {}``)."""
    with _lock:
        _table.clear()


def join(device: int = -1) -> int:
    """Horovod's join (see :func:`accord.torch.join`): block until every rank has joined,
    serving the others' collectives meanwhile; return the rank that joined last."""
    if not engine.is_initialized():
        raise ValueError(NOT_INITIALIZED)
    return engine.current_engine().join(device)
