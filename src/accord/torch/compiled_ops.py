"""accord's collectives as torch custom ops (namespace ``accord``), for ``torch.compile``.

``torch.compile`` cannot trace into the engine (threads, locks, handles), so each collective is
an opaque operator: ``torch.ops.accord.allreduce`` & co. Dynamo puts one node in the graph, the
fake kernel tells the compiler the output's shape and dtype without communicating, and the real
kernel submits to the engine and waits, exactly as the eager functions do. Backward follows
Horovod's rules (the same as :mod:`accord.torch.mpi_ops`), written with these ops so that a
compiled backward has no graph break either:

- allreduce: allreduce of the gradient with the same op and scale factors;
- allgather: average over the set, then this rank's rows;
- broadcast: average over the set, times zero on every rank but the root;
- alltoall: alltoall of the gradient back with the received splits;
- reducescatter: allgather of the gradient (times the set size for Sum).

Ops whose output's first dimension depends on other ranks (allgather, alltoall) return a
data-dependent ("unbacked") size unless the caller knows it (``total_rows >= 0``, as the
backward passes do).

Names: an empty ``name`` means "number it when it runs": the real kernel calls the async API
with ``name=None``, which takes Horovod's per-process-set counter at run time. The compiled
graph runs its collectives in program order on every rank, so the numbers agree across ranks just
as in eager mode; a counter assigned at trace time would not, because ranks may trace (and
re-trace after a guard failure) a different number of times.

Supports torch >= 2.4 (``torch.library.custom_op``, ``register_fake``, ``register_autograd``
and ``get_ctx().new_dynamic_size()``, present from 2.4 through 2.13).
"""
# No ``from __future__ import annotations`` here: custom_op infers each op's schema from these
# annotations, and torch 2.4 does not resolve annotations given as strings.
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from accord.comm.ops import ReduceOp
from accord.torch import async_ops as A
from accord.torch import gateway
from accord.torch.gateway import synchronize
from accord.torch.process_sets import ProcessSet, global_process_set

AVERAGE, SUM = int(ReduceOp.AVERAGE), int(ReduceOp.SUM)


# --- helpers ------------------------------------------------------------------------------------

def process_set_for(set_id: int) -> ProcessSet:
    """A ProcessSet carrying ``set_id`` (the registered object's identity is not needed here)."""
    if set_id == 0:
        return global_process_set
    ps = ProcessSet(list(gateway.process_set_members(set_id)))
    ps.process_set_id = set_id
    return ps


def _members(set_id: int) -> Tuple[int, ...]:
    return gateway.process_set_members(set_id)


def _dense(tensor: Tensor) -> Tensor:
    # Inside a compiled graph the layout is the compiler's choice, not the user's: make it
    # contiguous instead of raising as the eager API does.
    return tensor if tensor.is_contiguous() else tensor.contiguous()


def _fresh(out: Tensor, *inputs: Tensor) -> Tensor:
    """What the fake kernels promise: a contiguous tensor of its own (offset 0) that aliases no
    input (one rank can hand its input back; a slice of a larger result has an offset)."""
    out = _dense(out)
    if out.storage_offset() != 0:
        return out.clone()
    for t in inputs:
        shared = out.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
        if t.numel() and out.numel() and shared:
            return out.clone()
    return out


def _name(name: str) -> Optional[str]:
    return name or None


def _rows(total_rows: int) -> int:
    """The first dimension: the caller's when known, else a data-dependent size."""
    if total_rows >= 0:
        return total_rows
    return torch.library.get_ctx().new_dynamic_size()


def scatter_rows(rows: int, set_rank: int, set_size: int) -> int:
    """Rows of dim 0 that ``set_rank`` keeps after a reducescatter (lower ranks get extras)."""
    return rows // set_size + (1 if set_rank < rows % set_size else 0)


# --- allreduce ----------------------------------------------------------------------------------

@torch.library.custom_op("accord::allreduce", mutates_args=())
def allreduce(tensor: Tensor, name: str, op: int, prescale_factor: float,
              postscale_factor: float, process_set_id: int) -> Tensor:
    """Reduce ``tensor`` over the set (``op`` is a ReduceOp value); a new tensor."""
    out = synchronize(A.allreduce_async(_dense(tensor), name=_name(name), op=ReduceOp(op),
                                        prescale_factor=prescale_factor,
                                        postscale_factor=postscale_factor,
                                        process_set=process_set_for(process_set_id)))
    return _fresh(out, tensor)


