"""The asynchronous half of the Horovod collective API: every ``*_async`` function, ``join`` and
``barrier``. Each returns an integer handle for :func:`~accord.torch.gateway.poll` /
:func:`~accord.torch.gateway.synchronize` (except ``join`` and ``barrier``, which block).

Semantics follow Horovod 0.28: out-of-place variants leave the input untouched, in-place ones
(trailing underscore) write the result into it; ``root_rank`` is a global rank; a name given
here is prefixed with the op (``allreduce.<name>``), and unnamed requests are numbered.

Arguments that may be wrong on one rank only (a non-contiguous, sparse or 0-d tensor, a reduce
op or splits that do not fit) are not raised at submission: the request carries the problem
(``problems`` of :func:`accord.torch.gateway.start`) and every rank of the set raises
InvalidArgumentError (a ValueError and a RuntimeError) at ``synchronize()``, instead of this rank
alone raising while its peers wait for it forever. What is wrong identically on every rank
(an empty group, ``op`` with ``average``, Adasum on a set it does not support) is still raised
at submission.
"""
from __future__ import annotations

import warnings
from typing import Any, Sequence

import torch

from accord.comm.base_communicator import output_problem, overlap_rows, split_rows
from accord.comm.ops import ReduceOp
from accord.engine import Compressor, NoneCompressor
from accord.errors import with_hint
from accord.torch import adasum, gateway
from accord.torch.gateway import tensor_problem, wire
from accord.torch.process_sets import ProcessSet, global_process_set, set_id_of

Average, Sum, Adasum = ReduceOp.AVERAGE, ReduceOp.SUM, ReduceOp.ADASUM
Min, Max, Product = ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT


def handle_average_backwards_compatibility(op: Any, average: Any) -> ReduceOp:
    """Resolve Horovod's deprecated ``average=`` against ``op=`` (default Average)."""
    if op is not None:
        if average is not None:
            raise ValueError("The op parameter supersedes average. Please provide only one of them.")
        return ReduceOp(op)
    if average is not None:
        warnings.warn("Parameter `average` has been replaced with `op` and will be removed in v1.0",
                      DeprecationWarning, stacklevel=3)
        return Average if average else Sum
    return Average


def _check_adasum(process_set: ProcessSet) -> None:
    if process_set is not global_process_set and process_set.process_set_id != 0:
        raise NotImplementedError("Adasum does not support non-global process sets yet.")
    n = gateway.size()
    if n & (n - 1):
        raise NotImplementedError("Running Adasum with non-power of 2 ranks is not supported yet.")


def _first(results: list[Any]) -> Any:
    return results[0]


# --- allreduce ----------------------------------------------------------------------------------

def allreduce_tensors(tensors: Sequence[torch.Tensor], inplace: bool, name: str | None,
                      op: ReduceOp, prescale: float, postscale: float, process_set: ProcessSet,
                      grouped: bool,
                      compression: type[Compressor] | Compressor = NoneCompressor,
                      waited: bool = False) -> int:
    """Start an allreduce of ``tensors`` (one, or a group); the common path of every allreduce
    form. ``compression`` is applied by the engine (in place: cast while it moves the data).
    ``waited``: the caller synchronizes at once (the synchronous forms)."""
    what = "grouped_allreduce" if grouped else "allreduce"
    tensors = list(tensors)
    if grouped and not tensors:  # (no request could carry the error to the peers)
        raise ValueError(with_hint(f"{what} needs at least one tensor", "pass a non-empty list"))
    problems = [tensor_problem(t, what) for t in tensors]
    set_id = set_id_of(process_set)
    if op == Adasum:
        _check_adasum(process_set)
        return adasum.start(tensors, inplace, name, prescale, postscale, set_id, grouped, compression,
                            problems)

    def finish(results: list[Any]) -> Any:
        values = tensors if inplace else results
        return list(values) if grouped else values[0]

    return gateway.start("allreduce", [wire(t) for t in tensors], name, set_id, finish,
                         grouped=grouped, keep=tuple(tensors), in_place=inplace,
                         compression=compression, reduce_op=op, prescale_factor=prescale,
                         postscale_factor=postscale, waited=waited, problems=problems)


