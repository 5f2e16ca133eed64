"""Horovod's MXNet collectives on accord's engine (``hvd.allreduce``, ``broadcast_``, ...).

Semantics of Horovod 0.28's ``horovod.mxnet``: out-of-place functions return new NDArrays and
leave the input alone; the in-place ones (trailing underscore) write into the input and return
it; ``average=True`` is the default for allreduce, ``op=Average`` for reducescatter;
``root_rank`` is a global rank; ``priority`` is accepted and ignored (requests run as they are
ready). Every call returns once the result is written (see :mod:`accord.mxnet.bridge`), so
MXNet operators pushed afterwards read finished values. Errors raised by the engine (e.g.
shapes that differ between ranks: raised on every rank) are both accord's error and an
``mx.base.MXNetError``, as Horovod's MXNet ops raise.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from accord.comm.ops import ReduceOp
from accord.engine import session
from accord.engine.compression import Compressor, NoneCompressor
from accord.engine.request import Op
from accord.errors import CollectiveError, InvalidArgumentError, with_hint
from accord.mxnet import basics
from accord.mxnet.bridge import check_ndarray, mx, mxnet_error, read_view, to_ndarray, write_view
from accord.mxnet.process_sets import ProcessSet, global_process_set, set_id

Average, Sum, Adasum = ReduceOp.AVERAGE, ReduceOp.SUM, ReduceOp.ADASUM
Min, Max, Product = ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT



def op_name(op: Op, name: str | None) -> str | None:
    """Horovod's ``allreduce.<name>``; None for an unnamed call, which the session numbers
    (:mod:`accord.engine.naming`: one counter per process set, ``@ps<id>`` for other sets)."""
    return None if name is None else f"{op.value}.{name}"


def reduce_op(average: bool | None, op: Any) -> ReduceOp:
    """Resolve Horovod's ``average=`` and accord's optional ``op=`` (default Average).

    Raises:
        ValueError: both given.
    """
    if op is not None:
        if average is not None:
            raise ValueError("The op parameter supersedes average. Please provide only one of them.")
        return ReduceOp(op)
    return Sum if average is False else Average


def submit(op: Op, tensors: Sequence[torch.Tensor], name: str | None, process_set: ProcessSet, *,
           grouped: bool = False, **kwargs: Any) -> list[Any]:
    """Submit one collective per tensor (one all-or-none group when ``grouped``); return the
    engine handles (wait with :func:`wait_all`).

    Raises:
        CollectiveError (also MXNetError): not initialized.
        ValueError: a request the engine refuses locally (bad root, process set); bad alltoall
            splits raise on every rank of the set, where the ranks exchange them.
    """
    if not session.is_initialized():
        raise mxnet_error(CollectiveError(with_hint(basics.NOT_INITIALIZED, "call hvd.init() first")))
    sid = set_id(process_set)
    full = op_name(op, name)
    if grouped:
        return session.submit_group(op, list(tensors), full, process_set_id=sid, **kwargs)
    return [session.submit(op, tensors[0], full, process_set_id=sid, **kwargs)]


def wait_all(handles: Sequence[Any]) -> list[Any]:
    """Wait for every handle, even after one failed (none may still be writing afterwards);
    return the results, or raise the first error (as an MXNetError too)."""
    results, failure = [], None
    for h in handles:
        try:
            results.append(session.synchronize(h))
        except Exception as exc:  # noqa: BLE001 - re-raised below, as an MXNetError too
            failure = failure or exc
            results.append(None)
    if failure is not None:
        raise mxnet_error(failure) from None
    return results


def run(op: Op, tensors: Sequence[torch.Tensor], name: str | None, process_set: ProcessSet, *,
        grouped: bool = False, **kwargs: Any) -> list[Any]:
    """:func:`submit`, then :func:`wait_all`: the results in order."""
    return wait_all(submit(op, tensors, name, process_set, grouped=grouped, **kwargs))


def _checked(tensors: Sequence[Any], what: str) -> list[Any]:
    for t in tensors:
        check_ndarray(t, what)
    return list(tensors)


def _allreduce_into(tensors: list[Any], outputs: list[Any], average: bool | None, name: str | None,
                    prescale_factor: float, postscale_factor: float, process_set: ProcessSet,
                    op: Any, grouped: bool, compression: type[Compressor] | Compressor = NoneCompressor) -> None:
    rop = reduce_op(average, op)
    views = []
    for t, o in zip(tensors, outputs):
        view = write_view(o)
        if o is not t:
            view.copy_(read_view(t))
        views.append(view)
    run(Op.ALLREDUCE, views, name, process_set, grouped=grouped, in_place=True, reduce_op=rop,
        prescale_factor=prescale_factor, postscale_factor=postscale_factor, compression=compression)


def allreduce(tensor: Any, average: bool | None = None, name: str | None = None, priority: int = 0,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: ProcessSet = global_process_set, op: Any = None) -> Any:
    """Average (default) or sum ``tensor`` over the ranks; return a new NDArray.

    ``op`` (accord: Sum, Average, Min, Max, Product) may replace ``average``.
    """
    check_ndarray(tensor, "allreduce")
    out = mx.nd.empty(tensor.shape, ctx=tensor.context, dtype=tensor.dtype)
    _allreduce_into([tensor], [out], average, name, prescale_factor, postscale_factor, process_set,
                    op, grouped=False)
    return out


def allreduce_(tensor: Any, average: bool | None = None, name: str | None = None, priority: int = 0,
               prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               process_set: ProcessSet = global_process_set, op: Any = None) -> Any:
    """In-place :func:`allreduce`; returns ``tensor``."""
    check_ndarray(tensor, "allreduce_")
    _allreduce_into([tensor], [tensor], average, name, prescale_factor, postscale_factor,
                    process_set, op, grouped=False)
    return tensor


def grouped_allreduce(tensors: Sequence[Any], average: bool | None = None, name: str | None = None,
                      priority: int = 0, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set, op: Any = None) -> list[Any]:
    """Allreduce a list of NDArrays as one group (fused); return new NDArrays."""
    tensors = _checked(tensors, "grouped_allreduce")
    if not tensors:
        return tensors
    outs = [mx.nd.empty(t.shape, ctx=t.context, dtype=t.dtype) for t in tensors]
    _allreduce_into(tensors, outs, average, name, prescale_factor, postscale_factor, process_set,
                    op, grouped=True)
    return outs


def grouped_allreduce_(tensors: Sequence[Any], average: bool | None = None, name: str | None = None,
                       priority: int = 0, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: ProcessSet = global_process_set, op: Any = None) -> list[Any]:
    """In-place :func:`grouped_allreduce`; returns ``tensors``."""
    arrays = _checked(tensors, "grouped_allreduce_")
    if arrays:
        _allreduce_into(arrays, arrays, average, name, prescale_factor, postscale_factor,
                        process_set, op, grouped=True)
    return tensors


def allgather(tensor: Any, name: str | None = None, priority: int = 0,
              process_set: ProcessSet = global_process_set) -> Any:
    """Concatenate every rank's ``tensor`` along dimension 0 (first dimensions may differ)."""
    check_ndarray(tensor, "allgather")
    return to_ndarray(run(Op.ALLGATHER, [read_view(tensor)], name, process_set)[0])


