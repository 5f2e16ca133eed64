"""The asynchronous half of the Horovod collective API: every ``*_async`` function, ``join`` and
``barrier``. Each returns an integer handle for :func:`~accord.torch.handles.poll` /
:func:`~accord.torch.handles.synchronize` (except ``join`` and ``barrier``, which block).

Semantics follow Horovod 0.28: out-of-place variants leave the input untouched, in-place ones
(trailing underscore) write the result into it; ``root_rank`` is a global rank; a name given
here is prefixed with the op (``allreduce.<name>``), and unnamed requests are numbered.
"""
from __future__ import annotations

import warnings
from typing import Any, Sequence

import torch

from accord.comm.ops import ReduceOp
from accord.engine.request import Op, Request
from accord.errors import with_hint
from accord.torch import adasum, basics, handles
from accord.torch.process_sets import ProcessSet, global_process_set

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


def _set_id(process_set: ProcessSet) -> int:
    if process_set.process_set_id is None:
        raise ValueError(with_hint(f"{process_set} is not registered",
                                   "pass it to hvd.init(process_sets=[...]) or hvd.add_process_set()"))
    return process_set.process_set_id


def _check_adasum(process_set: ProcessSet) -> None:
    if process_set is not global_process_set and process_set.process_set_id != 0:
        raise NotImplementedError("Adasum does not support non-global process sets yet.")
    n = basics.size()
    if n & (n - 1):
        raise NotImplementedError("Running Adasum with non-power of 2 ranks is not supported yet.")


# --- allreduce ----------------------------------------------------------------------------------

def _allreduce_requests(tensors: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor | None],
                        names: Sequence[str], op: ReduceOp, prescale: float, postscale: float,
                        set_id: int, wire_dtype: torch.dtype | None = None) -> list[Request]:
    return [Request(name=n, op=Op.ALLREDUCE, tensor=t, output=o, reduce_op=op,
                    prescale_factor=prescale, postscale_factor=postscale, process_set_id=set_id,
                    owned=o is not None, wire_dtype=wire_dtype)
            for t, o, n in zip(tensors, outputs, names)]


def _allreduce_async(tensors: list[torch.Tensor], inplace: bool, names: list[str], handle: int,
                     op: ReduceOp, prescale: float, postscale: float, process_set: ProcessSet,
                     grouped: bool, wire_dtype: torch.dtype | None = None) -> int:
    set_id = _set_id(process_set)
    if op == Adasum:
        _check_adasum(process_set)
        return adasum.submit(handle, tensors, inplace, names, prescale, postscale, set_id, grouped)
    # The engine sees detached aliases (same memory): its thread runs with grad mode on and must
    # neither record autograd history nor trip the in-place check on leaves (parameters).
    sources = [t.detach() for t in tensors]
    outputs = sources if inplace else [None] * len(tensors)
    reqs = _allreduce_requests(sources, outputs, names, op, prescale, postscale, set_id, wire_dtype)

    def finish(results: list[Any]) -> Any:
        values = list(tensors) if inplace else results
        return values if grouped else values[0]

    return handles.submit(handle, reqs, finish, keep=tuple(tensors))


def _check_group(tensors: Sequence[torch.Tensor], what: str) -> list[torch.Tensor]:
    tensors = list(tensors)
    if not tensors:
        raise ValueError(with_hint(f"{what} needs at least one tensor", "pass a non-empty list"))
    for t in tensors:
        handles.check_tensor(t, what)
    return tensors


def _allreduce_one(tensor: torch.Tensor, inplace: bool, name: str | None, op: ReduceOp,
                   prescale: float, postscale: float, process_set: ProcessSet,
                   wire_dtype: torch.dtype | None = None) -> int:
    # The public functions resolve ``op`` themselves: the deprecation warning's stacklevel
    # points at their caller.
    handles.check_tensor(tensor, "allreduce")
    h = handles.allocate()
    names = [handles.op_name("allreduce", name, _set_id(process_set))]
    return _allreduce_async([tensor], inplace, names, h, op, prescale, postscale, process_set,
                            grouped=False, wire_dtype=wire_dtype)


