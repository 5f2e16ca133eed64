"""Synchronized batch normalization: batch statistics over the ranks, on CPU and GPU.

In training mode each rank computes its per-channel count, mean and sum of squared deviations,
the ranks allgather those ``2C + 1`` numbers and combine them exactly (Chan's parallel
variance), so the output equals plain BatchNorm on the concatenation of every rank's batch.
Backward allreduces the two per-channel sums the input gradient needs. Weight and bias
gradients stay local (their sum over ranks is the full-batch gradient), so a
``DistributedOptimizer`` averages them like any other gradient, as with Horovod's SyncBatchNorm.
Eval mode uses the running statistics and does not communicate.

``comm_scope``: ``'global'`` (or 1) synchronizes over every rank; ``'local'`` (or 0) over the
ranks on the same host only (Perseus' convention).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from accord.frontend.batch_norm_scope import host_process_set, scope_name
from accord.torch import async_ops as A
from accord.torch import gateway
from accord.torch.gateway import synchronize
from accord.torch.process_sets import ProcessSet, global_process_set


class _SyncBatchNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum, process_set):
        channels = x.shape[1]
        acc = torch.float64 if x.dtype == torch.float64 else torch.float32
        flat = x.detach().transpose(0, 1).reshape(channels, -1).to(acc)
        count = flat.shape[1]
        if count > 0:
            var, mean = torch.var_mean(flat, dim=1, unbiased=False)
        else:
            var = mean = torch.zeros(channels, dtype=acc, device=x.device)
        row = torch.cat([torch.tensor([float(count)], dtype=acc, device=x.device), mean, var * count])
        rows = synchronize(A.allgather_async(row.reshape(1, -1), process_set=process_set))
        counts, means, m2s = rows[:, :1], rows[:, 1:1 + channels], rows[:, 1 + channels:]
        total = float(counts.sum())
        if total <= 1:
            raise ValueError(f"Expected more than 1 value per channel when training, got {int(total)} "
                             f"in total over the ranks (input size {list(x.shape)} on this rank)")
        mean = (counts * means).sum(0) / total
        var = (m2s + counts * (means - mean) ** 2).sum(0) / total
        invstd = torch.rsqrt(var + eps)
        if running_mean is not None:
            with torch.no_grad():
                running_mean.mul_(1 - momentum).add_(mean.to(running_mean.dtype), alpha=momentum)
                unbiased = var * (total / max(total - 1, 1))
                running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)
        shape = [1, channels] + [1] * (x.dim() - 2)
        xhat = (x.detach().to(acc) - mean.view(shape)) * invstd.view(shape)
        out = xhat
        if weight is not None:
            out = out * weight.detach().to(acc).view(shape) + bias.detach().to(acc).view(shape)
        ctx.save_for_backward(xhat, weight, invstd)
        ctx.total, ctx.process_set, ctx.acc = total, process_set, acc
        return out.to(x.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        xhat, weight, invstd = ctx.saved_tensors
        channels = xhat.shape[1]
        shape = [1, channels] + [1] * (xhat.dim() - 2)
        dims = [0] + list(range(2, xhat.dim()))
        dy = grad_out.to(ctx.acc)
        sum_dy = dy.sum(dims)
        sum_dy_xhat = (dy * xhat).sum(dims)
        grad_weight = sum_dy_xhat.to(weight.dtype) if weight is not None else None
        grad_bias = sum_dy.to(weight.dtype) if weight is not None else None
        grad_x = None
        if ctx.needs_input_grad[0]:
            sums = synchronize(A.allreduce_async(torch.cat([sum_dy, sum_dy_xhat]), op=A.Sum,
                                                 process_set=ctx.process_set))
            g_sum_dy, g_sum_dy_xhat = sums[:channels], sums[channels:]
            scale = invstd if weight is None else invstd * weight.detach().to(ctx.acc)
            grad_x = (scale / ctx.total).view(shape) * (
                ctx.total * dy - g_sum_dy.view(shape) - xhat * g_sum_dy_xhat.view(shape))
            grad_x = grad_x.to(grad_out.dtype)
        return grad_x, grad_weight, grad_bias, None, None, None, None, None


class SyncBatchNorm(_BatchNorm):
    """BatchNorm whose training statistics cover the batches of every rank in ``comm_scope``.

    Same arguments as ``torch.nn.BatchNorm*d`` (any input of shape ``(N, C, ...)``), plus
    ``comm_scope``. In eval mode nothing is synchronized (the running statistics are used).

    Args:
        num_features: C, the number of channels.
        eps: added to the variance for numerical stability.
        momentum: the running statistics' update factor; ``None``: a cumulative average.
        affine: learn a per-channel weight and bias.
        track_running_stats: keep running mean and variance (else batch statistics in eval too,
            this rank's only).
        comm_scope: ``'global'`` or 1 (every rank, the default), ``'local'`` or 0 (the ranks
            on this host).
        device: where the parameters and buffers are created.
        dtype: their dtype.

    Raises:
        ValueError: an unknown ``comm_scope``.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = True, track_running_stats: bool = True,
                 comm_scope: Any = "global", device: Any = None, dtype: Any = None) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats,
                         device=device, dtype=dtype)
        self.comm_scope = scope_name(comm_scope)
        self._process_set: ProcessSet | None = None

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError("expected at least 2D input (got {}D input)".format(input.dim()))

    def _set(self) -> ProcessSet:
        if self._process_set is None:
            local = self.comm_scope != "global"
            self._process_set = host_process_set(ProcessSet, global_process_set) if local else global_process_set
        return self._process_set

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """Normalize ``input``; in training, with the mean and variance of every rank's batch.

        Args:
            input: ``(N, C, ...)``; N may differ between ranks (and be 0 on some).

        Returns:
            The normalized tensor, differentiable (the backward pass reduces over the ranks too).

        Raises:
            ValueError: ``input`` has fewer than 2 dimensions, or, in training, the ranks hold
                at most one value per channel in all.
        """
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        use_batch_stats = self.training or not self.track_running_stats
        # Eval never synchronizes (not even to register the per-host process sets, a collective):
        # with track_running_stats=False it normalizes with this rank's batch statistics.
        process_set = self._set() if self.training and gateway.is_initialized() else None
        if not self.training or process_set is None or len(gateway.process_set_members(
                process_set.process_set_id)) == 1:
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight, self.bias,
                                use_batch_stats, factor, self.eps)
        running = self.track_running_stats
        return _SyncBatchNormFn.apply(input, self.weight, self.bias,
                                      self.running_mean if running else None,
                                      self.running_var if running else None,
                                      self.eps, factor, process_set)

    @classmethod
    def convert_sync_batchnorm(cls, module: torch.nn.Module, comm_scope: Any = "global") -> torch.nn.Module:
        """Replace every BatchNorm layer of ``module`` by a SyncBatchNorm (same parameters and
        running statistics); :func:`convert_sync_batchnorm` as a class method.

        Args:
            module: a model, or one BatchNorm layer.
            comm_scope: ``"global"`` (default) or ``"local"``, as for the constructor.

        Returns:
            ``module``, converted, or the new layer when ``module`` was one.
        """
        return convert_sync_batchnorm(module, comm_scope)


