"""``broadcast_parameters`` (dicts and Gluon ParameterDicts, deferred-init parameters
included), ``broadcast_object`` and ``allgather_object``.

Objects travel only over the job's data plane, as sealed pickles bound to the call, exactly as
accord.torch's (:mod:`accord.frontend.object_collectives` says what is checked before anything is unpickled).
"""
from __future__ import annotations

import numbers
import types
from typing import Any

from accord import engine
from accord.errors import AccordError, CollectiveError, InvalidArgumentError, with_hint
from accord.frontend import object_collectives as objects
from accord.frontend import queries
from accord.frontend.process_sets import ProcessSet, global_process_set, set_id_of
from accord.mxnet.bridge import mx, mxnet_error
from accord.mxnet.mpi_ops import broadcast_


def broadcast_parameters(params: Any, root_rank: int = 0, prefix: str | None = None) -> None:
    """Overwrite every rank's parameters with ``root_rank``'s, in place.

    Args:
        params: a dict of NDArrays (``Module.get_params()``) or Parameters, or a Gluon
            ``ParameterDict`` (``net.collect_params()``). Parameters whose initialization is
            deferred (shape unknown until the first forward) are broadcast right after they
            are initialized.
        root_rank: the global rank whose values everyone receives.
        prefix: prepended to the names (two calls in one program need different prefixes).

    Raises:
        ValueError: ``params`` is neither a dict nor a ParameterDict, or ``prefix`` is not a
            str or None.
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
    if queries.size() == 1:
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


def root_of(root_rank: Any) -> tuple[int, str]:
    """``root_rank`` as an int, or (-1, what is wrong with it): Horovod passes it to C as an
    int, which refuses floats and strings (``int()`` would have truncated 0.5 silently)."""
    if isinstance(root_rank, numbers.Integral) and not isinstance(root_rank, bool):
        return int(root_rank), ""
    return -1, with_hint(f"root_rank must be an int, got {root_rank!r}",
                         "pass the global rank that holds the value")



def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """Return ``root_rank``'s ``obj`` on every rank of the set (pickled; see the module note).

    A ``root_rank`` that is not an int fails on every rank of the set: this rank takes part
    with root -1, which no peer passes (a MismatchError there, naming the roots) and no set
    holds, and raises InvalidArgumentError itself. (Raised before taking part, its peers would
    wait for it forever; passed on as it is, the engine cannot encode it.)

    Args:
        obj: any picklable object (used on the root; the others may pass None).
        root_rank: the global rank that sends it.
        name: the collective's name, the same on every rank (``None``: numbered by call order).
        process_set: the ranks taking part (default: all).

    Returns:
        The root's object (the root gets its own ``obj`` back).

    Raises:
        CollectiveError: not initialized, or the broadcast failed (also an MXNetError).
        InvalidArgumentError: ``root_rank`` is not an int.
    """
    if not engine.is_initialized():
        raise mxnet_error(CollectiveError(with_hint(queries.NOT_INITIALIZED, "call hvd.init() first")))
    root, problem = root_of(root_rank)
    try:
        return objects.broadcast_object(obj, root, name, set_id_of(process_set))
    except AccordError as exc:
        if problem:
            raise mxnet_error(InvalidArgumentError(f"broadcast_object: {problem}")) from exc
        raise mxnet_error(exc) from None


def allgather_object(obj: Any, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> list[Any]:
    """Return every rank's ``obj`` in rank order (pickled; see the module note).

    Args:
        obj: this rank's picklable object.
        name: a name every rank passes alike, or ``None``.
        process_set: the ranks whose objects are gathered (default: all).

    Returns:
        One object per rank of the set, in rank order.

    Raises:
        CollectiveError: accord is not initialized, or the allgather failed (an MXNetError too).
    """
    if not engine.is_initialized():
        raise mxnet_error(CollectiveError(with_hint(queries.NOT_INITIALIZED, "call hvd.init() first")))
    try:
        return objects.allgather_object(obj, name, set_id_of(process_set))
    except AccordError as exc:
        raise mxnet_error(exc) from None
