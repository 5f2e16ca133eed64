"""Horovod's MXNet collectives on accord's engine (``hvd.allreduce``, ``broadcast_``, ...).

Semantics of Horovod 0.28's ``horovod.mxnet``: out-of-place functions return new NDArrays and
leave the input alone; the in-place ones (trailing underscore) write into the input and return
it; ``average=True`` is the default for allreduce, ``op=Average`` for reducescatter;
``root_rank`` is a global rank; ``priority`` is accepted and ignored (requests run as they are
ready). Every call returns once the result is written (see :mod:`accord.mxnet.bridge`), so
MXNet operators pushed afterwards read finished values. Errors raised by the engine (e.g.
shapes that differ between ranks: raised on every rank) are both accord's error and an
``mx.base.MXNetError``, as Horovod's MXNet ops raise.

Arguments that may be wrong on one rank only (a non-NDArray or a sparse NDArray, a 0-d array
where dim 0 is concatenated or split, a reduce op reducescatter cannot run, alltoall splits
that are not 1-D integers, a ``root_rank`` that is not an int) are not raised where they are
found: refused on one rank alone, its peers would wait for it forever. The request is submitted
carrying the problem (a stand-in tensor where there is no NDArray to view) and every rank of the
set raises InvalidArgumentError (a ValueError, a RuntimeError and an MXNetError) when it waits,
naming the rank. What is wrong identically on every rank, or concerns no peer, is raised at
once: not initialized, a process set this rank cannot use, ``op`` together with ``average``.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from accord import engine
from accord.comm.ops import ReduceOp
from accord.engine import Op
from accord.errors import CollectiveError, with_hint
from accord.frontend import queries
from accord.frontend.process_sets import ProcessSet, global_process_set, set_id_of
from accord.mxnet.bridge import mx, mxnet_error, ndarray_problem, read_view, to_ndarray, write_view

Average, Sum, Adasum = ReduceOp.AVERAGE, ReduceOp.SUM, ReduceOp.ADASUM
Min, Max, Product = ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT


def op_name(op: Op, name: str | None) -> str | None:
    """Horovod's ``allreduce.<name>``; None for an unnamed call, which the session numbers
    (:mod:`accord.engine.naming`: one counter per process set, ``@ps<id>`` for other sets)."""
    return None if name is None else f"{op.value}.{name}"


def _as_op(op: Any, what: str) -> tuple[ReduceOp, str]:
    """``op`` as a ReduceOp, or (Sum, what is wrong with it)."""
    try:
        return ReduceOp(op), ""
    except (ValueError, TypeError):
        return Sum, with_hint(f"{what}: unknown reduce op {op!r}",
                              "use hvd.Average, hvd.Sum, hvd.Min, hvd.Max or hvd.Product")


def reduce_op(average: bool | None, op: Any, what: str = "allreduce") -> tuple[ReduceOp, str]:
    """Resolve Horovod's ``average=`` and accord's optional ``op=`` (default Average): the op,
    and what is wrong with ``op`` ("" when nothing; the caller's request carries it).

    Raises:
        ValueError: both given (the same call on every rank: no peer waits on a different one).
    """
    if op is not None:
        if average is not None:
            raise ValueError("The op parameter supersedes average. Please provide only one of them.")
        return _as_op(op, what)
    # Horovod passes average as ctypes.c_bool(average): any false value (0, False) sums
    return (Average if average is None or average else Sum), ""


def submit(op: Op, tensors: Sequence[torch.Tensor], name: str | None, process_set: ProcessSet, *,
           grouped: bool = False, problems: Sequence[str] = (), **kwargs: Any) -> list[Any]:
    """Submit one collective per tensor (one all-or-none group when ``grouped``); return the
    engine handles (wait with :func:`wait_all`). ``problems``: per tensor, what this rank
    refuses in its arguments ("" where nothing): such requests fail on every rank of the set.

    Raises:
        CollectiveError (also MXNetError): not initialized.
        ValueError: a request the engine refuses locally (a process set this rank cannot use).
    """
    if not engine.is_initialized():
        raise mxnet_error(CollectiveError(with_hint(queries.NOT_INITIALIZED, "call hvd.init() first")))
    sid = set_id_of(process_set)
    return engine.submit_group(op, list(tensors), op_name(op, name), process_set_id=sid,
                               grouped=grouped, problems=problems if any(problems) else None, **kwargs)


def wait_all(handles: Sequence[Any]) -> list[Any]:
    """Wait for every handle, even after one failed (none may still be writing afterwards);
    return the results, or raise the first error (as an MXNetError too)."""
    results, failure = [], None
    for h in handles:
        try:
            results.append(engine.synchronize(h))
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


def _stand_in() -> torch.Tensor:
    """What the engine gets for a refused argument: its request never runs, and there may be
    no NDArray to view."""
    return torch.empty(0)


def _ragged_problem(array: Any, what: str) -> str:
    """:func:`ndarray_problem`, or a 0-d array (these ops concatenate or split dim 0)."""
    problem = ndarray_problem(array, what)
    if not problem and array.ndim == 0:
        problem = with_hint(f"{what} needs an NDArray with at least one dimension, got a scalar "
                            f"(shape ())", "reshape it, e.g. array.reshape((1,))")
    return problem


# --- allreduce ----------------------------------------------------------------------------------

def _allreduce(tensors: list[Any], inplace: bool, what: str, average: bool | None, op: Any,
               name: str | None, prescale_factor: float, postscale_factor: float,
               process_set: ProcessSet, grouped: bool) -> list[Any]:
    """Allreduce ``tensors`` into themselves or into new NDArrays; return those."""
    rop, op_problem = reduce_op(average, op, what)
    problems = [ndarray_problem(t, what) or op_problem for t in tensors]
    views, outputs = [], []
    for t, problem in zip(tensors, problems):
        if problem:
            views.append(_stand_in())
            outputs.append(t)  # (never returned: every rank raises)
            continue
        o = t if inplace else mx.nd.empty(t.shape, ctx=t.context, dtype=t.dtype)
        view = write_view(o)
        if o is not t:
            view.copy_(read_view(t))
        views.append(view)
        outputs.append(o)
    run(Op.ALLREDUCE, views, name, process_set, grouped=grouped, in_place=True, reduce_op=rop,
        prescale_factor=prescale_factor, postscale_factor=postscale_factor, problems=problems)
    return outputs


def allreduce(tensor: Any, average: bool | None = None, name: str | None = None, priority: int = 0,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: ProcessSet = global_process_set, op: Any = None) -> Any:
    """Average (default) or sum ``tensor`` over the ranks; return a new NDArray.

    Args:
        tensor: a dense NDArray, the same shape and dtype on every rank.
        average: Horovod's switch: True or None averages, False sums.
        name: the collective's name, the same on every rank (``None``: numbered by call order).
        priority: accepted for Horovod's signature; ignored.
        prescale_factor: multiplies the input before the reduction.
        postscale_factor: multiplies the result after it.
        process_set: the ranks taking part (default: all); every member must call.
        op: accord's alternative to ``average``: ``hvd.Sum``, ``Average``, ``Min``, ``Max``
            or ``Product``.

    Returns:
        A new NDArray with the reduction, on ``tensor``'s context; ``tensor`` is unchanged.

    Raises:
        ValueError: both ``op`` and ``average`` were given.
        CollectiveError: not initialized, or the collective failed (also an MXNetError).
        InvalidArgumentError: an argument refused on this rank or on another rank of the set.
    """
    return _allreduce([tensor], False, "allreduce", average, op, name, prescale_factor,
                      postscale_factor, process_set, grouped=False)[0]


def allreduce_(tensor: Any, average: bool | None = None, name: str | None = None, priority: int = 0,
               prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               process_set: ProcessSet = global_process_set, op: Any = None) -> Any:
    """In-place :func:`allreduce`.

    Args:
        tensor: a dense NDArray, overwritten with the reduction.
        average: True or None: average; False: sum (Horovod's flag).
        name: a name every rank passes alike, or ``None`` to number the calls in order.
        priority: ignored (Horovod's argument).
        prescale_factor: factor applied to the input before reducing.
        postscale_factor: factor applied to the reduced values.
        process_set: which ranks reduce (the global set by default).
        op: the reduce op, instead of ``average`` (Sum, Average, Min, Max, Product).

    Returns:
        ``tensor``, now holding the reduction.

    Raises:
        ValueError: ``op`` given together with ``average``.
        CollectiveError: the engine is not running, or the reduction failed (an MXNetError too).
        InvalidArgumentError: ``tensor`` or ``op`` refused, here or on a peer.
    """
    _allreduce([tensor], True, "allreduce_", average, op, name, prescale_factor, postscale_factor,
               process_set, grouped=False)
    return tensor


def grouped_allreduce(tensors: Sequence[Any], average: bool | None = None, name: str | None = None,
                      priority: int = 0, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set, op: Any = None) -> list[Any]:
    """Allreduce a list of NDArrays as one group (fused); return new NDArrays.

    Args:
        tensors: the NDArrays, the same list (shapes, dtypes, order) on every rank; an empty
            list is returned as is.
        average: Horovod's flag (True/None average, False sums).
        name: the group's name, alike on every rank; ``None`` numbers it by call order.
        priority: not used.
        prescale_factor: each input is multiplied by it first.
        postscale_factor: each result is multiplied by it last.
        process_set: the participating ranks; all by default.
        op: how the values combine, in place of ``average``.

    Returns:
        One new NDArray per input, in order.

    Raises:
        ValueError: ``op`` and ``average`` both set.
        CollectiveError: accord is not initialized, or the group failed (as an MXNetError too).
        InvalidArgumentError: a refused array or op, on any rank of the set.
    """
    tensors = list(tensors)
    if not tensors:  # as Horovod (no request could carry an error to the peers)
        return tensors
    return _allreduce(tensors, False, "grouped_allreduce", average, op, name, prescale_factor,
                      postscale_factor, process_set, grouped=True)


def grouped_allreduce_(tensors: Sequence[Any], average: bool | None = None, name: str | None = None,
                       priority: int = 0, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: ProcessSet = global_process_set, op: Any = None) -> list[Any]:
    """In-place :func:`grouped_allreduce`.

    Args:
        tensors: NDArrays, each overwritten with its reduction.
        average: Horovod's deprecated choice between average (True, None) and sum (False).
        name: one name for the group, identical across ranks (or ``None``).
        priority: kept for compatibility; no effect.
        prescale_factor: scales the inputs before the reduction.
        postscale_factor: scales the outputs after it.
        process_set: the set whose members all make this call (default: every rank).
        op: a ReduceOp, exclusive with ``average``.

    Returns:
        ``tensors`` itself, reduced.

    Raises:
        ValueError: ``op`` is given with ``average``.
        CollectiveError: no ``init()``, or the collective failed (an MXNetError as well).
        InvalidArgumentError: arguments refused on this rank or a peer.
    """
    arrays = list(tensors)
    if arrays:
        _allreduce(arrays, True, "grouped_allreduce_", average, op, name, prescale_factor,
                   postscale_factor, process_set, grouped=True)
    return tensors


# --- allgather and broadcast --------------------------------------------------------------------

def _allgather(tensors: list[Any], name: str | None, process_set: ProcessSet, grouped: bool,
               what: str) -> list[Any]:
    problems = [_ragged_problem(t, what) for t in tensors]
    views = [_stand_in() if p else read_view(t) for t, p in zip(tensors, problems)]
    results = run(Op.ALLGATHER, views, name, process_set, grouped=grouped, problems=problems)
    return [to_ndarray(r) for r in results]


def allgather(tensor: Any, name: str | None = None, priority: int = 0,
              process_set: ProcessSet = global_process_set) -> Any:
    """Concatenate every rank's ``tensor`` along dimension 0 (first dimensions may differ).

    Args:
        tensor: this rank's rows (at least one dimension; the same dtype and trailing dims on
            every rank).
        name: the collective's name, the same on every rank, or ``None``.
        priority: accepted and ignored.
        process_set: the ranks whose rows are gathered (default: all).

    Returns:
        A new NDArray: the ranks' rows in rank order.

    Raises:
        CollectiveError: not initialized, or the allgather failed (also an MXNetError).
        InvalidArgumentError: ``tensor`` refused (not a dense NDArray, 0-d, or mismatched).
    """
    return _allgather([tensor], name, process_set, False, "allgather")[0]


def grouped_allgather(tensors: Sequence[Any], name: str | None = None, priority: int = 0,
                      process_set: ProcessSet = global_process_set) -> list[Any]:
    """:func:`allgather` of a list of NDArrays as one group.

    Args:
        tensors: this rank's arrays, each gathered along dim 0 (an empty list is returned).
        name: the group's name, alike on every rank.
        priority: Horovod's; unused.
        process_set: the participating ranks; all by default.

    Returns:
        One new NDArray per input.

    Raises:
        CollectiveError: accord is not running, or the group failed.
        InvalidArgumentError: an array refused here or on another rank.
    """
    tensors = list(tensors)
    if not tensors:
        return tensors
    return _allgather(tensors, name, process_set, True, "grouped_allgather")


def _broadcast(tensor: Any, root_rank: Any, name: str | None, process_set: ProcessSet, what: str) -> None:
    # (a root that is not an int is refused by the engine's request, on every rank)
    problem = ndarray_problem(tensor, what)
    view = _stand_in() if problem else write_view(tensor)
    run(Op.BROADCAST, [view], name, process_set, in_place=True, root_rank=root_rank, problems=[problem])


def broadcast_(tensor: Any, root_rank: int, name: str | None = None, priority: int = 0,
               process_set: ProcessSet = global_process_set) -> Any:
    """Overwrite ``tensor`` with ``root_rank``'s value (in place).

    Args:
        tensor: a dense NDArray of the same shape and dtype on every rank.
        root_rank: the global rank that sends.
        name: a name every rank passes alike, or ``None``.
        priority: ignored.
        process_set: the ranks taking part (default: all).

    Returns:
        ``tensor``, holding the root's value.

    Raises:
        CollectiveError: not initialized, or the broadcast failed (an MXNetError too).
        InvalidArgumentError: ``tensor`` or ``root_rank`` refused, on every rank of the set.
    """
    _broadcast(tensor, root_rank, name, process_set, "broadcast_")
    return tensor


def broadcast(tensor: Any, root_rank: int, name: str | None = None, priority: int = 0,
              process_set: ProcessSet = global_process_set) -> Any:
    """Return ``root_rank``'s ``tensor`` on every rank as a new NDArray (input unchanged).

    Args:
        tensor: root's data on the root; elsewhere an array of the same shape and dtype.
        root_rank: the global rank whose value everyone receives.
        name: the broadcast's name, identical across ranks (or ``None``).
        priority: not used.
        process_set: which ranks receive (the global set by default).

    Returns:
        A new NDArray with the root's value.

    Raises:
        CollectiveError: the engine is not initialized, or the collective failed.
        InvalidArgumentError: a refused array or root (raised on every rank).
    """
    copy = tensor.copy() if not ndarray_problem(tensor, "broadcast") else tensor
    _broadcast(copy, root_rank, name, process_set, "broadcast")
    return copy


# --- alltoall -----------------------------------------------------------------------------------

def alltoall(tensor: Any, splits: Any = None, name: str | None = None, priority: int = 0,
             process_set: ProcessSet = global_process_set) -> Any:
    """Send ``splits[i]`` rows of ``tensor`` to rank i of the set (equal parts without
    ``splits``, a list of ints or a 1-D int32 NDArray) and return the rows received; with
    ``splits`` also the received splits (an int32 NDArray), as Horovod does. Splits with the
    wrong count, a negative entry or a sum other than dim 0 fail on every rank of the set (the
    ranks exchange them before any data moves), and so do splits refused here.

    Args:
        tensor: the rows to send, in destination order along dim 0.
        splits: rows per destination rank, or ``None`` for equal parts.
        name: the collective's name, the same on every rank (``None``: numbered by call order).
        priority: accepted for Horovod's signature.
        process_set: the ranks exchanging rows (default: all).

    Returns:
        The received rows (a new NDArray), or ``(rows, received_splits)`` when ``splits``
        was given.

    Raises:
        CollectiveError: not initialized, or the exchange failed (also an MXNetError).
        InvalidArgumentError: bad splits or a refused array, on every rank of the set.
    """
    counts, split_problem = split_counts(splits)
    problem = _ragged_problem(tensor, "alltoall") or split_problem
    view = _stand_in() if problem else read_view(tensor)
    result, received = run(Op.ALLTOALL, [view], name, process_set, splits=counts, problems=[problem])[0]
    out = to_ndarray(result)
    if splits is None:
        return out
    return out, mx.nd.array([int(s) for s in received], dtype="int32")


def split_counts(splits: Any) -> tuple[list[int] | None, str]:
    """Rows per rank from Horovod's ``splits`` (None for None): a list of numbers (truncated to
    integers, as Horovod's conversion to int32 does) or a 1-D int32 NDArray; with what is wrong
    with them ("" when nothing): an NDArray of another dtype, more than one dimension (Horovod's
    core refuses both), or values that are not finite numbers."""
    if splits is None:
        return None, ""
    if isinstance(splits, mx.nd.NDArray):
        if np.dtype(splits.dtype) != np.int32:
            return None, with_hint(f"alltoall splits must hold 32-bit integers, got an NDArray of "
                                   f"{np.dtype(splits.dtype).name} {tuple(splits.shape)}",
                                   "pass splits.astype('int32') (or a list of ints)")
        values = splits.asnumpy()
    else:
        try:
            values = np.asarray(splits)
        except (ValueError, TypeError):  # e.g. ragged nested lists
            values = np.asarray(None)
        if values.dtype.kind not in "biuf" or not np.isfinite(values).all():
            return None, with_hint(f"alltoall splits must be numbers, got {splits!r}",
                                   "pass one row count per rank of the process set")
    if values.ndim > 1:
        return None, with_hint(f"alltoall splits must be 1-D, got shape {tuple(values.shape)}",
                               "pass one row count per rank of the process set")
    return [int(s) for s in values.reshape(-1)], ""


# --- reducescatter ------------------------------------------------------------------------------

def _reducescatter(tensors: list[Any], op: Any, name: str | None, process_set: ProcessSet,
                   prescale_factor: float, postscale_factor: float, grouped: bool, what: str) -> list[Any]:
    rop, op_problem = _as_op(op, what)
    if not op_problem and rop not in (Sum, Average):
        op_problem = with_hint(f"{what} supports only Sum and Average, got {rop.name}",
                               "use op=hvd.Sum or op=hvd.Average")
    problems = [_ragged_problem(t, what) or op_problem for t in tensors]
    views = [_stand_in() if p else read_view(t) for t, p in zip(tensors, problems)]
    results = run(Op.REDUCESCATTER, views, name, process_set, grouped=grouped,
                  reduce_op=Average if op_problem else rop, prescale_factor=prescale_factor,
                  postscale_factor=postscale_factor, problems=problems)
    return [to_ndarray(r) for r in results]


def reducescatter(tensor: Any, op: Any = Average, name: str | None = None, priority: int = 0,
                  process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> Any:
    """Reduce ``tensor`` over the ranks (Average or Sum) and return this rank's part of dim 0
    (the first ``dim0 % size`` ranks get one row more).

    Args:
        tensor: the same shape and dtype on every rank, at least one dimension.
        op: ``hvd.Average`` (default) or ``hvd.Sum``.
        name: the collective's name, alike on every rank, or ``None``.
        priority: ignored, as every priority.
        process_set: the ranks that reduce and share the result (default: all).
        prescale_factor: multiplies the input before the reduction.
        postscale_factor: multiplies this rank's part after it.

    Returns:
        A new NDArray: this rank's rows of the reduction.

    Raises:
        CollectiveError: accord is not initialized, or the reduction failed.
        InvalidArgumentError: another op, or an array refused here or on a peer.
    """
    return _reducescatter([tensor], op, name, process_set, prescale_factor, postscale_factor,
                          False, "reducescatter")[0]


def grouped_reducescatter(tensors: Sequence[Any], op: Any = Average, name: str | None = None,
                          priority: int = 0, process_set: ProcessSet = global_process_set,
                          prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> list[Any]:
    """:func:`reducescatter` of a list of NDArrays as one group.

    Args:
        tensors: the arrays, each scattered along dim 0 (an empty list is returned as is).
        op: Average unless given, or Sum.
        name: one name for the group, identical across ranks (or ``None``).
        priority: no effect.
        process_set: the participating ranks; all by default.
        prescale_factor: scales each input first.
        postscale_factor: scales each part last.

    Returns:
        This rank's part of each reduction, one new NDArray per input.

    Raises:
        CollectiveError: no ``init()`` yet, or the group failed.
        InvalidArgumentError: a refused op or array, on any rank of the set.
    """
    tensors = list(tensors)
    if not tensors:
        return tensors
    return _reducescatter(tensors, op, name, process_set, prescale_factor, postscale_factor,
                          True, "grouped_reducescatter")
