"""The synchronous, differentiable half of the Horovod collective API.

``allreduce``, ``grouped_allreduce``, ``allgather``, ``grouped_allgather``, ``broadcast``,
``alltoall``, ``reducescatter`` and ``grouped_reducescatter`` are autograd functions with
Horovod 0.28's backward rules:

- allreduce: the gradient is allreduced with the same op and scale factors;
- allgather: the gradient is averaged over the set, then this rank's rows are taken;
- broadcast: the gradient is averaged over the set, and zero on every rank but the root;
- alltoall: the gradient goes back with an alltoall using the received splits;
- reducescatter: the gradient is allgathered (times the set size for Sum).

The in-place variants (``allreduce_``, ``broadcast_``, ...) are not differentiable, as in Horovod.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from accord.comm.ops import ReduceOp
from accord.engine import Compressor, NoneCompressor
from accord.errors import CollectiveError as HorovodInternalError  # noqa: F401,E402
from accord.torch import async_ops as A
from accord.torch import gateway

# Horovod's ``horovod.torch.mpi_ops`` also holds the async ops and the basics; scripts that import
# them from there keep working.
from accord.torch.async_ops import (  # noqa: F401,E402
    Adasum,
    Average,
    Max,
    Min,
    Product,
    Sum,
    allgather_async,
    allreduce_async,
    allreduce_async_,
    alltoall_async,
    barrier,
    broadcast_async,
    broadcast_async_,
    grouped_allgather_async,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter_async,
    join,
    reducescatter_async,
    sparse_allreduce_async,
)
from accord.torch.basics import (  # noqa: F401,E402
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    init,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    rocm_built,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
)
from accord.torch.gateway import poll, synchronize  # noqa: F401 (Horovod's module layout)
from accord.torch.process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set, set_id_of  # noqa: F401


def _set_size(process_set: ProcessSet) -> int:
    return len(gateway.process_set_members(set_id_of(process_set)))


def _set_rank(process_set: ProcessSet) -> int:
    return gateway.process_set_members(set_id_of(process_set)).index(gateway.rank())


# --- allreduce ----------------------------------------------------------------------------------

def _allreduce_now(tensor: torch.Tensor, op: ReduceOp, name: str | None, prescale_factor: float,
                   postscale_factor: float, process_set: ProcessSet,
                   compression: type[Compressor] | Compressor) -> torch.Tensor:
    return synchronize(A.allreduce_tensors([tensor], False, name, op, prescale_factor, postscale_factor,
                                           process_set, grouped=False, compression=compression, waited=True))


class HorovodAllreduce(torch.autograd.Function):
    """Differentiable allreduce."""

    @staticmethod
    def forward(ctx, tensor, op, name, prescale_factor, postscale_factor, process_set, compression):
        ctx.op, ctx.compression, ctx.process_set = op, compression, process_set
        ctx.prescale_factor, ctx.postscale_factor = prescale_factor, postscale_factor
        return _allreduce_now(tensor, op, name, prescale_factor, postscale_factor, process_set, compression)

    @staticmethod
    def backward(ctx, grad_output):
        grad = allreduce(grad_output.contiguous(), compression=ctx.compression, op=ctx.op,
                         prescale_factor=ctx.prescale_factor,
                         postscale_factor=ctx.postscale_factor, process_set=ctx.process_set)
        return grad, None, None, None, None, None, None


def allreduce(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
              compression: type[Compressor] | Compressor = NoneCompressor,
              op: ReduceOp | None = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Average (default) or reduce ``tensor`` over the set; returns a new tensor. The engine
    applies ``compression`` on the wire (the result has ``tensor``'s dtype); the gradient is
    reduced the same way.

    Example: ``avg = hvd.allreduce(torch.tensor([rank]), op=hvd.Average)``.
    """
    op = A.handle_average_backwards_compatibility(op, average)
    # (getattr: a non-tensor is refused by the engine on every rank, not here on this one)
    if not (getattr(tensor, "requires_grad", False) and torch.is_grad_enabled()):
        # Nothing to differentiate: the autograd Function would only add its own overhead,
        # which for a small synchronous allreduce is a noticeable share of the call.
        return _allreduce_now(tensor, op, name, prescale_factor, postscale_factor, process_set, compression)
    return HorovodAllreduce.apply(tensor, op, name, prescale_factor, postscale_factor,
                                  process_set, compression)


def allreduce_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
               op: ReduceOp | None = None, prescale_factor: float = 1.0,
               postscale_factor: float = 1.0,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """In-place :func:`allreduce`; returns ``tensor``."""
    op = A.handle_average_backwards_compatibility(op, average)
    return synchronize(A.allreduce_tensors([tensor], True, name, op, prescale_factor, postscale_factor,
                                           process_set, grouped=False, waited=True))


