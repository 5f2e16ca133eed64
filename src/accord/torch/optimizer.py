"""``DistributedOptimizer``: Horovod's gradient-averaging optimizer wrapper.

The returned object is an instance of a subclass of the wrapped optimizer's class that shares
its parameter groups, state and hooks (see :mod:`accord.torch.grad_reduction` for how gradients
are reduced, and :mod:`accord.torch.adasum_optimizer` for ``op=Adasum``).
"""
from __future__ import annotations

import warnings
from typing import Any, Iterable

import torch

from accord.comm.ops import ReduceOp
from accord.engine import Compressor, NoneCompressor
from accord.torch import gateway
from accord.torch.adasum_optimizer import make_adasum_optimizer
from accord.torch.grad_reduction import _DistributedMixin, wrap_optimizer
from accord.torch.process_sets import ProcessSet, global_process_set
from accord.torch.zero.optimizer import make_sharded_optimizer


def DistributedOptimizer(optimizer: torch.optim.Optimizer,
                         named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
                         compression: type[Compressor] | Compressor = NoneCompressor,
                         backward_passes_per_step: int = 1, op: ReduceOp = ReduceOp.AVERAGE,
                         gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                         groups: Any = None, sparse_as_dense: bool = False,
                         process_set: ProcessSet = global_process_set,
                         shard_optimizer_state: bool = False, shard_gradients: bool = False,
                         bucket_cap_mb: float = 25.0) -> torch.optim.Optimizer:
    """Wrap ``optimizer`` so that ``step()`` applies gradients averaged over the ranks.

    The arguments up to ``process_set`` are Horovod's. Beyond Horovod:
    ``shard_optimizer_state=True`` (ZeRO stage 1) keeps the optimizer state of only this rank's
    shard of the parameters (about 1/size of it): gradients are reduce-scattered in buckets of
    ``bucket_cap_mb`` while backward runs, each rank steps its shard with the optimizer's class
    and options, and the updated shards are all-gathered into the parameters.
    ``shard_gradients=True`` (ZeRO stage 2, needs ``shard_optimizer_state``) also keeps only the
    shard of the reduced gradient. See docs/sharded-optimizer.md.

    Example::

        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters())

    Args:
        optimizer: the torch optimizer to wrap (its class is kept: ``isinstance`` still holds).
        named_parameters: ``model.named_parameters()``: names each gradient's allreduce, so
            every rank must pass the same names in the same order; ``None``: numbered names.
        compression: the dtype gradients travel in (``hvd.Compression.none``, ``.fp16``,
            ``.bf16``); the engine casts as it moves the data.
        backward_passes_per_step: backward passes accumulated locally before one allreduce.
        op: ``hvd.Average`` (the default), ``hvd.Sum`` or ``hvd.Adasum``.
        gradient_predivide_factor: with Average, divide by ``f`` before the sum and by
            ``size / f`` after it.
        num_groups: deprecated alias of ``groups`` (an int).
        groups: an int: that many fused groups; a list of lists of parameters: those groups.
        sparse_as_dense: allreduce sparse gradients as dense tensors.
        process_set: the ranks whose gradients are averaged (default: all).
        shard_optimizer_state: ZeRO stage 1: each rank keeps the optimizer state of its shard
            of the parameters only.
        shard_gradients: ZeRO stage 2 (needs ``shard_optimizer_state``): each rank also keeps
            only its shard of the reduced gradient.
        bucket_cap_mb: when sharding, the size of the buckets gradients are reduce-scattered
            in while backward runs, in MB.

    Returns:
        The wrapped optimizer: ``step()`` first waits for the averaged gradients
        (``synchronize()``); ``zero_grad``, ``state_dict`` and the rest are the optimizer's.

    Raises:
        ValueError: ``backward_passes_per_step <= 0``, ``gradient_predivide_factor`` with an
            op other than Average, or bad or duplicate ``named_parameters`` or ``groups``;
            when sharding, an argument out of range or not supported (Adasum, ``groups``, an
            optimizer that is not elementwise, parameters that differ between ranks: raised on
            every rank).
        NotImplementedError: Adasum on a process set other than the global one.
    """
    if gradient_predivide_factor != 1.0 and op != ReduceOp.AVERAGE:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if num_groups != 0:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be removed "
                      "in v0.23.0.", DeprecationWarning, stacklevel=2)
        if groups is None:
            groups = num_groups
    if backward_passes_per_step <= 0:
        raise ValueError("backward_passes_per_step must be > 0")
    if shard_optimizer_state or shard_gradients:
        return make_sharded_optimizer(optimizer, named_parameters, compression,
                                      backward_passes_per_step, ReduceOp(op),
                                      gradient_predivide_factor, groups, process_set,
                                      shard_optimizer_state, shard_gradients, bucket_cap_mb)
    if op == ReduceOp.ADASUM and gateway.size() > 1:
        if process_set is not global_process_set and process_set.process_set_id != 0:
            raise NotImplementedError("Adasum does not support non-global process sets yet.")
        return make_adasum_optimizer(optimizer, named_parameters, compression,
                                     backward_passes_per_step)
    wrapped = wrap_optimizer(optimizer, _DistributedMixin)
    wrapped._accord_setup(named_parameters, compression, backward_passes_per_step, ReduceOp(op),
                          gradient_predivide_factor, groups, sparse_as_dense, process_set)
    return wrapped