def grouped_allgather(tensors: Sequence[Any], name: str | None = None, priority: int = 0,
                      process_set: ProcessSet = global_process_set) -> list[Any]:
    """:func:`allgather` of a list of NDArrays as one group."""
    tensors = _checked(tensors, "grouped_allgather")
    if not tensors:
        return tensors
    results = run(Op.ALLGATHER, [read_view(t) for t in tensors], name, process_set, grouped=True)
    return [to_ndarray(r) for r in results]


def broadcast_(tensor: Any, root_rank: int, name: str | None = None, priority: int = 0,
               process_set: ProcessSet = global_process_set) -> Any:
    """Overwrite ``tensor`` with ``root_rank``'s value (in place); returns ``tensor``."""
    check_ndarray(tensor, "broadcast_")
    run(Op.BROADCAST, [write_view(tensor)], name, process_set, in_place=True, root_rank=int(root_rank))
    return tensor


def broadcast(tensor: Any, root_rank: int, name: str | None = None, priority: int = 0,
              process_set: ProcessSet = global_process_set) -> Any:
    """Return ``root_rank``'s ``tensor`` on every rank as a new NDArray (input unchanged)."""
    check_ndarray(tensor, "broadcast")
    return broadcast_(tensor.copy(), root_rank, name, priority, process_set)


