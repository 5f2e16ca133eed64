"""The gradient-averaging machinery under ``DistributedOptimizer``: the methods layered over the
wrapped optimizer's class.

A post-accumulate-grad hook on every parameter submits the gradient's allreduce (in place, with
the optimizer's compression applied by the engine on the wire) the moment autograd has produced
it, so communication overlaps the rest of backward (and the engine fuses gradients that are
ready together); ``step()`` waits for them (``synchronize()``) and then runs the wrapped optimizer.
"""
from __future__ import annotations

import warnings
from contextlib import contextmanager
from typing import Any, Sequence

import torch

from accord.comm.ops import ReduceOp
from accord.runtime.settings import marked_elastic
from accord.torch import async_ops as A
from accord.torch import gateway

TOO_MANY_PASSES = ("Gradients were computed more than backward_passes_per_step times before call "
                   "to step(). Increase backward_passes_per_step to accumulate gradients locally.")
ZERO_GRAD_RACE = ("optimizer.zero_grad() was called after loss.backward() but before "
                  "optimizer.step() or optimizer.synchronize(). This is prohibited as it can "
                  "cause a race condition.")


def split_list(items: Sequence[Any], parts: int) -> list[list[Any]]:
    """Split ``items`` into ``parts`` contiguous chunks whose sizes differ by at most one."""
    base, extra = divmod(len(items), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + base + (1 if i < extra else 0)
        out.append(list(items[start:end]))
        start = end
    return out


class _DistributedMixin:
    """Methods layered over the wrapped optimizer class (see :func:`DistributedOptimizer`)."""

    def _accord_setup(self, named_parameters, compression, backward_passes_per_step, op,
                      gradient_predivide_factor, groups, sparse_as_dense, process_set) -> None:
        named = self._accord_names(named_parameters)
        self._parameter_names = {p: name for name, p in named}
        self._compression = compression  # applied by the engine, on the wire only
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay = {p: backward_passes_per_step for _, p in named}
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set
        self._handles: dict[Any, Any] = {}  # parameter or group -> handle (None: not launched)
        self._requires_update: set[torch.Tensor] = set()
        self._hook_handles: list[Any] = []
        self._synchronized = False
        self._should_synchronize = True
        self._groups = _check_groups(groups)
        self._p_to_group: dict[torch.Tensor, tuple[torch.Tensor, ...]] = {}
        self._group_counts: dict[tuple[torch.Tensor, ...], int] = {}
        # An elastic worker alone now may be joined later: its gradients must be averaged then,
        # and hooks cannot be added once hvd.elastic.run has started (Horovod: HOROVOD_ELASTIC=1).
        if process_set.included() and (gateway.size() > 1 or gateway.elastic()
                                       or marked_elastic()):
            self._register_hooks()

    def _accord_names(self, named_parameters) -> list[tuple[str, torch.Tensor]]:
        if named_parameters is not None:
            named = list(named_parameters)
        else:
            named = [(f"allreduce.noname.{i}.{j}", p) for i, group in enumerate(self.param_groups)
                     for j, p in enumerate(group["params"])]
        if any(not isinstance(item, tuple) for item in named):
            raise ValueError("named_parameters should be a sequence of tuples (name, parameter), "
                             "usually produced by model.named_parameters().")
        seen, dups = set(), set()
        for name, _ in named:
            (dups if name in seen else seen).add(name)
        if dups:
            raise ValueError("Parameter names in named_parameters must be unique. "
                             "Found duplicates: %s" % ", ".join(sorted(dups)))
        all_ids = {id(p) for group in self.param_groups for p in group["params"]}
        unnamed = all_ids - {id(p) for _, p in named}
        if unnamed:
            raise ValueError("named_parameters was specified, but one or more model parameters "
                             "were not named. Python object ids: %s" % ", ".join(map(str, unnamed)))
        return named

    # --- hooks --------------------------------------------------------------------------------

    def _register_hooks(self) -> None:
        params = [p for group in self.param_groups for p in group["params"] if p.requires_grad]
        if self._groups is not None:
            self._form_groups(params)
        for p in params:
            self._requires_update.add(p)
            self._hook_handles.append(p.register_post_accumulate_grad_hook(self._make_hook(p)))

    def _form_groups(self, params: list[torch.Tensor]) -> None:
        # Every rank must form the same groups: order parameters as rank 0 names them.
        from accord.torch.functions import broadcast_object

        names = broadcast_object([self._parameter_names.get(p) for p in params], root_rank=0,
                                 process_set=self.process_set)
        params = sorted(params, key=lambda p: names.index(self._parameter_names.get(p)))
        if isinstance(self._groups, list):
            ids = {id(p) for p in params}
            grouped = [[p for p in group if id(p) in ids] for group in self._groups]
            taken = {id(p) for group in grouped for p in group}
            grouped += [[p] for p in params if id(p) not in taken]
        else:
            grouped = split_list(params, self._groups)
        for group in (tuple(g) for g in grouped if g):
            for p in group:
                self._p_to_group[p] = group
            self._group_counts[group] = 0

    def _make_hook(self, p: torch.Tensor):
        def hook(*_ignored: Any) -> None:
            if p.grad is not None and p.grad.requires_grad:
                raise AssertionError(f"gradient of {self._parameter_names.get(p)!r} requires grad")
            if self._allreduce_delay[p] <= 0:
                raise AssertionError(TOO_MANY_PASSES)
            handle = None
            self._allreduce_delay[p] -= 1
            if self._allreduce_delay[p] == 0:
                if self._groups is not None:
                    group = self._p_to_group[p]
                    self._group_counts[group] += 1
                    if self._group_counts[group] == len(group):
                        self._launch_group(group)
                        return
                else:
                    handle = self._allreduce_grad_async(p)
            self._handles[p] = handle
        return hook

    # --- submitting -----------------------------------------------------------------------------

    def _scale_factors(self) -> tuple[float, float]:
        if self.op == ReduceOp.AVERAGE:
            # Split the average: 1/f before the sum, f/size after it (the engine divides by size).
            return 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        return 1.0, 1.0

    def _allreduce_grad_async(self, p: torch.Tensor):
        """Start reducing ``p``'s gradient in place (the engine casts for the wire, if the
        compression says so); a function for sparse gradients (see sparse_allreduce_async)."""
        if p.grad is None:
            # Another rank may have a gradient for p (data-dependent graphs): send zeros, never hang.
            p.grad = torch.zeros_like(p)
        name = self._parameter_names.get(p)
        tensor = p.grad
        if tensor.is_sparse:
            if not self.sparse_as_dense:
                return A.sparse_allreduce_async(tensor, name=name, op=self.op,
                                                process_set=self.process_set)
            tensor = tensor.to_dense()
        pre, post = self._scale_factors()
        return A.allreduce_tensors([tensor], True, name, self.op, pre, post, self.process_set,
                                   grouped=False, compression=self._compression)

    def _launch_group(self, group: tuple[torch.Tensor, ...]) -> None:
        for p in group:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            self._handles.pop(p, None)
        pre, post = self._scale_factors()
        name = self._parameter_names.get(group[0])
        self._handles[group] = A.allreduce_tensors([p.grad for p in group], True, name, self.op,
                                                   pre, post, self.process_set, grouped=True,
                                                   compression=self._compression)
        self._group_counts[group] = 0

    # --- public API ---------------------------------------------------------------------------

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Change how many backward passes are accumulated before gradients are reduced."""
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes

    def synchronize(self) -> None:
        """Wait for every gradient's allreduce (starting those whose hooks have not fired) and
        write the averaged gradients into ``p.grad``."""
        if not self.process_set.included():
            self._synchronized = True
            return
        launched = set()
        for key, handle in self._handles.items():
            if handle is not None:
                launched.update(key if isinstance(key, tuple) else (key,))
        if self._groups is not None:
            for group in list(self._group_counts):
                if not all(p in launched for p in group) and any(p in self._requires_update for p in group):
                    self._launch_group(group)
        else:
            for p in self._requires_update - launched:
                self._handles[p] = self._allreduce_grad_async(p)
        for key, handle in list(self._handles.items()):
            if callable(handle):  # a sparse gradient's gather
                self._store_grad(key, handle())
                continue
            reduced = gateway.synchronize(handle)  # in place: into p.grad, or a dense copy of it
            if not isinstance(key, tuple) and reduced is not key.grad:
                self._store_grad(key, reduced)
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step
        for group in self._group_counts:
            self._group_counts[group] = 0
        self._handles.clear()
        self._synchronized = True

    @staticmethod
    def _store_grad(p: torch.Tensor, value: torch.Tensor) -> None:
        if p.grad.is_sparse:
            p.grad.zero_().add_(value if value.is_sparse else value.to_sparse())
        elif value is not p.grad:
            p.grad.copy_(value)

    @contextmanager
    def skip_synchronize(self):
        """Inside this context ``step()`` does not synchronize (call ``synchronize()`` first)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        """Synchronize gradients (unless skipped), then apply the wrapped optimizer's step."""
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() "
                              "context after optimizer.synchronize(). This can cause training "
                              "slowdown. You may want to consider using "
                              "optimizer.skip_synchronize() context if you use "
                              "optimizer.synchronize() in your code.", stacklevel=2)
            self.synchronize()
        self._synchronized = False
        return super().step(closure)

    def _accord_local_step(self, closure=None):
        """The wrapped optimizer's step, without communication."""
        return super().step(closure)

    def zero_grad(self, *args, **kwargs):
        """Zero the gradients; refused while reductions are in flight (a race in Horovod too)."""
        if self._handles:
            raise AssertionError(ZERO_GRAD_RACE)
        return super().zero_grad(*args, **kwargs)

    def load_state_dict(self, *args, **kwargs):
        """Load state and forget any in-flight gradient bookkeeping."""
        self._handles = {}
        self._synchronized = False
        self._should_synchronize = True
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step
        groups = self.param_groups
        result = super().load_state_dict(*args, **kwargs)
        # torch puts new group dicts in param_groups. Keep the ones this optimizer was built on,
        # updated: they are shared with the optimizer it wraps, so an LR scheduler built on that
        # one keeps setting the rates used here (Horovod sets loaded options in place too; else
        # broadcast_optimizer_state would cut the scheduler off on every rank but the root).
        for kept, loaded in zip(groups, self.param_groups):
            kept.update(loaded)
        self.param_groups = groups
        return result

    def remove_hooks(self) -> None:
        """Detach this optimizer's gradient hooks from the parameters, e.g. before wrapping them
        in another DistributedOptimizer (else every backward submits their gradients twice).
        Backward then submits nothing for it; ``synchronize()`` still reduces every gradient."""
        for handle in self._hook_handles:
            handle.remove()
        self._hook_handles.clear()