def allreduce_async(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                    op: ReduceOp | None = None, prescale_factor: float = 1.0,
                    postscale_factor: float = 1.0,
                    process_set: ProcessSet = global_process_set) -> int:
    """Start averaging/summing ``tensor`` over the ranks of ``process_set``; the input is not
    modified. Returns a handle for ``poll()``/``synchronize()`` (which returns the result).

    Args:
        tensor: the input, the same shape and dtype on every rank; CPU or CUDA.
        average: Horovod's deprecated flag (True: ``op=Average``, False: ``op=Sum``).
        name: the collective's name, the same on every rank (``None``: numbered by call order).
        op: ``hvd.Average`` (default), ``Sum``, ``Min``, ``Max``, ``Product`` or ``Adasum``.
        prescale_factor: multiplies the input before the reduction.
        postscale_factor: multiplies the result after it.
        process_set: the ranks taking part (default: all); every member must call.

    Returns:
        A handle for ``poll()`` and ``synchronize()``, which returns the result
            or raises the collective's error.
    """
    op = handle_average_backwards_compatibility(op, average)
    return allreduce_tensors([tensor], False, name, op, prescale_factor, postscale_factor,
                             process_set, grouped=False)


def allreduce_async_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                     op: ReduceOp | None = None, prescale_factor: float = 1.0,
                     postscale_factor: float = 1.0,
                     process_set: ProcessSet = global_process_set) -> int:
    """In-place :func:`allreduce_async`: ``synchronize()`` returns ``tensor``, now reduced.

    Args:
        tensor: reduced in place; same shape and dtype on every rank.
        average: deprecated, as in Horovod: True means Average, False Sum.
        name: a name every rank passes alike, or ``None`` to number the calls in order.
        op: the reduction (default Average; Sum, Min, Max, Product, Adasum).
        prescale_factor: factor applied to ``tensor`` before reducing.
        postscale_factor: factor applied to the reduced values.
        process_set: which ranks reduce (the global set by default).

    Returns:
        A handle for ``poll()`` and ``synchronize()``, which returns the result
            or raises the collective's error.
    """
    op = handle_average_backwards_compatibility(op, average)
    return allreduce_tensors([tensor], True, name, op, prescale_factor, postscale_factor,
                             process_set, grouped=False)


def grouped_allreduce_async(tensors: Sequence[torch.Tensor], average: bool | None = None,
                            name: str | None = None, op: ReduceOp | None = None,
                            prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: ProcessSet = global_process_set) -> int:
    """Allreduce a list of tensors as one group; ``synchronize()`` returns a list of results.

    Args:
        tensors: the inputs; each the same shape and dtype on every rank, left unmodified.
        average: the old Horovod switch for ``op`` (True Average, False Sum).
        name: the group's name, alike on every rank; ``None`` numbers it by call order.
        op: how the values combine: Average (the default), Sum, Min, Max, Product or Adasum.
        prescale_factor: each input is multiplied by it first.
        postscale_factor: each result is multiplied by it last.
        process_set: the participating ranks; all by default.

    Raises:
        ValueError: ``tensors`` is an empty list.

    Returns:
        A handle for ``poll()`` and ``synchronize()``, which returns the result
            or raises the collective's error.
    """
    op = handle_average_backwards_compatibility(op, average)
    return allreduce_tensors(tensors, False, name, op, prescale_factor, postscale_factor,
                             process_set, grouped=True)


def grouped_allreduce_async_(tensors: Sequence[torch.Tensor], average: bool | None = None,
                             name: str | None = None, op: ReduceOp | None = None,
                             prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                             process_set: ProcessSet = global_process_set) -> int:
    """In-place :func:`grouped_allreduce_async`.

    Args:
        tensors: each is overwritten with its reduction (``synchronize()`` returns them).
        average: Horovod's deprecated alternative to ``op``.
        name: one name for the group, identical across ranks (or ``None``).
        op: Average unless given; also Sum, Min, Max, Product, Adasum.
        prescale_factor: scales the inputs before the reduction.
        postscale_factor: scales the outputs after the reduction.
        process_set: the set whose members all make this call (default: every rank).

    Raises:
        ValueError: no tensors were given.

    Returns:
        A handle for ``poll()`` and ``synchronize()``, which returns the result
            or raises the collective's error.
    """
    op = handle_average_backwards_compatibility(op, average)
    return allreduce_tensors(tensors, True, name, op, prescale_factor, postscale_factor,
                             process_set, grouped=True)