def _allreduce_group(tensors: Sequence[torch.Tensor], inplace: bool, name: str | None,
                     op: ReduceOp, prescale: float, postscale: float,
                     process_set: ProcessSet, wire_dtype: torch.dtype | None = None) -> int:
    tensors = _check_group(tensors, "grouped_allreduce")
    h = handles.allocate()
    names = handles.group_names("allreduce", name, len(tensors), _set_id(process_set))
    return _allreduce_async(tensors, inplace, names, h, op, prescale, postscale, process_set,
                            grouped=True, wire_dtype=wire_dtype)


def allreduce_cast_async_(tensor: torch.Tensor, wire_dtype: torch.dtype, name: str | None = None,
                          op: ReduceOp = Average, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0,
                          process_set: ProcessSet = global_process_set) -> int:
    """accord's extension for compressed gradients: an in-place allreduce whose data travels
    and is summed as ``wire_dtype`` (float16/bfloat16). The engine casts on its way in and out,
    in place of three passes over the tensor (compress, send, decompress). ``tensor`` must be
    floating; ``synchronize()`` returns it, reduced."""
    return _allreduce_one(tensor, True, name, op, prescale_factor, postscale_factor,
                          process_set, wire_dtype)


def grouped_allreduce_cast_async_(tensors: Sequence[torch.Tensor], wire_dtype: torch.dtype,
                                  name: str | None = None, op: ReduceOp = Average,
                                  prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                                  process_set: ProcessSet = global_process_set) -> int:
    """The grouped form of :func:`allreduce_cast_async_`; ``synchronize()`` returns the list."""
    return _allreduce_group(tensors, True, name, op, prescale_factor, postscale_factor,
                            process_set, wire_dtype)


def allreduce_async(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                    op: ReduceOp | None = None, prescale_factor: float = 1.0,
                    postscale_factor: float = 1.0,
                    process_set: ProcessSet = global_process_set) -> int:
    """Start averaging/summing ``tensor`` over the ranks of ``process_set``; the input is not
    modified. Returns a handle for ``poll()``/``synchronize()`` (which returns the result)."""
    op = handle_average_backwards_compatibility(op, average)
    return _allreduce_one(tensor, False, name, op, prescale_factor, postscale_factor, process_set)


def allreduce_async_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                     op: ReduceOp | None = None, prescale_factor: float = 1.0,
                     postscale_factor: float = 1.0,
                     process_set: ProcessSet = global_process_set) -> int:
    """In-place :func:`allreduce_async`: ``synchronize()`` returns ``tensor``, now reduced."""
    op = handle_average_backwards_compatibility(op, average)
    return _allreduce_one(tensor, True, name, op, prescale_factor, postscale_factor, process_set)


def grouped_allreduce_async(tensors: Sequence[torch.Tensor], average: bool | None = None,
                            name: str | None = None, op: ReduceOp | None = None,
                            prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: ProcessSet = global_process_set) -> int:
    """Allreduce a list of tensors as one group; ``synchronize()`` returns a list of results."""
    op = handle_average_backwards_compatibility(op, average)
    return _allreduce_group(tensors, False, name, op, prescale_factor, postscale_factor,
                            process_set)


def grouped_allreduce_async_(tensors: Sequence[torch.Tensor], average: bool | None = None,
                             name: str | None = None, op: ReduceOp | None = None,
                             prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                             process_set: ProcessSet = global_process_set) -> int:
    """In-place :func:`grouped_allreduce_async`."""
    op = handle_average_backwards_compatibility(op, average)
    return _allreduce_group(tensors, True, name, op, prescale_factor, postscale_factor,
                            process_set)


def sparse_allreduce_async(tensor: torch.Tensor, name: str, op: ReduceOp,
                           process_set: ProcessSet = global_process_set):
    """Reduce a sparse COO tensor by allgathering its indices and values (Horovod's method).

    Returns a function; calling it (or passing it to ``synchronize``) waits and returns the
    aggregated sparse tensor (values divided by the set size for Average).
    """
    t = tensor.coalesce() if not tensor.is_coalesced() else tensor
    indices_handle = allgather_async(t._indices().transpose(0, 1).contiguous(),
                                     name=f"{name}.indices", process_set=process_set)
    values_handle = allgather_async(t._values().contiguous(), name=f"{name}.values",
                                    process_set=process_set)

    def wait() -> torch.Tensor:
        values = handles.synchronize(values_handle)
        indices = handles.synchronize(indices_handle)
        if op == Average:
            values = values / len(basics.process_set_members(_set_id(process_set)))
        return torch.sparse_coo_tensor(indices.transpose(0, 1), values, t.size(), check_invariants=False)

    return wait