@allreduce.register_fake
def _allreduce_fake(tensor, name, op, prescale_factor, postscale_factor, process_set_id):
    return tensor.new_empty(tensor.shape)


def _allreduce_setup(ctx, inputs, output) -> None:
    _, _, ctx.op, ctx.pre, ctx.post, ctx.set_id = inputs


def _allreduce_backward(ctx, grad):
    return allreduce(grad, "", ctx.op, ctx.pre, ctx.post, ctx.set_id), None, None, None, None, None


allreduce.register_autograd(_allreduce_backward, setup_context=_allreduce_setup)


@torch.library.custom_op("accord::grouped_allreduce", mutates_args=())
def grouped_allreduce(tensors: List[Tensor], name: str, op: int, prescale_factor: float,
                      postscale_factor: float, process_set_id: int) -> List[Tensor]:
    """Reduce a list of tensors as one group (one fused engine submission); new tensors."""
    outs = synchronize(A.grouped_allreduce_async([_dense(t) for t in tensors], name=_name(name),
                                                 op=ReduceOp(op), prescale_factor=prescale_factor,
                                                 postscale_factor=postscale_factor,
                                                 process_set=process_set_for(process_set_id)))
    return [_fresh(o, *tensors) for o in outs]


@grouped_allreduce.register_fake
def _grouped_allreduce_fake(tensors, name, op, prescale_factor, postscale_factor, process_set_id):
    return [t.new_empty(t.shape) for t in tensors]


def _grouped_backward(ctx, grads):
    # An output that took no part in the loss may come back without a gradient; every rank
    # must still send a tensor for it, so it sends zeros.
    grads = [torch.zeros(shape, dtype=dtype, device=device) if g is None else g
             for g, (shape, dtype, device) in zip(grads, ctx.like)]
    reduced = grouped_allreduce(grads, "", ctx.op, ctx.pre, ctx.post, ctx.set_id)
    return reduced, None, None, None, None, None


def _grouped_setup(ctx, inputs, output) -> None:
    _allreduce_setup(ctx, inputs, output)
    ctx.like = [(t.shape, t.dtype, t.device) for t in output]


grouped_allreduce.register_autograd(_grouped_backward, setup_context=_grouped_setup)


# --- allgather ----------------------------------------------------------------------------------

@torch.library.custom_op("accord::allgather", mutates_args=())
def allgather(tensor: Tensor, name: str, process_set_id: int, total_rows: int) -> Tensor:
    """Concatenate every rank's ``tensor`` along dim 0. ``total_rows`` is the result's first
    dimension when the caller knows it, else -1 (a data-dependent size for the compiler)."""
    out = synchronize(A.allgather_async(_dense(tensor), name=_name(name),
                                        process_set=process_set_for(process_set_id)))
    return _fresh(out, tensor)


@allgather.register_fake
def _allgather_fake(tensor, name, process_set_id, total_rows):
    return tensor.new_empty((_rows(total_rows), *tensor.shape[1:]))


def _allgather_setup(ctx, inputs, output) -> None:
    ctx.rows, ctx.set_id = inputs[0].shape[0], inputs[2]


def _allgather_backward(ctx, grad):
    return allgather_grad(grad, ctx.rows, ctx.set_id), None, None, None


@torch.library.custom_op("accord::allgather_grad", mutates_args=())
def allgather_grad(grad: Tensor, rows: int, process_set_id: int) -> Tensor:
    """Allgather's backward: average ``grad`` over the set, keep this rank's ``rows`` rows.
    Not differentiable itself (no double backward through a compiled allgather)."""
    ps = process_set_for(process_set_id)
    reduced = synchronize(A.allreduce_async(_dense(grad), op=ReduceOp.AVERAGE, process_set=ps))
    counts = synchronize(A.allgather_async(torch.tensor([rows], dtype=torch.int64), process_set=ps))
    offset = int(counts[:_members(process_set_id).index(gateway.rank())].sum())
    return _fresh(reduced.narrow(0, offset, rows), grad)


@allgather_grad.register_fake
def _allgather_grad_fake(grad, rows, process_set_id):
    return grad.new_empty((rows, *grad.shape[1:]))


allgather.register_autograd(_allgather_backward, setup_context=_allgather_setup)


# --- broadcast ----------------------------------------------------------------------------------

