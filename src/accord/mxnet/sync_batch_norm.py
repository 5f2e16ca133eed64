"""Synchronized batch normalization for Gluon, with Perseus's ``comm_scope``.

In training each rank computes its per-channel count, mean and sum of squared deviations; the
ranks of the scope allgather those ``2C + 1`` numbers and combine them exactly (Chan's parallel
variance), so the output equals ``gluon.nn.BatchNorm`` over the concatenation of the scope's
batches. Backward allreduces the two per-channel sums the input gradient needs. gamma and beta
gradients stay local (their sum over the ranks is the full-batch gradient: a
``DistributedTrainer`` averages them like any other gradient). The moving statistics follow
MXNet's rule (``moving = momentum * moving + (1 - momentum) * batch``, biased variance) with the
scope's batch statistics, so they stay equal on every rank. Inference uses them and does not
communicate.

``comm_scope``: 0 or ``'local'`` (Perseus's default): the ranks on this host; 1 or ``'global'``:
every rank.

The collectives are named after the layer and its call count: MXNet may run the backward of
several layers at once on its custom-function threads, and names let the engine match them
whatever the order.
"""
from __future__ import annotations

from typing import Any

import torch

from accord.comm.ops import ReduceOp
from accord.engine import Op
from accord.frontend import queries
from accord.frontend.batch_norm_scope import host_process_set, scope_name
from accord.frontend.process_sets import ProcessSet, global_process_set
from accord.mxnet.bridge import mx, read_view, to_ndarray
from accord.mxnet.mpi_ops import run


class _SyncBatchNormFunction(mx.autograd.Function):
    def __init__(self, block: "SyncBatchNorm", running_mean: Any, running_var: Any, name: str) -> None:
        super().__init__()
        self.block, self.running_mean, self.running_var, self.name = block, running_mean, running_var, name

    def forward(self, x: Any, gamma: Any, beta: Any) -> Any:
        block = self.block
        xt = read_view(x).movedim(block.axis, 1)
        acc = torch.float64 if xt.dtype == torch.float64 else torch.float32
        channels = xt.shape[1]
        flat = xt.transpose(0, 1).reshape(channels, -1).to(acc)
        count = flat.shape[1]
        dev = flat.device
        var, mean = torch.var_mean(flat, dim=1, unbiased=False) if count else (
            torch.zeros(channels, dtype=acc, device=dev), torch.zeros(channels, dtype=acc, device=dev))
        row = torch.cat([torch.tensor([float(count)], dtype=acc, device=flat.device), mean, var * count])
        rows = run(Op.ALLGATHER, [row.reshape(1, -1)], f"{self.name}.stats", block.process_set)[0]
        counts, means, m2s = rows[:, :1], rows[:, 1:1 + channels], rows[:, 1 + channels:]
        total = float(counts.sum())
        if total <= 1:
            raise ValueError(f"Expected more than 1 value per channel when training, got {int(total)} "
                             f"over the ranks (input shape {list(x.shape)} on this rank)")
        mean = (counts * means).sum(0) / total
        var = (m2s + counts * (means - mean) ** 2).sum(0) / total
        invstd = torch.rsqrt(var + block.eps)
        m = block.momentum
        self.running_mean[:] = to_ndarray((m * read_view(self.running_mean).to(acc) + (1 - m) * mean)
                                          .to(read_view(self.running_mean).dtype))
        self.running_var[:] = to_ndarray((m * read_view(self.running_var).to(acc) + (1 - m) * var)
                                         .to(read_view(self.running_var).dtype))
        shape = [1, channels] + [1] * (xt.dim() - 2)
        xhat = (xt.to(acc) - mean.view(shape)) * invstd.view(shape)
        g = read_view(gamma).to(acc) if block.scale else torch.ones(channels, dtype=acc, device=dev)
        b = read_view(beta).to(acc) if block.center else torch.zeros(channels, dtype=acc, device=dev)
        out = xhat * g.view(shape) + b.view(shape)
        self.xhat, self.invstd, self.g, self.total = xhat, invstd, g, total
        self.dtype, self.gamma_dtype = xt.dtype, read_view(gamma).dtype
        return to_ndarray(out.to(xt.dtype).movedim(1, self.block.axis))

    def backward(self, dy: Any) -> tuple[Any, Any, Any]:
        xhat, channels = self.xhat, self.xhat.shape[1]
        shape = [1, channels] + [1] * (xhat.dim() - 2)
        dims = [0] + list(range(2, xhat.dim()))
        d = read_view(dy).movedim(self.block.axis, 1).to(xhat.dtype)
        sum_dy, sum_dy_xhat = d.sum(dims), (d * xhat).sum(dims)
        sums = run(Op.ALLREDUCE, [torch.cat([sum_dy, sum_dy_xhat])], f"{self.name}.grad",
                   self.block.process_set, reduce_op=ReduceOp.SUM)[0]
        g_dy, g_dy_xhat = sums[:channels], sums[channels:]
        scale = (self.invstd * self.g / self.total).view(shape)
        dx = scale * (self.total * d - g_dy.view(shape) - xhat * g_dy_xhat.view(shape))
        zeros = torch.zeros(channels, dtype=self.gamma_dtype, device=xhat.device)
        dgamma = sum_dy_xhat.to(self.gamma_dtype) if self.block.scale else zeros
        dbeta = sum_dy.to(self.gamma_dtype) if self.block.center else zeros
        return (to_ndarray(dx.to(self.dtype).movedim(1, self.block.axis)), to_ndarray(dgamma),
                to_ndarray(dbeta))