# --- allgather ----------------------------------------------------------------------------------

def _check_ragged(tensor: torch.Tensor, what: str) -> None:
    if tensor.dim() == 0:
        raise ValueError(with_hint(f"{what} needs a tensor with at least one dimension, got a scalar",
                                   "reshape it, e.g. tensor.reshape(1)"))


def allgather_async(tensor: torch.Tensor, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> int:
    """Start concatenating every rank's ``tensor`` along dim 0 (first dims may differ)."""
    handles.check_tensor(tensor, "allgather")
    _check_ragged(tensor, "allgather")
    set_id = _set_id(process_set)
    h = handles.allocate()
    req = Request(name=handles.op_name("allgather", name, set_id), op=Op.ALLGATHER,
                  tensor=tensor.detach(), process_set_id=set_id)
    return handles.submit(h, [req], lambda results: results[0], keep=(tensor,))


def grouped_allgather_async(tensors: Sequence[torch.Tensor], name: str | None = None,
                            process_set: ProcessSet = global_process_set) -> int:
    """Allgather a list of tensors as one group; ``synchronize()`` returns a list."""
    tensors = _check_group(tensors, "grouped_allgather")
    for t in tensors:
        _check_ragged(t, "grouped_allgather")
    h = handles.allocate()
    set_id = _set_id(process_set)
    reqs = [Request(name=n, op=Op.ALLGATHER, tensor=t.detach(), process_set_id=set_id)
            for t, n in zip(tensors, handles.group_names("allgather", name, len(tensors), set_id))]
    return handles.submit(h, reqs, lambda results: list(results), keep=tuple(tensors))


# --- broadcast ----------------------------------------------------------------------------------

def _broadcast_async(tensor: torch.Tensor, root_rank: int, name: str | None,
                     process_set: ProcessSet, inplace: bool) -> int:
    handles.check_tensor(tensor, "broadcast")
    if not isinstance(root_rank, int) or isinstance(root_rank, bool):
        raise ValueError(with_hint(f"root_rank must be an int, got {root_rank!r}",
                                   "pass the global rank that holds the value"))
    set_id = _set_id(process_set)
    h = handles.allocate()
    source = tensor.detach()
    req = Request(name=handles.op_name("broadcast", name, set_id), op=Op.BROADCAST, tensor=source,
                  output=source if inplace else None, root_rank=root_rank,
                  process_set_id=set_id, owned=inplace)
    finish = (lambda results: tensor) if inplace else (lambda results: results[0])
    return handles.submit(h, [req], finish, keep=(tensor,))


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> int:
    """Start broadcasting ``tensor`` from global rank ``root_rank``; the input is not modified."""
    return _broadcast_async(tensor, root_rank, name, process_set, inplace=False)


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> int:
    """In-place :func:`broadcast_async`: ``tensor`` receives root's value."""
    return _broadcast_async(tensor, root_rank, name, process_set, inplace=True)


# --- alltoall -----------------------------------------------------------------------------------

def _splits_list(splits: Any) -> list[int] | None:
    if splits is None:
        return None
    if isinstance(splits, torch.Tensor):
        if splits.dim() != 1 or splits.is_floating_point() or splits.is_complex():
            raise ValueError(with_hint(f"splits must be a 1-D integer tensor, got {splits.dtype} "
                                       f"of shape {list(splits.shape)}",
                                       "pass one row count per rank, e.g. torch.tensor([2, 1])"))
        return [int(v) for v in splits.tolist()]
    values = list(splits)
    if any(not isinstance(v, int) or isinstance(v, bool) for v in values):
        raise ValueError(with_hint(f"splits must be integers, got {values!r}",
                                   "pass one row count per rank"))
    return values


def alltoall_async(tensor: torch.Tensor, splits: Any = None, name: str | None = None,
                   process_set: ProcessSet = global_process_set) -> int:
    """Start sending ``splits[i]`` rows of ``tensor`` to rank i of the set (even split when None).

    ``synchronize()`` returns ``(output, received_splits)``; ``received_splits`` is an int32
    tensor (or the dtype of a ``splits`` tensor).
    """
    handles.check_tensor(tensor, "alltoall")
    _check_ragged(tensor, "alltoall")
    split_values = _splits_list(splits)
    set_id = _set_id(process_set)
    basics.require_initialized()  # the split checks below need the set's members
    members = basics.process_set_members(set_id)
    if split_values is not None and len(split_values) != len(members):
        raise ValueError(with_hint(
            f"alltoall splits has {len(split_values)} entries but the process set has "
            f"{len(members)} ranks", "pass one row count per rank of the process set"))
    if split_values is not None and sum(split_values) != tensor.shape[0]:
        raise ValueError(with_hint(
            f"alltoall splits {split_values} sum to {sum(split_values)}, but the tensor's first "
            f"dimension is {tensor.shape[0]}", "the splits must add up to tensor.shape[0]"))
    if split_values is not None and min(split_values, default=0) < 0:
        raise ValueError(with_hint(f"alltoall splits {split_values} has a negative entry",
                                   "row counts must be >= 0"))
    out_dtype = splits.dtype if isinstance(splits, torch.Tensor) else torch.int32
    h = handles.allocate()
    req = Request(name=handles.op_name("alltoall", name, set_id), op=Op.ALLTOALL, tensor=tensor.detach(),
                  process_set_id=set_id,
                  splits=tuple(split_values) if split_values is not None else None)

    def finish(results: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
        output, received = results[0]
        return output, torch.tensor(list(received), dtype=out_dtype)

    return handles.submit(h, [req], finish, keep=(tensor,))


# --- reducescatter ------------------------------------------------------------------------------

def _check_reducescatter(tensor: torch.Tensor, op: ReduceOp, what: str) -> None:
    handles.check_tensor(tensor, what)
    if tensor.dim() == 0:
        raise ValueError(with_hint(f"{what} cannot scatter a scalar tensor",
                                   "pass a tensor with at least one dimension"))
    if op not in (Sum, Average):
        raise ValueError(with_hint(f"{what} supports only Sum and Average, got {ReduceOp(op).name}",
                                   "use op=hvd.Sum or op=hvd.Average"))


def reducescatter_async(tensor: torch.Tensor, name: str | None = None, op: ReduceOp = Average,
                        process_set: ProcessSet = global_process_set,
                        prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> int:
    """Start reducing ``tensor`` over the set and scattering dim 0 (lower ranks get extra rows)."""
    op = ReduceOp(op)
    _check_reducescatter(tensor, op, "reducescatter")
    set_id = _set_id(process_set)
    h = handles.allocate()
    req = Request(name=handles.op_name("reducescatter", name, set_id), op=Op.REDUCESCATTER,
                  tensor=tensor.detach(), reduce_op=op, prescale_factor=prescale_factor,
                  postscale_factor=postscale_factor, process_set_id=set_id)
    return handles.submit(h, [req], lambda results: results[0], keep=(tensor,))


def grouped_reducescatter_async(tensors: Sequence[torch.Tensor], name: str | None = None,
                                op: ReduceOp = Average,
                                process_set: ProcessSet = global_process_set,
                                prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> int:
    """Reducescatter a list of tensors as one group; ``synchronize()`` returns a list."""
    op = ReduceOp(op)
    tensors = _check_group(tensors, "grouped_reducescatter")
    for t in tensors:
        _check_reducescatter(t, op, "grouped_reducescatter")
    h = handles.allocate()
    set_id = _set_id(process_set)
    reqs = [Request(name=n, op=Op.REDUCESCATTER, tensor=t.detach(), reduce_op=op,
                    prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                    process_set_id=set_id)
            for t, n in zip(tensors, handles.group_names("reducescatter", name, len(tensors), set_id))]
    return handles.submit(h, reqs, lambda results: list(results), keep=tuple(tensors))


# --- barrier and join ---------------------------------------------------------------------------

def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Block until every rank of ``process_set`` has reached the barrier."""
    set_id = _set_id(process_set)
    h = handles.allocate()
    req = Request(name=handles.op_name("barrier", None, set_id), op=Op.BARRIER,
                  process_set_id=set_id)
    handles.synchronize(handles.submit(h, [req], lambda results: None))


def join(device: int = -1) -> int:
    """Declare that this rank has no more data; block until every rank has joined.

    While joined, this rank takes part in the collectives the others still submit with zeros
    (Average still divides by the full size). Returns the rank that joined last.
    """
    return basics.join(device)