@torch.library.custom_op("accord::broadcast", mutates_args=())
def broadcast(tensor: Tensor, root_rank: int, name: str, process_set_id: int) -> Tensor:
    """Global rank ``root_rank``'s ``tensor`` on every rank of the set; a new tensor."""
    out = synchronize(A.broadcast_async(_dense(tensor), root_rank, name=_name(name),
                                        process_set=process_set_for(process_set_id)))
    return _fresh(out, tensor)


@broadcast.register_fake
def _broadcast_fake(tensor, root_rank, name, process_set_id):
    return tensor.new_empty(tensor.shape)


def _broadcast_setup(ctx, inputs, output) -> None:
    ctx.root, ctx.set_id = inputs[1], inputs[3]


def _broadcast_backward(ctx, grad):
    reduced = allreduce(grad, "", AVERAGE, 1.0, 1.0, ctx.set_id)
    if gateway.rank() != ctx.root:  # decided per rank; the collective itself runs everywhere
        reduced = reduced * 0
    return reduced, None, None, None


broadcast.register_autograd(_broadcast_backward, setup_context=_broadcast_setup)


# --- reducescatter ------------------------------------------------------------------------------

@torch.library.custom_op("accord::reducescatter", mutates_args=())
def reducescatter(tensor: Tensor, name: str, op: int, prescale_factor: float,
                  postscale_factor: float, process_set_id: int) -> Tensor:
    """Reduce (Sum or Average) over the set and keep this rank's share of dim 0."""
    out = synchronize(A.reducescatter_async(_dense(tensor), name=_name(name), op=ReduceOp(op),
                                            process_set=process_set_for(process_set_id),
                                            prescale_factor=prescale_factor,
                                            postscale_factor=postscale_factor))
    return _fresh(out, tensor)


@reducescatter.register_fake
def _reducescatter_fake(tensor, name, op, prescale_factor, postscale_factor, process_set_id):
    members = _members(process_set_id)
    rows = scatter_rows(tensor.shape[0], members.index(gateway.rank()), len(members))
    return tensor.new_empty((rows, *tensor.shape[1:]))


def _reducescatter_setup(ctx, inputs, output) -> None:
    ctx.rows, ctx.op, ctx.set_id = inputs[0].shape[0], inputs[2], inputs[5]
    ctx.scale = inputs[3] * inputs[4]  # prescale * postscale scaled the forward


def _reducescatter_backward(ctx, grad):
    factor = ctx.scale * len(_members(ctx.set_id)) if ctx.op == SUM else ctx.scale
    grad = grad * factor
    return allgather(grad, "", ctx.set_id, ctx.rows), None, None, None, None, None


reducescatter.register_autograd(_reducescatter_backward, setup_context=_reducescatter_setup)


# --- alltoall -----------------------------------------------------------------------------------

@torch.library.custom_op("accord::alltoall", mutates_args=())
def alltoall(tensor: Tensor, splits: Optional[Tensor], name: str, process_set_id: int,
             total_rows: int) -> Tuple[Tensor, Tensor]:
    """Send ``splits[i]`` rows to rank i of the set (even split when None); returns the received
    rows and the received splits (int32, or the dtype of ``splits``). ``total_rows`` as in
    :func:`allgather`."""
    out, received = synchronize(A.alltoall_async(_dense(tensor), splits, name=_name(name),
                                                 process_set=process_set_for(process_set_id)))
    return _fresh(out, tensor), received


@alltoall.register_fake
def _alltoall_fake(tensor, splits, name, process_set_id, total_rows):
    dtype = splits.dtype if splits is not None else torch.int32
    out = tensor.new_empty((_rows(total_rows), *tensor.shape[1:]))
    # the received splits are a CPU tensor, whatever the data's device (as the eager op returns)
    return out, torch.empty((len(_members(process_set_id)),), dtype=dtype, device="cpu")


def _alltoall_setup(ctx, inputs, output) -> None:
    ctx.rows, ctx.set_id = inputs[0].shape[0], inputs[3]
    ctx.save_for_backward(output[1])


def _alltoall_backward(ctx, grad, _grad_splits):
    (received,) = ctx.saved_tensors
    back, _ = alltoall(grad, received, "", ctx.set_id, ctx.rows)
    return back, None, None, None, None


alltoall.register_autograd(_alltoall_backward, setup_context=_alltoall_setup)