def alltoall(tensor: Any, splits: Any = None, name: str | None = None, priority: int = 0,
             process_set: ProcessSet = global_process_set) -> Any:
    """Send ``splits[i]`` rows of ``tensor`` to rank i of the set (equal parts without
    ``splits``, a list of ints or a 1-D int32 NDArray) and return the rows received; with
    ``splits`` also the received splits (an int32 NDArray), as Horovod does."""
    check_ndarray(tensor, "alltoall")
    counts = None if splits is None else split_counts(splits)
    result, received = run(Op.ALLTOALL, [read_view(tensor)], name, process_set, splits=counts)[0]
    out = to_ndarray(result)
    if splits is None:
        return out
    return out, mx.nd.array([int(s) for s in received], dtype="int32")


def split_counts(splits: Any) -> list[int]:
    """Rows per rank from Horovod's ``splits``: a list of numbers (truncated to integers, as
    Horovod's conversion to int32 does) or a 1-D int32 NDArray.

    Raises:
        InvalidArgumentError (also MXNetError): an NDArray of another dtype, or splits with more
            than one dimension (Horovod's core refuses both).
    """
    if isinstance(splits, mx.nd.NDArray):
        if np.dtype(splits.dtype) != np.int32:
            raise mxnet_error(InvalidArgumentError(with_hint(
                f"alltoall splits must hold 32-bit integers, got an NDArray of "
                f"{np.dtype(splits.dtype).name} {tuple(splits.shape)}",
                "pass splits.astype('int32') (or a list of ints)")))
        values = splits.asnumpy()
    else:
        values = np.asarray(splits)
    if values.ndim > 1:
        raise mxnet_error(InvalidArgumentError(with_hint(
            f"alltoall splits must be 1-D, got shape {tuple(values.shape)}",
            "pass one row count per rank of the process set")))
    return [int(s) for s in values.reshape(-1)]


def reducescatter(tensor: Any, op: Any = Average, name: str | None = None, priority: int = 0,
                  process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> Any:
    """Reduce ``tensor`` over the ranks (Average or Sum) and return this rank's part of dim 0
    (the first ``dim0 % size`` ranks get one row more)."""
    check_ndarray(tensor, "reducescatter")
    result = run(Op.REDUCESCATTER, [read_view(tensor)], name, process_set, reduce_op=ReduceOp(op),
                 prescale_factor=prescale_factor, postscale_factor=postscale_factor)[0]
    return to_ndarray(result)


def grouped_reducescatter(tensors: Sequence[Any], op: Any = Average, name: str | None = None,
                          priority: int = 0, process_set: ProcessSet = global_process_set,
                          prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> list[Any]:
    """:func:`reducescatter` of a list of NDArrays as one group."""
    tensors = _checked(tensors, "grouped_reducescatter")
    if not tensors:
        return tensors
    results = run(Op.REDUCESCATTER, [read_view(t) for t in tensors], name, process_set, grouped=True,
                  reduce_op=ReduceOp(op), prescale_factor=prescale_factor, postscale_factor=postscale_factor)
    return [to_ndarray(r) for r in results]