class HorovodGroupedAllreduce(torch.autograd.Function):
    """Differentiable grouped allreduce."""

    @staticmethod
    def forward(ctx, op, name, prescale_factor, postscale_factor, process_set, compression, *tensors):
        ctx.op, ctx.compression, ctx.process_set = op, compression, process_set
        ctx.prescale_factor, ctx.postscale_factor = prescale_factor, postscale_factor
        return tuple(synchronize(A.allreduce_tensors(
            tensors, False, name, op, prescale_factor, postscale_factor, process_set,
            grouped=True, compression=compression, waited=True)))

    @staticmethod
    def backward(ctx, *grad_output):
        grads = grouped_allreduce([g.contiguous() for g in grad_output], compression=ctx.compression,
                                  op=ctx.op, prescale_factor=ctx.prescale_factor,
                                  postscale_factor=ctx.postscale_factor,
                                  process_set=ctx.process_set)
        return (None, None, None, None, None, None, *grads)


def grouped_allreduce(tensors: Sequence[torch.Tensor], average: bool | None = None,
                      name: str | None = None,
                      compression: type[Compressor] | Compressor = NoneCompressor,
                      op: ReduceOp | None = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    """Allreduce a list of tensors together; returns a list of new tensors (``compression`` as
    in :func:`allreduce`)."""
    op = A.handle_average_backwards_compatibility(op, average)
    return list(HorovodGroupedAllreduce.apply(op, name, prescale_factor, postscale_factor,
                                              process_set, compression, *tensors))


def grouped_allreduce_(tensors: Sequence[torch.Tensor], average: bool | None = None,
                       name: str | None = None, op: ReduceOp | None = None,
                       prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    """In-place :func:`grouped_allreduce`; returns the input tensors."""
    return synchronize(A.grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                  postscale_factor, process_set))


# --- allgather ----------------------------------------------------------------------------------

def _own_rows(grad: torch.Tensor, my_rows: int, process_set: ProcessSet) -> torch.Tensor:
    """This rank's slice of a gathered gradient (the first dims of ranks may differ)."""
    rows = allgather(torch.tensor([my_rows], dtype=torch.int64), process_set=process_set)
    offset = int(rows[:_set_rank(process_set)].sum())
    return grad.narrow(0, offset, my_rows)


class HorovodAllgather(torch.autograd.Function):
    """Differentiable allgather."""

    @staticmethod
    def forward(ctx, tensor, name, process_set):
        # dim 0 is read once the result is in: a 0-d tensor fails the call on every rank there,
        # while reading it first would raise on this rank alone and leave the others waiting.
        out = synchronize(A.allgather_async(tensor, name, process_set))
        ctx.dim, ctx.process_set = tensor.shape[0], process_set
        return out

    @staticmethod
    def backward(ctx, grad_output):
        reduced = allreduce(grad_output.contiguous(), op=A.Average, process_set=ctx.process_set)
        return _own_rows(reduced, ctx.dim, ctx.process_set), None, None


def allgather(tensor: torch.Tensor, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Concatenate every rank's ``tensor`` along dim 0 (first dims may differ)."""
    return HorovodAllgather.apply(tensor, name, process_set)


class HorovodGroupedAllgather(torch.autograd.Function):
    """Differentiable grouped allgather."""

    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        out = tuple(synchronize(A.grouped_allgather_async(list(tensors), name, process_set)))
        ctx.dims, ctx.process_set = [t.shape[0] for t in tensors], process_set  # (as in HorovodAllgather)
        return out

    @staticmethod
    def backward(ctx, *grad_output):
        reduced = grouped_allreduce([g.contiguous() for g in grad_output], op=A.Average,
                                    process_set=ctx.process_set)
        counts = grouped_allgather([torch.tensor([d], dtype=torch.int64) for d in ctx.dims],
                                   process_set=ctx.process_set)
        me = _set_rank(ctx.process_set)
        grads = [g.narrow(0, int(c[:me].sum()), d) for g, c, d in zip(reduced, counts, ctx.dims)]
        return (None, None, *grads)


def grouped_allgather(tensors: Sequence[torch.Tensor], name: str | None = None,
                      process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    """Allgather a list of tensors together; returns a list.

    Args:
        tensors: the same list (count, dtypes, all but the first dimension) on every rank.
        name: one name for the group, as in :func:`allgather`.
        process_set: the ranks taking part (default: all).

    Returns:
        One tensor per input: the ranks' tensors concatenated in rank order. The errors are
        :func:`allgather`'s.
    """
    return list(HorovodGroupedAllgather.apply(name, process_set, *tensors))


# --- broadcast ----------------------------------------------------------------------------------

class HorovodBroadcast(torch.autograd.Function):
    """Differentiable broadcast."""

    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return synchronize(A.broadcast_async(tensor, root_rank, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        grad = allreduce(grad_output.contiguous(), op=A.Average, process_set=ctx.process_set)
        if gateway.rank() != ctx.root_rank:
            grad = grad * 0
        return grad, None, None, None


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Return global rank ``root_rank``'s ``tensor`` on every rank of the set."""
    return HorovodBroadcast.apply(tensor, root_rank, name, process_set)


def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """In-place :func:`broadcast`; returns ``tensor``."""
    return synchronize(A.broadcast_async_(tensor, root_rank, name, process_set))


# --- alltoall -----------------------------------------------------------------------------------

class HorovodAlltoall(torch.autograd.Function):
    """Differentiable alltoall."""

    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        output, received = synchronize(A.alltoall_async(tensor, splits, name, process_set))
        ctx.process_set, ctx.recvsplits = process_set, received
        if splits is None:
            return output
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad_output, *_unused):
        grad, _ = alltoall(grad_output.contiguous(), splits=ctx.recvsplits,
                           process_set=ctx.process_set)
        return grad, None, None, None


def alltoall(tensor: torch.Tensor, splits: Any = None, name: str | None = None,
             process_set: ProcessSet = global_process_set):
    """Send ``splits[i]`` rows to rank i of the set and receive theirs.

    Returns the gathered tensor, or ``(output, received_splits)`` when ``splits`` was given.
    """
    return HorovodAlltoall.apply(tensor, splits, name, process_set)


# --- reducescatter ------------------------------------------------------------------------------

class HorovodReducescatter(torch.autograd.Function):
    """Differentiable reducescatter."""

    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale_factor, postscale_factor, compression):
        ctx.op, ctx.process_set = op, process_set
        ctx.scale = prescale_factor * postscale_factor
        return synchronize(A.reducescatter_tensors([tensor], name, op, process_set, prescale_factor,
                                                   postscale_factor, grouped=False,
                                                   compression=compression))

    @staticmethod
    def backward(ctx, grad_output):
        grad = grad_output.contiguous() * _reducescatter_grad_factor(ctx.op, ctx.scale, ctx.process_set)
        return allgather(grad, process_set=ctx.process_set), None, None, None, None, None, None


def _reducescatter_grad_factor(op: ReduceOp, scale: float, process_set: ProcessSet) -> float:
    """What reducescatter's backward multiplies the gathered gradient by: the set size for Sum
    (Horovod's rule), and the prescale and postscale factors, which scaled the forward."""
    return scale * (_set_size(process_set) if op == A.Sum else 1)


def reducescatter(tensor: torch.Tensor, name: str | None = None,
                  compression: type[Compressor] | Compressor = NoneCompressor,
                  op: ReduceOp = A.Average, process_set: ProcessSet = global_process_set,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> torch.Tensor:
    """Reduce (Sum or Average) over the set, then keep this rank's share of dim 0."""
    return HorovodReducescatter.apply(tensor, name, op, process_set, prescale_factor,
                                      postscale_factor, compression)


class HorovodGroupedReducescatter(torch.autograd.Function):
    """Differentiable grouped reducescatter."""

    @staticmethod
    def forward(ctx, name, op, process_set, prescale_factor, postscale_factor, compression, *tensors):
        ctx.op, ctx.process_set = op, process_set
        ctx.scale = prescale_factor * postscale_factor
        return tuple(synchronize(A.reducescatter_tensors(
            tensors, name, op, process_set, prescale_factor, postscale_factor, grouped=True,
            compression=compression)))

    @staticmethod
    def backward(ctx, *grad_output):
        factor = _reducescatter_grad_factor(ctx.op, ctx.scale, ctx.process_set)
        grads = [g.contiguous() * factor for g in grad_output]
        return (None, None, None, None, None, None,
                *grouped_allgather(grads, process_set=ctx.process_set))


def grouped_reducescatter(tensors: Sequence[torch.Tensor], name: str | None = None,
                          compression: type[Compressor] | Compressor = NoneCompressor,
                          op: ReduceOp = A.Average, process_set: ProcessSet = global_process_set,
                          prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> list[torch.Tensor]:
    """Reducescatter a list of tensors together; returns a list.

    Args:
        tensors: the same list (shapes, dtypes) on every rank.
        name: one name for the group.
        compression: the dtype the data travels in, as in :func:`reducescatter`.
        op: ``hvd.Average`` (the default) or ``hvd.Sum``.
        process_set: the ranks taking part (default: all).
        prescale_factor: multiplies the inputs before the reduction.
        postscale_factor: multiplies the results after the reduction.

    Returns:
        This rank's rows of each reduction. The errors are :func:`reducescatter`'s.
    """
    return list(HorovodGroupedReducescatter.apply(name, op, process_set, prescale_factor,
                                                  postscale_factor, compression, *tensors))