class SyncBatchNorm(mx.gluon.nn.BatchNorm):
    """``gluon.nn.BatchNorm`` whose training statistics cover the batches of every rank in
    ``comm_scope`` (0 = this host, Perseus's default; 1 = every rank). Same arguments as
    BatchNorm otherwise.

    Args:
        axis: the channel axis.
        momentum: the running statistics' decay (MXNet's convention: the weight of the old value).
        epsilon: added to the variance for numerical stability.
        center: learn a per-channel shift (beta).
        scale: learn a per-channel scale (gamma).
        use_global_stats: normalize with the running statistics, also in training (then nothing
            is synchronized).
        comm_scope: 0 or ``'local'`` (the ranks of this host), 1 or ``'global'`` (every rank).
        **kwargs: passed to ``gluon.nn.BatchNorm`` (e.g. ``in_channels``, initializers).

    Raises:
        ValueError: another ``comm_scope``.
    """

    def __init__(self, axis: int = 1, momentum: float = 0.9, epsilon: float = 1e-5,
                 center: bool = True, scale: bool = True, use_global_stats: bool = False,
                 comm_scope: Any = 0, **kwargs: Any) -> None:
        super().__init__(axis=axis, momentum=momentum, epsilon=epsilon, center=center, scale=scale,
                         use_global_stats=use_global_stats, **kwargs)
        self.comm_scope = scope_name(comm_scope)
        self.axis, self.momentum, self.eps = axis, momentum, epsilon
        self.center, self.scale, self.use_global_stats = center, scale, use_global_stats
        self._set: ProcessSet | None = None
        self._calls = 0

    @property
    def process_set(self) -> ProcessSet:
        """The ranks this layer synchronizes with (registered on first use; collective)."""
        if self._set is None:
            local = self.comm_scope != "global"
            self._set = host_process_set(ProcessSet, global_process_set) if local else global_process_set
        return self._set

    def hybrid_forward(self, F: Any, x: Any, gamma: Any, beta: Any, running_mean: Any,
                       running_var: Any) -> Any:
        """Gluon's forward: in training, normalize with the statistics of every rank's batch.

        BatchNorm's own forward runs when hybridized (``F`` is not ``mx.nd``), with
        ``use_global_stats``, outside training, before ``init()`` or on a set of one rank.

        Args:
            F: ``mx.nd`` or ``mx.sym``, as Gluon passes it.
            x: the input batch.
            gamma: the per-channel scale.
            beta: the per-channel shift.
            running_mean: the running mean, updated in training.
            running_var: the running variance, updated in training.

        Returns:
            The normalized batch.
        """
        if (F is not mx.nd or self.use_global_stats or not mx.autograd.is_training()
                or not queries.is_initialized() or self.process_set.size() == 1):
            return super().hybrid_forward(F, x, gamma, beta, running_mean, running_var)
        self._calls += 1
        fn = _SyncBatchNormFunction(self, running_mean, running_var, f"syncbn.{self.name}.{self._calls}")
        return fn(x, gamma, beta)


PerseusSyncBatchNorm = SyncBatchNorm
