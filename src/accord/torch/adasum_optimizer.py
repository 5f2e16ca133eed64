"""``DistributedOptimizer(op=Adasum)``: Horovod's delta-based Adasum optimizer.

Instead of combining gradients, each rank applies the wrapped optimizer's update to a parameter
as soon as its gradient is ready, and the *updates* (deltas) are combined with Adasum; every
rank then moves the parameter from where it started by the combined delta. As in Horovod, the
size must be a power of two; unlike Horovod, no MPI is needed (see :mod:`accord.torch.adasum`).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import torch

from accord.comm.ops import ReduceOp
from accord.torch import async_ops as A
from accord.torch import gateway
from accord.torch.grad_reduction import TOO_MANY_PASSES, ZERO_GRAD_RACE, _DistributedMixin, wrap_optimizer
from accord.torch.process_sets import global_process_set


class _AdasumMixin(_DistributedMixin):
    """Delta-Adasum methods layered over the wrapped optimizer class."""

    def _adasum_setup(self, named_parameters, compression, backward_passes_per_step) -> None:
        named = self._accord_names(named_parameters)
        self._parameter_names = {p: name for name, p in named}
        self._compression = compression
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay = {p: backward_passes_per_step for _, p in named}
        self._handles: dict[torch.Tensor, Any] = {}
        self._requires_update: set[torch.Tensor] = set()
        self._hook_handles: list[Any] = []
        self._starting_models = {p: torch.zeros_like(p, requires_grad=False) for _, p in named}
        for group in self.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    p.grad = torch.zeros_like(p)
                    self._requires_update.add(p)
                    self._hook_handles.append(p.register_post_accumulate_grad_hook(self._adasum_hook(p)))

    def _delta_async(self, p: torch.Tensor):
        """Step the wrapped optimizer on ``p`` alone, turn ``p`` into its delta and reduce it."""
        start = self._starting_models[p]
        stashed = [group["params"] for group in self.param_groups]
        for group in self.param_groups:
            group["params"] = [p] if any(p is q for q in group["params"]) else []
        try:
            with torch.no_grad():
                start.copy_(p)
            super(_DistributedMixin, self).step()
            with torch.no_grad():
                p.sub_(start)
            # in place: p holds the combined delta afterwards (compressed on the wire only)
            handle = A.allreduce_tensors([p], True, self._parameter_names.get(p), ReduceOp.ADASUM,
                                         1.0, 1.0, global_process_set, grouped=False,
                                         compression=self._compression)
        finally:
            for group, params in zip(self.param_groups, stashed):
                group["params"] = params
        return handle

    def _adasum_hook(self, p: torch.Tensor):
        def hook(*_ignored: Any) -> None:
            if self._allreduce_delay[p] <= 0:
                raise AssertionError(TOO_MANY_PASSES)
            handle = None
            self._allreduce_delay[p] -= 1
            if self._allreduce_delay[p] == 0:
                handle = self._delta_async(p)
            self._handles[p] = handle
        return hook

    def synchronize(self) -> None:
        """Nothing to do before ``step()``: Adasum combines updates, not gradients."""

    @contextmanager
    def skip_synchronize(self):
        raise AssertionError("Skipping synchronization is not supported when using Adasum optimizer.")
        yield  # pragma: no cover

    def step(self, closure=None):
        """Finish every parameter's delta reduction and move it to start + combined delta."""
        loss = closure() if closure is not None else None
        for p in self._requires_update - set(self._handles):
            self._handles[p] = self._delta_async(p)
        for p, handle in list(self._handles.items()):
            if handle is None:
                handle = self._delta_async(p)
            delta = gateway.synchronize(handle)
            start = self._starting_models[p]
            with torch.no_grad():
                start.add_(delta.to(start.dtype))
                p.copy_(start)
            self._allreduce_delay[p] = self.backward_passes_per_step
        self._handles.clear()
        return loss

    def zero_grad(self, *args, **kwargs):
        if self._handles:
            raise AssertionError(ZERO_GRAD_RACE)
        return super(_DistributedMixin, self).zero_grad(*args, **kwargs)


def make_adasum_optimizer(optimizer: torch.optim.Optimizer, named_parameters, compression,
                          backward_passes_per_step: int) -> torch.optim.Optimizer:
    """Build the Adasum variant of :func:`~accord.torch.DistributedOptimizer`."""
    wrapped = wrap_optimizer(optimizer, _AdasumMixin)
    wrapped._adasum_setup(named_parameters, compression, backward_passes_per_step)
    return wrapped
