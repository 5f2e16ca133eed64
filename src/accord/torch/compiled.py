"""The ``torch.compile``-friendly path of accord.torch (beyond Horovod).

``hvd.allreduce``, ``hvd.allreduce_``, ``hvd.grouped_allreduce``, ``hvd.grouped_allreduce_``,
``hvd.allgather``, ``hvd.broadcast``, ``hvd.broadcast_``, ``hvd.alltoall`` and
``hvd.reducescatter`` are the functions below. Called eagerly they go straight to the
Horovod-compatible functions of :mod:`accord.torch.mpi_ops` (one ``is_compiling()`` check, no
dispatcher round trip). Traced by ``torch.compile`` they become the custom ops of
:mod:`accord.torch.compiled_ops`, so a function such as::

    @torch.compile(fullgraph=True)
    def step(x):
        return hvd.allreduce(x * 2, name="x", op=hvd.Sum)

compiles without graph breaks and returns what eager mode returns, gradients included.

Names inside compiled code: pass ``name=`` where you can (the engine matches ranks' requests by
name). Without one, the op is numbered when it *runs* (Horovod's ``noname.<n>`` counter), like
an eager call: the compiled graph runs its collectives in the same order on every rank, so the
numbers agree; a number fixed at trace time would not, since ranks may re-trace a different
number of times.

Compiled code differs from eager in small ways: ``allgather`` and ``alltoall`` results have a
data-dependent first dimension (other ranks decide it); non-contiguous inputs are made
contiguous instead of rejected (the compiler chooses layouts); the deprecated ``average=`` does
not warn (Dynamo cannot trace a warning); there is no double backward through ``allgather``.
Not traceable (a graph break, then eager as usual): the ``*_async`` functions, ``synchronize``
and ``poll`` (handles are Python state), the grouped allgather/reducescatter, and
``join``/``barrier``; nor is ``accord.torch.mpi_ops.allreduce`` & co. (Horovod's module path),
which stays eager-only.

Gradients of a compiled model: ``model = torch.compile(model)`` with ``hvd.DistributedOptimizer``
works as in eager mode (the per-parameter hooks fire after the compiled backward). To keep the
communication inside compiled code instead, use a plain optimizer and
:func:`allreduce_gradients`, which reduces every gradient in one fused grouped allreduce (torch's
optimizers break the graph around ``step()`` on purpose, so it stays outside the full graph)::

    @torch.compile(fullgraph=True)
    def reduce_gradients():
        hvd.allreduce_gradients(model.parameters())

    loss_fn(model(x), y).backward()
    reduce_gradients()
    opt.step()
"""
from __future__ import annotations

from typing import Any, Iterable, Sequence

import torch

from accord.comm.ops import ReduceOp
from accord.engine import Compressor, NoneCompressor
from accord.errors import with_hint
from accord.torch import async_ops as A
from accord.torch import compiled_ops as ops
from accord.torch import mpi_ops as eager
from accord.torch.gateway import synchronize
from accord.torch.process_sets import ProcessSet, global_process_set, set_id_of


def _compiling() -> bool:
    # Dynamo treats this as the constant True while it traces, so eager calls never take the
    # custom-op branch and compiled code never takes the eager one.
    return torch.compiler.is_compiling()


def _op(op: Any, average: Any) -> int:
    if op is not None and average is None:
        # A ReduceOp is an int; building the enum from it inside the trace is what older Dynamo
        # refuses (torch 2.4: "Enum variable is constructed with non constant values"). An
        # unknown value is refused by the op's eager body, as in eager mode.
        return int(op)
    if average is None or op is not None:  # (both given: the eager ValueError)
        return int(A.handle_average_backwards_compatibility(op, average))
    # The deprecated ``average=`` alone: eager mode warns, but Dynamo cannot trace a warning.
    return int(A.Average if average else A.Sum)


def _splits_tensor(splits: Any) -> torch.Tensor | None:
    if splits is None or isinstance(splits, torch.Tensor):
        return splits
    return torch.tensor(list(splits), dtype=torch.int32)


# --- the Horovod functions, compile-aware -------------------------------------------------------