def sparse_allreduce_async(tensor: torch.Tensor, name: str, op: ReduceOp,
                           process_set: ProcessSet = global_process_set):
    """Reduce a sparse COO tensor by allgathering its indices and values (Horovod's method).

    No ``average``/scale factors here: ``hvd.allreduce`` of a sparse tensor comes through this
    path with those already resolved.

    Args:
        tensor: a sparse COO tensor (coalesced here if it is not); the same dense shape on
            every rank, any number of non-zero entries.
        name: the base of the two allgathers' names (``name.indices``, ``name.values``).
        op: ``hvd.Average`` or ``hvd.Sum``.
        process_set: the ranks taking part (default: all).

    Returns:
        (Callable[[], torch.Tensor]): a function; calling it (or passing it to ``synchronize``)
            waits and returns the aggregated sparse tensor (values divided by the set size for
            Average).
    """
    t = tensor.coalesce() if not tensor.is_coalesced() else tensor
    indices_handle = allgather_async(t._indices().transpose(0, 1).contiguous(),
                                     name=f"{name}.indices", process_set=process_set)
    values_handle = allgather_async(t._values().contiguous(), name=f"{name}.values",
                                    process_set=process_set)

    def wait() -> torch.Tensor:
        values = gateway.synchronize(values_handle)
        indices = gateway.synchronize(indices_handle)
        if op == Average:
            values = values / len(gateway.process_set_members(set_id_of(process_set)))
        return torch.sparse_coo_tensor(indices.transpose(0, 1), values, t.size(), check_invariants=False)

    return wait


# --- allgather ----------------------------------------------------------------------------------

def _ragged_problem(tensor: torch.Tensor, what: str) -> str:
    """:func:`tensor_problem`, or a 0-d tensor (ragged ops concatenate or split dim 0)."""
    problem = tensor_problem(tensor, what)
    if not problem and tensor.dim() == 0:
        problem = with_hint(f"{what} needs a tensor with at least one dimension, got a scalar (shape [])",
                            "reshape it, e.g. tensor.reshape(1)")
    return problem


def _output_problem(output: Any, tensor: torch.Tensor, what: str, set_id: int, scatter: bool) -> str:
    """What is wrong with the output a caller gave an allgather (``scatter`` False) or a
    reducescatter ("" when nothing, or when the input's own problem is raised instead).

    A reducescatter's output is checked whole here (this rank's rows follow from the set's
    size); an allgather's dims after dim 0 only: its total rows, and the row at which an input
    inside its output starts, are checked by the communicator once the ranks exchanged them.
    """
    if output is None or tensor_problem(tensor, what) or not isinstance(tensor, torch.Tensor) or tensor.dim() == 0:
        return ""
    gateway.require_initialized()  # (what submitting would raise first)
    shape = None
    if scatter:
        members = gateway.process_set_members(set_id)
        me = gateway.rank()
        if me not in members:  # (refused by the engine with its own message)
            return ""
        rows = split_rows(tensor.shape[0], len(members))
        shape = (rows[members.index(me)], *tensor.shape[1:])
    problem = output_problem(what, output, tensor.dtype, tensor.device, shape, tensor.shape[1:])
    if problem:
        return problem
    at = overlap_rows(output, tensor) if scatter else overlap_rows(tensor, output)
    if scatter and at not in (-1, sum(rows[:members.index(me)])):
        return with_hint(f"{what}: the output overlaps the input other than as this rank's own rows of it",
                         "pass an output of its own, or exactly this rank's rows of the input")
    if not scatter and at is None:
        return with_hint(f"{what}: the input overlaps the output other than as a block of whole rows",
                         "pass an output of its own, or the input as this rank's rows of the output")
    return ""


def _outputs(outputs: Sequence[torch.Tensor | None] | None, count: int, what: str) -> list[Any] | None:
    """The caller's outputs, one per tensor (None: results are new tensors)."""
    if outputs is None:
        return None
    outputs = list(outputs)
    if len(outputs) != count:  # (the same on every rank that passes the same lists)
        raise ValueError(with_hint(f"{what} got {len(outputs)} outputs for {count} tensors",
                                   "pass one output per tensor (or None)"))
    return outputs


def _given(outs: list[Any] | None, grouped: bool) -> Any:
    """The finish of a call with outputs: the caller's own output objects (the engine got
    detached aliases of them), the engine's results where none was given."""
    if outs is None:
        return list if grouped else _first

    def finish(results: list[Any]) -> Any:
        values = [r if o is None else o for o, r in zip(outs, results)]
        return values if grouped else values[0]

    return finish


