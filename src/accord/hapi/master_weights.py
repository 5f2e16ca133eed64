"""AMP level O2's float32 master weights (Paddle's ``amp.decorate(level='O2')`` with a
multi-precision optimizer): the network trains in half precision, the optimizer updates float32
copies of its half parameters.

:class:`MasterWeights` casts the network's parameters and floating buffers to the half dtype,
except in normalization layers (their statistics and scales stay float32), gives every half
parameter the optimizer updates a float32 master (the half value upcast, as Paddle does) and
puts the masters in the optimizer's parameter groups in its place, moving optimizer state over.
A training step (:func:`accord.hapi.steps.backward_and_step`) then:

1. backward leaves half gradients on the network's parameters; a ``DistributedOptimizer``'s
   hooks, which stay on those parameters, allreduce them in half precision while backward runs;
2. ``synchronize()`` waits for them and :meth:`MasterWeights.grads_to_masters` copies them, as
   float32, into the masters' ``.grad``;
3. the optimizer steps its groups (the masters) inside ``skip_synchronize()``;
4. :meth:`MasterWeights.masters_to_params` rounds the masters back into the half parameters.

A ``DistributedOptimizer`` copes with masters swapped into its groups after it was built: what
it keeps per parameter (names, hooks, ``_requires_update``, pending handles, delays) is keyed by
the parameters it saw when built, the network's, so ``synchronize()`` reduces the half gradients;
``step()``, ``state_dict()``/``load_state_dict()`` and ``broadcast_optimizer_state`` only go
through ``param_groups`` and ``state``, which now hold the masters. Its ``zero_grad`` clears the
masters' gradients only: :meth:`MasterWeights.zero_param_grads` clears the network's. Adasum
(which steps the hooked parameters themselves) is refused.

The masters form an ``nn.Module``, so the elastic ``TorchState`` commits, restores and syncs them
as it does the network, and ``broadcast_parameters`` takes their ``state_dict``.
"""
from __future__ import annotations

import itertools
from typing import Any, Iterable

import torch
from torch import nn

from accord.errors import with_hint
from accord.hapi.state import is_distributed_optimizer

__all__ = ["KEPT_FLOAT32", "MasterWeights", "check_optimizer"]

# Layers whose parameters and buffers O2 leaves in float32, as Paddle does for BatchNorm,
# InstanceNorm and LayerNorm (and GroupNorm, RMSNorm): running statistics and normalizing
# scales lose too much in half precision. _NormBase covers BatchNorm, SyncBatchNorm (torch's
# and accord's) and InstanceNorm.
KEPT_FLOAT32: tuple[type, ...] = tuple(t for t in (
    nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm, getattr(nn, "RMSNorm", None))
    if t is not None)


def check_optimizer(optimizer: Any) -> None:
    """Refuse an optimizer O2 cannot drive through float32 masters.

    Raises:
        ValueError: a ``DistributedOptimizer(op=Adasum)``, which steps the network's own
            parameters to combine their updates, or a sharded one.
    """
    if optimizer is not None and is_distributed_optimizer(optimizer) and getattr(optimizer, "op", None) is None:
        raise ValueError(with_hint(
            f"amp_level O2 cannot use {type(optimizer).__name__} built with op=Adasum: Adasum "
            "combines the updates of the network's parameters, while O2 updates float32 masters",
            "use op=Average (the default) or op=Sum, or amp_level 'O1'"))
    if getattr(optimizer, "shard_optimizer_state", False):
        raise ValueError(with_hint(
            "amp_level O2 cannot use a sharded DistributedOptimizer (shard_optimizer_state=True): "
            "O2 swaps float32 masters into the optimizer's groups, a sharded optimizer keeps its "
            "shards of the parameters it was built on",
            "use amp_level 'O1', or shard_optimizer_state=False"))


def _cast_network(network: nn.Module, dtype: torch.dtype) -> list[tuple[torch.Tensor, torch.dtype]]:
    """Cast ``network``'s floating parameters and buffers to ``dtype`` in place (``.data``: the
    parameter objects stay the same, so optimizers and gradient hooks still hold them), except
    in :data:`KEPT_FLOAT32` layers. Returns each cast tensor with its former dtype."""
    cast = []
    for module in network.modules():
        if isinstance(module, KEPT_FLOAT32):
            continue
        for t in itertools.chain(module.parameters(recurse=False), module.buffers(recurse=False)):
            if t.is_floating_point() and t.dtype != dtype:
                cast.append((t, t.dtype))
                t.data = t.data.to(dtype)
                t.grad = None  # a gradient of the old dtype could not be accumulated into
    return cast