def allreduce(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
              compression: type[Compressor] | Compressor = NoneCompressor,
              op: ReduceOp | None = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Average (default) or reduce ``tensor`` over the set; returns a new tensor.

    Example: ``avg = hvd.allreduce(torch.tensor([rank]), op=hvd.Average)``.

    Args:
        tensor: the same shape and dtype on every rank; CPU or CUDA.
        average: Horovod's deprecated flag: True is ``op=Average``, False ``op=Sum``.
        name: the collective's name, the same on every rank; ``None``: numbered in the order
            of the calls, as in Horovod (pass one under ``torch.compile``).
        compression: ``hvd.Compression.none``, ``.fp16`` or ``.bf16``: the dtype the data
            travels in; the result is cast back.
        op: ``hvd.Average`` (the default), ``hvd.Sum``, ``hvd.Min``, ``hvd.Max``,
            ``hvd.Product`` or ``hvd.Adasum``.
        prescale_factor: multiplies the input before the reduction.
        postscale_factor: multiplies the result after the reduction.
        process_set: the ranks taking part (default: all); every member must call.

    Returns:
        A new tensor with the reduction; differentiable (the gradient is allreduced too).

    Raises:
        CollectiveError: ``hvd.HorovodInternalError``: not initialized, or the collective failed
            (its subclasses MismatchError, RankFailedError, StallError say how).
        InvalidArgumentError: arguments refused on this rank, or on every rank of the set.
    """
    if not _compiling():
        return eager.allreduce(tensor, average, name, compression, op, prescale_factor,
                               postscale_factor, process_set)
    compressed, cctx = compression.compress(tensor)
    out = ops.allreduce(compressed, name or "", _op(op, average), float(prescale_factor),
                        float(postscale_factor), set_id_of(process_set))
    return compression.decompress(out, cctx)


def allreduce_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
               op: ReduceOp | None = None, prescale_factor: float = 1.0,
               postscale_factor: float = 1.0,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """In-place :func:`allreduce`; returns ``tensor`` (not differentiable, as in Horovod).

    Args:
        tensor: overwritten with the reduction; the same shape and dtype on every rank.
        average: Horovod's deprecated flag (True: ``op=Average``, False: ``op=Sum``).
        name: the collective's name, alike on every rank (``None``: numbered by call order).
        op: ``hvd.Average`` (default), ``Sum``, ``Min``, ``Max``, ``Product`` or ``Adasum``.
        prescale_factor: multiplies the input before the reduction.
        postscale_factor: multiplies the result after it.
        process_set: the ranks taking part (default: all); every member must call.

    Returns:
        ``tensor``, now holding the reduction.

    Raises:
        CollectiveError: not initialized, or the collective failed (as :func:`allreduce`).
        InvalidArgumentError: arguments refused on this rank or on another of the set.
    """
    if not _compiling():
        return eager.allreduce_(tensor, average, name, op, prescale_factor, postscale_factor,
                                process_set)
    with torch.no_grad():
        out = ops.allreduce(tensor, name or "", _op(op, average), float(prescale_factor),
                            float(postscale_factor), set_id_of(process_set))
        tensor.copy_(out)
    return tensor


def grouped_allreduce(tensors: Sequence[torch.Tensor], average: bool | None = None,
                      name: str | None = None,
                      compression: type[Compressor] | Compressor = NoneCompressor,
                      op: ReduceOp | None = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    """Allreduce a list of tensors together; returns a list of new tensors.

    The tensors are negotiated as one request and fused, so they complete together.

    Args:
        tensors: the same list (shapes, dtypes, order) on every rank.
        average: as in :func:`allreduce`.
        name: one name for the group.
        compression: as in :func:`allreduce`.
        op: as in :func:`allreduce`.
        prescale_factor: as in :func:`allreduce`.
        postscale_factor: as in :func:`allreduce`.
        process_set: as in :func:`allreduce`.

    Returns:
        One new tensor per input, in order. The errors are :func:`allreduce`'s.
    """
    if not _compiling():
        return eager.grouped_allreduce(tensors, average, name, compression, op, prescale_factor,
                                       postscale_factor, process_set)
    pairs = [compression.compress(t) for t in tensors]
    outs = ops.grouped_allreduce([t for t, _ in pairs], name or "", _op(op, average),
                                 float(prescale_factor), float(postscale_factor),
                                 set_id_of(process_set))
    return [compression.decompress(t, c) for t, (_, c) in zip(outs, pairs)]


def grouped_allreduce_(tensors: Sequence[torch.Tensor], average: bool | None = None,
                       name: str | None = None, op: ReduceOp | None = None,
                       prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    """In-place :func:`grouped_allreduce`; returns the input tensors.

    Args:
        tensors: each overwritten with its reduction; the same list on every rank.
        average: deprecated, as in Horovod: True means Average, False Sum.
        name: one name for the group, identical across ranks (or ``None``).
        op: the reduction, Average unless given.
        prescale_factor: scales the inputs before the reduction.
        postscale_factor: scales the outputs after it.
        process_set: which ranks reduce (the global set by default).

    Returns:
        The input tensors, now holding their reductions.

    Raises:
        CollectiveError: the engine is not running, or the group failed.
        InvalidArgumentError: a tensor or argument was refused (here or on a peer).
    """
    if not _compiling():
        return eager.grouped_allreduce_(tensors, average, name, op, prescale_factor,
                                        postscale_factor, process_set)
    tensors = list(tensors)
    with torch.no_grad():
        outs = ops.grouped_allreduce(tensors, name or "", _op(op, average), float(prescale_factor),
                                     float(postscale_factor), set_id_of(process_set))
        for t, out in zip(tensors, outs):
            t.copy_(out)
    return tensors


def allgather(tensor: torch.Tensor, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Concatenate every rank's ``tensor`` along dim 0 (first dims may differ).

    Compiled, the result's first dimension is data-dependent (an unbacked size): code after it
    must not branch on it.

    Args:
        tensor: this rank's rows; every dimension but the first must match across ranks.
        name: as in :func:`allreduce`.
        process_set: as in :func:`allreduce`.

    Returns:
        The ranks' tensors concatenated in rank order; differentiable (each rank gets the
        averaged gradient of its rows, as in Horovod 0.23 and later).

    Raises:
        CollectiveError: ``hvd.HorovodInternalError``: not initialized, or the collective failed
            (its subclasses MismatchError, RankFailedError, StallError say how).
        InvalidArgumentError: arguments refused on this rank, or on every rank of the set.
    """
    if not _compiling():
        return eager.allgather(tensor, name, process_set)
    return ops.allgather(tensor, name or "", set_id_of(process_set), -1)


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Return global rank ``root_rank``'s ``tensor`` on every rank of the set.

    Args:
        tensor: the value on the root; elsewhere a tensor of the same shape and dtype.
        root_rank: the global rank whose value is sent; the same on every rank.
        name: as in :func:`allreduce`.
        process_set: as in :func:`allreduce`.

    Returns:
        A new tensor holding the root's value. The errors are :func:`allreduce`'s.
    """
    if not _compiling():
        return eager.broadcast(tensor, root_rank, name, process_set)
    return ops.broadcast(tensor, root_rank, name or "", set_id_of(process_set))


def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """In-place :func:`broadcast`; returns ``tensor``.

    Args:
        tensor: receives the root's value (on the root, it is sent); the same shape and dtype
            on every rank.
        root_rank: the global rank that sends.
        name: a name every rank passes alike, or ``None`` to number the calls in order.
        process_set: the ranks taking part (default: all).

    Returns:
        ``tensor``, now holding the root's value.

    Raises:
        CollectiveError: accord is not initialized, or the broadcast failed.
        InvalidArgumentError: the tensor or the root was refused.
    """
    if not _compiling():
        return eager.broadcast_(tensor, root_rank, name, process_set)
    with torch.no_grad():
        tensor.copy_(ops.broadcast(tensor, root_rank, name or "", set_id_of(process_set)))
    return tensor


def alltoall(tensor: torch.Tensor, splits: Any = None, name: str | None = None,
             process_set: ProcessSet = global_process_set):
    """Send ``splits[i]`` rows to rank i of the set and receive theirs.

    Returns the gathered tensor, or ``(output, received_splits)`` when ``splits`` was given.
    Compiled, the output's first dimension is data-dependent (an unbacked size). The errors are
    :func:`allreduce`'s (splits that do not add up: InvalidArgumentError on every rank).

    Args:
        tensor: the rows to send, in the order of the receiving ranks.
        splits: rows for each rank of the set (a sequence or an int tensor summing to
            ``tensor.shape[0]``); ``None``: equal parts (dim 0 must divide by the set's size).
        name: as in :func:`allreduce`.
        process_set: as in :func:`allreduce`.

    Returns:
        (torch.Tensor | tuple[torch.Tensor, torch.Tensor]): the received rows (concatenated in
            rank order) when ``splits`` is None, else ``(output, received_splits)``.
    """
    if not _compiling():
        return eager.alltoall(tensor, splits, name, process_set)
    out, received = ops.alltoall(tensor, _splits_tensor(splits), name or "",
                                 set_id_of(process_set), -1)
    return out if splits is None else (out, received)


def reducescatter(tensor: torch.Tensor, name: str | None = None,
                  compression: type[Compressor] | Compressor = NoneCompressor,
                  op: ReduceOp = A.Average, process_set: ProcessSet = global_process_set,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> torch.Tensor:
    """Reduce (Sum or Average) over the set, then keep this rank's share of dim 0.

    Args:
        tensor: the same shape and dtype on every rank; dim 0 is split over the ranks, the
            first ranks getting one row more when it does not divide.
        name: as in :func:`allreduce`.
        compression: as in :func:`allreduce`.
        op: ``hvd.Average`` (the default) or ``hvd.Sum``.
        process_set: as in :func:`allreduce`.
        prescale_factor: multiplies the input before the reduction.
        postscale_factor: multiplies the result after the reduction.

    Returns:
        This rank's rows of the reduction. The errors are :func:`allreduce`'s.
    """
    if not _compiling():
        return eager.reducescatter(tensor, name, compression, op, process_set, prescale_factor,
                                   postscale_factor)
    compressed, cctx = compression.compress(tensor)
    out = ops.reducescatter(compressed, name or "", int(op), float(prescale_factor),
                            float(postscale_factor), set_id_of(process_set))
    return compression.decompress(out, cctx)


# --- gradients in one fused call ----------------------------------------------------------------

def allreduce_gradients(parameters: Iterable[torch.Tensor], op: ReduceOp = ReduceOp.AVERAGE,
                        gradient_predivide_factor: float = 1.0,
                        compression: type[Compressor] | Compressor = NoneCompressor,
                        name: str = "gradients",
                        process_set: ProcessSet = global_process_set) -> None:
    """Replace every parameter's ``.grad`` by its reduction over the set, in one grouped allreduce.

    The compile-friendly alternative to ``DistributedOptimizer``'s gradient hooks: call it
    between ``backward()`` and a plain optimizer's ``step()``, eagerly or inside
    ``torch.compile(fullgraph=True)``. Parameters with ``requires_grad`` and no gradient yet get
    zeros (another rank may have one). Every rank must pass the same parameters in the same
    order; ``name`` must differ between concurrent calls.

    Args:
        parameters: the model's parameters (``model.parameters()``).
        op: ``hvd.Average`` (the default), ``hvd.Sum``, or another reduction op.
        gradient_predivide_factor: with ``op=Average``, divide by this factor before the sum
            and by ``size / factor`` after it (Horovod's meaning).
        compression: as in :func:`allreduce`.
        name: the group's name (default ``"gradients"``).
        process_set: as in :func:`allreduce`.

    Raises:
        ValueError: a gradient is sparse (use DistributedOptimizer, which handles them).
        CollectiveError: the allreduce failed (see :func:`allreduce`).
    """
    params = [p for p in parameters if p.requires_grad]
    if not params:
        return
    for i, p in enumerate(params):
        if p.grad is not None and p.grad.is_sparse:
            raise ValueError(with_hint(
                f"allreduce_gradients got a sparse gradient (parameter {i} of those with "
                f"requires_grad, shape {list(p.shape)})",
                "use hvd.DistributedOptimizer for sparse gradients, or make them dense"))
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    grads = [p.grad for p in params]
    op = int(op)  # not ReduceOp(op): see _op
    pre, post = 1.0, 1.0
    if op == ReduceOp.AVERAGE:  # as DistributedOptimizer: 1/f before the sum, f/size after
        pre, post = 1.0 / gradient_predivide_factor, float(gradient_predivide_factor)
    with torch.no_grad():
        if not _compiling():  # in place, the engine casting for the wire: no copy here
            synchronize(A.allreduce_tensors(grads, True, name, ReduceOp(op), pre, post, process_set,
                                            grouped=True, compression=compression, waited=True))
            return
        pairs = [compression.compress(g) for g in grads]
        outs = ops.grouped_allreduce([t for t, _ in pairs], name, op, pre, post,
                                     set_id_of(process_set))
        for g, out, (_, cctx) in zip(grads, outs, pairs):
            value = compression.decompress(out, cctx)
            if value is not g:
                g.copy_(value)