def convert_sync_batchnorm(module: torch.nn.Module, comm_scope: Any = "global") -> torch.nn.Module:
    """Replace every ``BatchNorm*d`` in ``module`` (recursively) by :class:`SyncBatchNorm`.

    Args:
        module: a model, or a single BatchNorm layer.
        comm_scope: whose batch the statistics cover: ``"global"`` or 1 (every rank, the
            default), ``"local"`` or 0 (the ranks of this host; Perseus's scopes).

    Returns:
        ``module`` with its BatchNorm layers replaced (the same parameters and running
        statistics), or the new layer when ``module`` was one.

    Raises:
        ValueError: another ``comm_scope``.
    """
    scope = scope_name(comm_scope)
    if isinstance(module, _BatchNorm) and not isinstance(module, SyncBatchNorm):
        new = SyncBatchNorm(module.num_features, module.eps, module.momentum, module.affine,
                            module.track_running_stats, comm_scope=scope)
        if module.affine:
            with torch.no_grad():
                new.weight = module.weight
                new.bias = module.bias
        new.running_mean = module.running_mean
        new.running_var = module.running_var
        new.num_batches_tracked = module.num_batches_tracked
        new.train(module.training)
        return new
    for name, child in module.named_children():
        module.add_module(name, convert_sync_batchnorm(child, scope))
    return module