def _check_group(tensors: Sequence[torch.Tensor], what: str) -> list[torch.Tensor]:
    tensors = list(tensors)
    if not tensors:
        raise ValueError(with_hint(f"{what} needs at least one tensor", "pass a non-empty list"))
    return tensors


def allgather_async(tensor: torch.Tensor, name: str | None = None,
                    process_set: ProcessSet = global_process_set,
                    output: torch.Tensor | None = None) -> int:
    """Start concatenating every rank's ``tensor`` along dim 0 (first dims may differ).

    Args:
        tensor: this rank's rows; the same dtype and trailing dims on every rank.
        name: the collective's name, the same on every rank (``None``: numbered by call order).
        process_set: the ranks whose rows are gathered (default: all).
        output: where the result goes (``synchronize()`` returns it): contiguous, ``tensor``'s
            dtype and device, shape [every rank's rows summed, *tensor.shape[1:]]; ``tensor``
            may be this rank's own rows of it (in place). None: a new tensor. A wrong output
            raises InvalidArgumentError at ``synchronize()`` on every rank of the set.

    Returns:
        A handle for ``poll()`` and ``synchronize()``, which returns the result
            or raises the collective's error.
    """
    set_id = set_id_of(process_set)
    problem = _ragged_problem(tensor, "allgather") or _output_problem(output, tensor, "allgather", set_id, False)
    return gateway.start("allgather", [wire(tensor)], name, set_id, _given(None if output is None else [output], False),
                         keep=(tensor, output), problems=[problem],
                         outputs=None if output is None else [wire(output)])


def grouped_allgather_async(tensors: Sequence[torch.Tensor], name: str | None = None,
                            process_set: ProcessSet = global_process_set,
                            outputs: Sequence[torch.Tensor | None] | None = None) -> int:
    """Allgather a list of tensors as one group; ``synchronize()`` returns a list.

    Args:
        tensors: this rank's inputs, gathered each along dim 0 (a non-empty list).
        name: the group's name, alike on every rank, or ``None``.
        process_set: the participating ranks; all by default.
        outputs: one output per tensor (or None for a new result), as ``output`` of
            :func:`allgather_async`; None: every result is a new tensor.

    Raises:
        ValueError: ``tensors`` is empty, or ``outputs`` has another length.

    Returns:
        A handle for ``poll()`` and ``synchronize()``, which returns the result
            or raises the collective's error.
    """
    what = "grouped_allgather"
    tensors = _check_group(tensors, what)
    outs = _outputs(outputs, len(tensors), what)
    set_id = set_id_of(process_set)
    problems = [_ragged_problem(t, what) or _output_problem(o, t, what, set_id, False)
                for t, o in zip(tensors, outs or [None] * len(tensors))]
    return gateway.start("allgather", [wire(t) for t in tensors], name, set_id,
                         _given(outs, True), grouped=True, keep=(*tensors, *(outs or ())), problems=problems,
                         outputs=None if outs is None else [None if o is None else wire(o) for o in outs])


# --- broadcast ----------------------------------------------------------------------------------

def _broadcast_async(tensor: torch.Tensor, root_rank: int, name: str | None,
                     process_set: ProcessSet, inplace: bool) -> int:
    # (a root that is not an int is refused by the engine's request, on every rank)
    problem = tensor_problem(tensor, "broadcast")
    finish = (lambda results: tensor) if inplace else _first
    return gateway.start("broadcast", [wire(tensor)], name, set_id_of(process_set), finish,
                         keep=(tensor,), in_place=inplace, root_rank=root_rank, problems=[problem])


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> int:
    """Start broadcasting ``tensor`` from global rank ``root_rank``; the input is not modified.

    Args:
        tensor: root's data on ``root_rank``; on the others, a tensor of the same shape and dtype.
        root_rank: the global rank whose value everyone receives (a member of the set).
        name: a name every rank passes alike, or ``None`` to number the calls in order.
        process_set: the ranks taking part (default: all).

    Returns:
        A handle for ``poll()`` and ``synchronize()``, which returns the result
            or raises the collective's error.
    """
    return _broadcast_async(tensor, root_rank, name, process_set, inplace=False)


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> int:
    """In-place :func:`broadcast_async`: ``tensor`` receives root's value.

    Args:
        tensor: overwritten with root's value on every other rank.
        root_rank: the sending rank (global numbering).
        name: the broadcast's name, identical across ranks (or ``None``).
        process_set: which ranks receive (the global set by default).

    Returns:
        A handle for ``poll()`` and ``synchronize()``, which returns the result
            or raises the collective's error.
    """
    return _broadcast_async(tensor, root_rank, name, process_set, inplace=True)