def _state_as(value: Any, key: str, dtype: torch.dtype) -> Any:
    """Optimizer state for a parameter of ``dtype``: floating tensors take it, as torch's
    ``Optimizer.load_state_dict`` does, except step counters."""
    if torch.is_tensor(value) and value.is_floating_point() and key != "step":
        return value.to(dtype)
    return value


def _swap(optimizer: torch.optim.Optimizer, mapping: dict[int, torch.Tensor]) -> None:
    """Replace the tensors named by ``mapping`` (``id(old) -> new``) in the optimizer's groups,
    and move their state to the new tensors (in the new tensors' dtype)."""
    for group in optimizer.param_groups:
        group["params"] = [mapping.get(id(t), t) for t in group["params"]]
    state = optimizer.state
    for old in [t for t in state if id(t) in mapping]:
        new = mapping[id(old)]
        state[new] = {k: _state_as(v, k, new.dtype) for k, v in state.pop(old).items()}


class MasterWeights(nn.Module):
    """Float32 masters of the half parameters ``optimizer`` updates (see the module docstring).

    Building it casts ``network`` to ``dtype`` and swaps the masters into ``optimizer``; call
    :meth:`release` to undo both.

    Args:
        network: the module to train; cast in place.
        optimizer: the optimizer over ``network``'s parameters (a ``DistributedOptimizer``
            already built over them is fine), or None (evaluation only: no masters).
        dtype: torch.bfloat16 or torch.float16.
    """

    def __init__(self, network: nn.Module, optimizer: torch.optim.Optimizer | None, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype
        self._cast = _cast_network(network, dtype)
        stepped = set() if optimizer is None else {
            id(p) for group in optimizer.param_groups for p in group["params"]}
        named = [(name, p) for name, p in network.named_parameters()
                 if p.dtype == dtype and p.requires_grad and id(p) in stepped]
        self._names = [name for name, _ in named]
        self._params = [p for _, p in named]  # a plain list: not registered in this module
        self.masters = nn.ParameterList(nn.Parameter(p.detach().to(torch.float32, copy=True))
                                        for p in self._params)
        if optimizer is not None:
            _swap(optimizer, {id(p): m for p, m in zip(self._params, self.masters)})

    def release(self, optimizers: Iterable[torch.optim.Optimizer | None]) -> None:
        """Undo the cast and the swap: the network's parameters take their former dtype with the
        masters' values (nothing is lost), and each optimizer given holds them (and their state)
        again instead of the masters."""
        master_of = {id(p): m for p, m in zip(self._params, self.masters)}
        with torch.no_grad():
            for t, dtype in self._cast:
                source = master_of.get(id(t), t)
                t.data = source.detach().to(dtype, copy=True)
                t.grad = None
        back = {id(m): p for p, m in zip(self._params, self.masters)}
        for optimizer in optimizers:
            if optimizer is not None:
                _swap(optimizer, back)

    def zero_param_grads(self) -> None:
        """Drop the half parameters' gradients (the optimizer's ``zero_grad`` sees the masters)."""
        for p in self._params:
            p.grad = None

    def grads_to_masters(self) -> None:
        """Give each master its half parameter's (already reduced) gradient, as float32."""
        for p, m in zip(self._params, self.masters):
            m.grad = None if p.grad is None else p.grad.to(torch.float32)

    @torch.no_grad()
    def masters_to_params(self) -> None:
        """Round the masters into the half parameters (after each optimizer step)."""
        if self._params:
            torch._foreach_copy_(self._params, list(self.masters))

    def named_masters(self) -> dict[str, torch.Tensor]:
        """``{network parameter name: master}``, what a checkpoint keeps."""
        return {name: m.detach() for name, m in zip(self._names, self.masters)}

    @torch.no_grad()
    def load_named(self, saved: dict[str, torch.Tensor] | None, loaded: Iterable[str]) -> None:
        """After the network's parameters named in ``loaded`` were set from outside: their masters
        take the saved masters (``saved``, from :meth:`named_masters`) where it has them, else the
        parameters' new values upcast. The other masters keep their values (so do their
        parameters)."""
        saved = saved or {}
        loaded = set(loaded)
        for name, p, m in zip(self._names, self._params, self.masters):
            if name not in loaded:
                continue
            value = saved.get(name)
            m.copy_(value if value is not None and value.shape == m.shape else p)

    @property
    def params(self) -> list[torch.Tensor]:
        """The half parameters that have masters, in the masters' order."""
        return list(self._params)
