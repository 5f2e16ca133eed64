"""``broadcast_parameters`` (dicts and Gluon ParameterDicts, deferred-init parameters
included), ``broadcast_object`` and ``allgather_object``.

Objects travel only over the job's data plane, as sealed pickles
(:mod:`accord.store.sealed_objects`): bytes no rank of this job sealed are refused, never
unpickled. Unpickling runs code chosen by the sending rank: these functions trust the job's
ranks as much as the training script itself does.
"""
from __future__ import annotations

import types
from typing import Any

import torch

from accord.engine import session
from accord.engine.request import Op
from accord.errors import CollectiveError
from accord.mxnet import basics
from accord.mxnet.bridge import mx, mxnet_error
from accord.mxnet.mpi_ops import broadcast_, run
from accord.mxnet.process_sets import ProcessSet, global_process_set
from accord.store.sealed_objects import dumps_sealed, loads_sealed

_PURPOSE = b"accord.mxnet object"


def broadcast_parameters(params: Any, root_rank: int = 0, prefix: str | None = None) -> None:
    """Overwrite every rank's parameters with ``root_rank``'s, in place.

    Args:
        params: a dict of NDArrays (``Module.get_params()``) or Parameters, or a Gluon
            ``ParameterDict`` (``net.collect_params()``). Parameters whose initialization is
            deferred (shape unknown until the first forward) are broadcast right after they
            are initialized.
        prefix: prepended to the names (two calls in one program need different prefixes).
    Raises:
        ValueError: ``params`` is neither a dict nor a ParameterDict.
    """
    if not isinstance(prefix, (str, type(None))):
        raise ValueError(f"prefix must be a str or None, got {type(prefix).__name__}")
    prefix = prefix or ""
    valid: tuple[type, ...] = (dict,)
    parameter_dict = getattr(mx.gluon.parameter, "ParameterDict", None)
    if parameter_dict is not None:
        valid = (dict, parameter_dict)
    if not isinstance(params, valid):
        raise ValueError("invalid params of type: %s" % type(params))
    if basics.size() == 1:
        return
    for name, p in sorted(params.items()):
        full = prefix + str(name)
        if isinstance(p, mx.gluon.parameter.Parameter):
            try:
                arrays = p.list_data()
            except mx.gluon.parameter.DeferredInitializationError:
                _broadcast_after_init(p, root_rank, full)
                continue
            _broadcast_copies(arrays, root_rank, full)
        else:
            broadcast_(p, root_rank, name=full)


def _broadcast_copies(arrays: list[Any], root_rank: int, name: str) -> None:
    """Broadcast the first copy; the parameter's copies on other devices follow it."""
    broadcast_(arrays[0], root_rank, name=name)
    for other in arrays[1:]:
        arrays[0].copyto(other)


def _broadcast_after_init(param: Any, root_rank: int, name: str) -> None:
    """Make ``param``'s deferred initialization end with a broadcast from ``root_rank`` (every
    rank initializes it at the same point of its first forward pass)."""
    original = param._init_impl

    def init_then_broadcast(self: Any, *args: Any, **kwargs: Any) -> None:
        original(*args, **kwargs)
        _broadcast_copies(self.list_data(), root_rank, name)

    param._init_impl = types.MethodType(init_then_broadcast, param)


def _dumps(obj: Any) -> torch.Tensor:
    sealed = dumps_sealed(session.runtime().secret, _PURPOSE, obj)
    return torch.frombuffer(bytearray(sealed), dtype=torch.uint8)


def _loads(data: torch.Tensor) -> Any:
    try:
        return loads_sealed(session.runtime().secret, _PURPOSE, data.numpy().tobytes())
    except ValueError as exc:  # never unpickled: no rank of this job sealed it
        raise mxnet_error(CollectiveError(str(exc))) from None


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """Return ``root_rank``'s ``obj`` on every rank of the set (pickled; see the module note)."""
    is_root = basics.rank() == root_rank
    payload = _dumps(obj) if is_root else torch.empty(0, dtype=torch.uint8)
    length = torch.tensor([payload.numel()], dtype=torch.int64)
    run(Op.BROADCAST, [length], f"{name}.sz" if name else None, process_set, in_place=True,
        root_rank=root_rank)
    if not is_root:
        payload = torch.empty(int(length.item()), dtype=torch.uint8)
    run(Op.BROADCAST, [payload], f"{name}.t" if name else None, process_set, in_place=True,
        root_rank=root_rank)
    return obj if is_root else _loads(payload)


def allgather_object(obj: Any, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> list[Any]:
    """Return every rank's ``obj`` in rank order (pickled; see the module note)."""
    payload = _dumps(obj)
    sizes = run(Op.ALLGATHER, [torch.tensor([payload.numel()], dtype=torch.int64)],
                f"{name}.sz" if name else None, process_set)[0]
    gathered = run(Op.ALLGATHER, [payload], f"{name}.t" if name else None, process_set)[0]
    out, start = [], 0
    for n in sizes.tolist():
        out.append(_loads(gathered[start:start + n]))
        start += n
    return out