# --- alltoall -----------------------------------------------------------------------------------

def _splits_list(splits: Any) -> tuple[list[int] | None, str]:
    """(the splits as ints, or None; what is wrong with them, "" when nothing)."""
    if splits is None:
        return None, ""
    if isinstance(splits, torch.Tensor):
        if splits.dim() != 1 or splits.is_floating_point() or splits.is_complex():
            return None, with_hint(f"splits must be a 1-D integer tensor, got {splits.dtype} of shape "
                                   f"{list(splits.shape)}", "pass one row count per rank, e.g. torch.tensor([2, 1])")
        return [int(v) for v in splits.tolist()], ""
    try:
        values = list(splits)
    except TypeError:  # (not iterable: refused with the request, as other bad splits)
        return None, with_hint(f"splits must be a list of integers, got {type(splits).__name__}",
                               "pass one row count per rank, e.g. [2, 1]")
    if any(not isinstance(v, int) or isinstance(v, bool) for v in values):
        return None, with_hint(f"splits must be integers, got {values!r}", "pass one row count per rank")
    return values, ""


def alltoall_async(tensor: torch.Tensor, splits: Any = None, name: str | None = None,
                   process_set: ProcessSet = global_process_set) -> int:
    """Start sending ``splits[i]`` rows of ``tensor`` to rank i of the set (even split when None).

    ``synchronize()`` returns ``(output, received_splits)``; ``received_splits`` is an int32
    tensor (or the dtype of a ``splits`` tensor). Splits with the wrong count, a negative entry
    or a sum other than dim 0 raise InvalidArgumentError at ``synchronize()`` on every rank of
    the set, naming the ranks that passed them; so do splits that are not integers and a 0-d
    or non-contiguous tensor.

    Args:
        tensor: the rows to send, in destination order along dim 0.
        splits: rows per destination rank (a list or 1-D integer tensor, one entry per
            member of the set), or ``None`` for an even split.
        name: the collective's name, the same on every rank (``None``: numbered by call order).
        process_set: the ranks exchanging rows (default: all).

    Returns:
        A handle for ``poll()`` and ``synchronize()``, which returns the result
            or raises the collective's error.
    """
    # Splits are per-rank data: their counts and sums are checked when the ranks exchange
    # them before any data moves (accord.comm.agreement), so that bad splits on one rank fail
    # the call everywhere. Refused here, that rank would never submit it and its peers would
    # wait for it until a stall shutdown; splits that are not integers are refused by the
    # negotiation instead (the request carries the problem).
    split_values, split_problem = _splits_list(splits)
    set_id = set_id_of(process_set)
    out_dtype = splits.dtype if isinstance(splits, torch.Tensor) else torch.int32

    def finish(results: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
        output, received = results[0]
        return output, torch.tensor(list(received), dtype=out_dtype)

    return gateway.start("alltoall", [wire(tensor)], name, set_id, finish, keep=(tensor,),
                         splits=split_values,
                         problems=[_ragged_problem(tensor, "alltoall") or split_problem])


# --- reducescatter ------------------------------------------------------------------------------

def _reducescatter_problem(tensor: torch.Tensor, op: ReduceOp, what: str) -> str:
    """:func:`tensor_problem`, a 0-d tensor, or a reduce op other than Sum and Average."""
    problem = tensor_problem(tensor, what)
    if not problem and tensor.dim() == 0:
        problem = with_hint(f"{what} cannot scatter a scalar tensor (shape [])",
                            "pass a tensor with at least one dimension")
    if not problem and op not in (Sum, Average):
        problem = with_hint(f"{what} supports only Sum and Average, got {ReduceOp(op).name}",
                            "use op=hvd.Sum or op=hvd.Average")
    return problem


def reducescatter_tensors(tensors: Sequence[torch.Tensor], name: str | None, op: ReduceOp,
                          process_set: ProcessSet, prescale: float, postscale: float, grouped: bool,
                          compression: type[Compressor] | Compressor = NoneCompressor,
                          outputs: Sequence[torch.Tensor | None] | None = None) -> int:
    """Start a reducescatter of ``tensors`` (one, or a group); ``compression`` by the engine;
    ``outputs``: per tensor, where its share goes (see :func:`reducescatter_async`)."""
    what = "grouped_reducescatter" if grouped else "reducescatter"
    op = ReduceOp(op)
    tensors = _check_group(tensors, what) if grouped else list(tensors)
    outs = _outputs(outputs, len(tensors), what)
    set_id = set_id_of(process_set)
    problems = [_reducescatter_problem(t, op, what) or _output_problem(o, t, what, set_id, True)
                for t, o in zip(tensors, outs or [None] * len(tensors))]
    return gateway.start("reducescatter", [wire(t) for t in tensors], name,
                         set_id, _given(outs, grouped), grouped=grouped,
                         keep=(*tensors, *(outs or ())), reduce_op=op, prescale_factor=prescale,
                         postscale_factor=postscale, compression=compression, problems=problems,
                         outputs=None if outs is None else [None if o is None else wire(o) for o in outs])


def reducescatter_async(tensor: torch.Tensor, name: str | None = None, op: ReduceOp = Average,
                        process_set: ProcessSet = global_process_set,
                        prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                        output: torch.Tensor | None = None) -> int:
    """Start reducing ``tensor`` over the set and scattering dim 0 (lower ranks get extra rows).

    Args:
        tensor: the input, the same shape and dtype on every rank (at least one dimension).
        name: the collective's name, alike on every rank, or ``None``.
        op: ``hvd.Average`` (default) or ``hvd.Sum``.
        process_set: the ranks that reduce and share the result (default: all).
        prescale_factor: multiplies the input before the reduction.
        postscale_factor: multiplies this rank's share after it.
        output: where this rank's share goes (``synchronize()`` returns it): contiguous,
            ``tensor``'s dtype and device, shaped like this rank's rows; it may be exactly those
            rows of ``tensor`` (in place). None: a new tensor. A wrong output raises
            InvalidArgumentError at ``synchronize()`` on every rank of the set.

    Returns:
        A handle for ``poll()`` and ``synchronize()``, which returns the result
            or raises the collective's error.
    """
    return reducescatter_tensors([tensor], name, op, process_set, prescale_factor,
                                 postscale_factor, grouped=False,
                                 outputs=None if output is None else [output])


def grouped_reducescatter_async(tensors: Sequence[torch.Tensor], name: str | None = None,
                                op: ReduceOp = Average,
                                process_set: ProcessSet = global_process_set,
                                prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                                outputs: Sequence[torch.Tensor | None] | None = None) -> int:
    """Reducescatter a list of tensors as one group; ``synchronize()`` returns a list.

    Args:
        tensors: the inputs, each scattered along dim 0 (a non-empty list).
        name: one name for the group, identical across ranks (or ``None``).
        op: Average unless given, or Sum.
        process_set: the participating ranks; all by default.
        prescale_factor: scales each input first.
        postscale_factor: scales each share last.
        outputs: one output per tensor (or None for a new share), as ``output`` of
            :func:`reducescatter_async`; None: every share is a new tensor.

    Raises:
        ValueError: the list of tensors is empty, or ``outputs`` has another length.

    Returns:
        A handle for ``poll()`` and ``synchronize()``, which returns the result
            or raises the collective's error.
    """
    return reducescatter_tensors(tensors, name, op, process_set, prescale_factor,
                                 postscale_factor, grouped=True, outputs=outputs)


# --- barrier and join ---------------------------------------------------------------------------

def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Block until every rank of ``process_set`` has reached the barrier.

    Args:
        process_set: the ranks that wait for each other (default: all).

    Raises:
        CollectiveError: a rank died or the engine stopped while waiting.
    """
    handle = gateway.start("barrier", [None], None, set_id_of(process_set), lambda results: None)
    gateway.synchronize(handle)


def join(device: int = -1) -> int:
    """Declare that this rank has no more data; block until every rank has joined.

    While joined, this rank takes part in the collectives the others still submit with zeros
    (Average still divides by the full size). Returns the rank that joined last.

    Args:
        device: the CUDA device index of the zeros this rank contributes to CUDA collectives
            while joined (-1: the current device), as in Horovod.

    Returns:
        The global rank that joined last, the same on every rank.

    Raises:
        ValueError: accord is not initialized (Horovod's message).
    """
    return gateway.join(device)