def _check_groups(groups: Any) -> Any:
    if groups is None:
        return None
    if not (isinstance(groups, list) or (isinstance(groups, int) and groups > 0)):
        raise ValueError("groups should be a non-negative integer or a list of list of torch.Tensor.")
    if isinstance(groups, list):
        seen: set[int] = set()
        for group in groups:
            for p in group:
                if not isinstance(p, torch.Tensor):
                    raise ValueError("groups must consist of torch.Tensor.")
                if id(p) in seen:
                    raise ValueError("A parameter can only appear once in groups.")
                seen.add(id(p))
    return groups


def wrap_optimizer(optimizer: torch.optim.Optimizer, mixin: type) -> torch.optim.Optimizer:
    """An instance of a new subclass of ``optimizer``'s class with ``mixin`` first in its bases,
    sharing the optimizer's groups, state and hooks (its ``__dict__``). Per-instance overrides of
    step/zero_grad (e.g. an LR scheduler's step counter) are skipped: they would shadow ours."""
    base = optimizer.__class__
    cls = type(base.__name__, (mixin, base), {"__module__": mixin.__module__})
    wrapped = cls.__new__(cls)
    wrapped.__dict__.update({k: v for k, v in optimizer.__dict__.items()
                             if k not in ("step", "zero_grad")})
    return wrapped
