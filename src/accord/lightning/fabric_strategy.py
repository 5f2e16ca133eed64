"""``AccordFabricStrategy``: Lightning Fabric (``Fabric(strategy="accord")``) on ``accord.torch``.

- ``fabric.setup(model, optimizer)`` gives every rank rank 0's parameters, buffers and optimizer
  options (and state, if it has one: :mod:`accord.lightning.state`), and wraps each optimizer in
  ``hvd.DistributedOptimizer``: gradients are averaged by hooks while ``fabric.backward`` runs,
  and ``optimizer.step()`` waits for them.
- ``fabric.clip_gradients`` first waits for the averaged gradients (``synchronize()``), clips them,
  and the optimizer's next step then skips its own synchronization (``skip_synchronize``).
- ``fabric.no_backward_sync(model)`` (gradient accumulation): the backward passes inside it start
  no average; the first backward after it averages the accumulated gradients.
- Uneven data: a rank whose data ends first calls ``fabric.strategy.join()`` (every rank does, at
  the end of its data); see :meth:`FabricStrategyMixin.join`.
- ``fabric.all_reduce``/``all_gather``/``broadcast``/``barrier`` give DDP's results
  (:mod:`accord.lightning.collectives`); ``fabric.save`` writes on rank 0 only.

The class is built for each Fabric package installed (``lightning_fabric`` and ``lightning.fabric``)
by :mod:`accord.lightning.flavors`, from :class:`FabricStrategyMixin` and that package's
``ParallelStrategy``.
"""
from __future__ import annotations

from contextlib import ExitStack, contextmanager, nullcontext
from typing import Any, Iterator, Sequence

import torch

import accord.torch as hvd
from accord.lightning import collectives
from accord.lightning.state import after_join, broadcast_module, broadcast_optimizer, parameter_names

# backward_passes_per_step while Fabric accumulates: more passes than any loop runs, so no hook
# starts an average; the count is set back when the accumulation ends.
_ACCUMULATING = 2 ** 62


class FabricStrategyMixin:
    """A Lightning Fabric strategy on accord's engine (see the module's docstring).

    Args:
        accelerator, parallel_devices, checkpoint_io, precision: as for Fabric's strategies
            (usually left to Fabric's own arguments).
        compression: ``hvd.Compression.none`` (default), ``fp16`` or ``bf16`` for the gradients on
            the wire.
    """

    strategy_name = "accord"
    # Set by accord.lightning.flavors to that Fabric package's classes.
    _environment_class: type
    _sync_control_class: type

    def __init__(self, accelerator: Any = None, parallel_devices: list[torch.device] | None = None,
                 checkpoint_io: Any = None, precision: Any = None, *, compression: Any = None) -> None:
        from lightning_utilities.core.rank_zero import rank_zero_only  # installed with Lightning

        hvd.init()
        super().__init__(accelerator=accelerator, parallel_devices=parallel_devices,
                         cluster_environment=self._environment_class(), checkpoint_io=checkpoint_io,
                         precision=precision)
        rank_zero_only.rank = hvd.rank()
        self.compression = compression if compression is not None else hvd.Compression.none
        self._backward_sync_control = self._sync_control_class(self)
        self._modules: list[torch.nn.Module] = []
        self._distributed: list[torch.optim.Optimizer] = []
        self._synchronized: list[torch.optim.Optimizer] = []  # by a clip, since their last step
        self._names = collectives.Names()
        self._steps = 0  # optimizer steps since the last join

    # --- where this rank is -------------------------------------------------------------------

    @property
    def global_rank(self) -> int:
        """This process's rank in the job."""
        return hvd.rank()

    @property
    def local_rank(self) -> int:
        """This process's rank on its host."""
        return hvd.local_rank()

    @property
    def node_rank(self) -> int:
        """The index of this process's host."""
        return hvd.cross_rank()

    @property
    def world_size(self) -> int:
        """The number of ranks of the job."""
        return hvd.size()

    @property
    def root_device(self) -> torch.device:
        """This rank's device: the CPU, or the GPU of its local rank (among Fabric's devices when
        it names one per local rank, else among the visible GPUs)."""
        devices = self.parallel_devices or []
        if devices and devices[0].type == "cuda":
            if len(devices) == hvd.local_size():
                return devices[hvd.local_rank()]
            return torch.device("cuda", hvd.local_rank() % max(torch.cuda.device_count(), 1))
        return devices[0] if devices else torch.device("cpu")

    @property
    def distributed_sampler_kwargs(self) -> dict[str, int]:
        """Every rank's share of the data: ``num_replicas`` ranks, this one is ``rank``."""
        return {"num_replicas": hvd.size(), "rank": hvd.rank()}

    # --- setup --------------------------------------------------------------------------------

    def module_to_device(self, module: torch.nn.Module) -> None:
        """Move ``module`` to :attr:`root_device`."""
        module.to(self.root_device)

    def setup_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """Give every rank rank 0's parameters and buffers (the module itself is not wrapped)."""
        broadcast_module(module)
        self._modules.append(module)
        return module

    def setup_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Give every rank rank 0's optimizer options (and state, if it has one) and wrap the
        optimizer in ``hvd.DistributedOptimizer`` (its gradients named after the modules set up so far)."""
        if callable(getattr(optimizer, "skip_synchronize", None)):  # the user's own DistributedOptimizer
            return optimizer
        broadcast_optimizer(optimizer, self._names)
        wrapped = hvd.DistributedOptimizer(
            optimizer, named_parameters=parameter_names(optimizer, self._modules, len(self._distributed)),
            compression=self.compression)
        self._distributed.append(wrapped)
        return wrapped

    # --- gradients ----------------------------------------------------------------------------

    def optimizer_step(self, optimizer: Any, **kwargs: Any) -> Any:
        """Step; an optimizer whose gradients a clip already synchronized does not wait again."""
        self._steps += 1
        if any(optimizer is done for done in self._synchronized):
            self._synchronized = [done for done in self._synchronized if done is not optimizer]
            with optimizer.skip_synchronize():
                return super().optimizer_step(optimizer, **kwargs)
        return super().optimizer_step(optimizer, **kwargs)

    def _synchronize_for_clip(self, optimizer: Any) -> None:
        if callable(getattr(optimizer, "synchronize", None)) and \
                not any(optimizer is done for done in self._synchronized):
            optimizer.synchronize()
            self._synchronized.append(optimizer)

    def clip_gradients_norm(self, module: torch.nn.Module, optimizer: Any, max_norm: float | int,
                            norm_type: float | int = 2.0, error_if_nonfinite: bool = True) -> torch.Tensor:
        """Clip the averaged gradients (every rank the same) to ``max_norm``; returns their norm."""
        self._synchronize_for_clip(optimizer)
        return super().clip_gradients_norm(module, optimizer, max_norm, norm_type=norm_type,
                                           error_if_nonfinite=error_if_nonfinite)

    def clip_gradients_value(self, module: torch.nn.Module, optimizer: Any, clip_val: float | int) -> None:
        """Clip the averaged gradients (every rank the same) to ``[-clip_val, clip_val]``."""
        self._synchronize_for_clip(optimizer)
        return super().clip_gradients_value(module, optimizer, clip_val)

    @contextmanager
    def accumulating(self, module: torch.nn.Module) -> Iterator[None]:
        """Inside: backward passes through ``module`` start no gradient average (they accumulate)."""
        owned = {id(p) for p in module.parameters()}
        with ExitStack() as stack:
            for optimizer in self._distributed:
                if any(id(p) in owned for group in optimizer.param_groups for p in group["params"]):
                    passes = optimizer.backward_passes_per_step
                    optimizer.set_backward_passes_per_step(_ACCUMULATING)
                    stack.callback(optimizer.set_backward_passes_per_step, passes)
            yield

    # --- collectives --------------------------------------------------------------------------

    def all_reduce(self, tensor: Any, group: Any = None, reduce_op: Any = "mean") -> Any:
        """Reduce ``tensor`` over every rank (``reduce_op``: "mean", "sum", "max", "min", "product"
        or torch.distributed.ReduceOp); anything else than a tensor comes back unchanged."""
        return collectives.reduce(tensor, self._names, group, reduce_op)

    def all_gather(self, tensor: torch.Tensor, group: Any = None, sync_grads: bool = False) -> torch.Tensor:
        """Every rank's ``tensor`` stacked along a new first dimension (``(world_size, *shape)``)."""
        return collectives.all_gather(tensor, self._names, group, sync_grads)

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """Rank ``src``'s ``obj`` on every rank."""
        return collectives.broadcast(obj, self._names, src)

    def barrier(self, name: str | None = None) -> None:
        """Wait until every rank has reached a barrier."""
        collectives.barrier()

    def join(self, schedulers: Sequence[Any] = ()) -> int:
        """Call when this rank's data has ended (uneven data: before the others'): until every
        rank has joined, this rank takes part in their collectives with zeros (``hvd.join()``).
        Then, if some rank stepped fewer times since the last join, every rank takes the modules',
        optimizers' and ``schedulers``' states of one that stepped the most
        (:func:`accord.lightning.state.after_join`). Returns the last rank to join."""
        last = self._names.join()
        steps, self._steps = self._steps, 0
        after_join(steps, self._modules, self._distributed, list(schedulers), self._names)
        return last

    def teardown(self) -> None:
        """Take the gradient hooks off the modules, then tear down as Fabric does."""
        for optimizer in self._distributed:
            optimizer.remove_hooks()
        self._distributed, self._modules, self._synchronized = [], [], []
        super().teardown()


class BackwardSyncMixin:
    """What ``fabric.no_backward_sync(model)`` calls on accord's Fabric strategy."""

    def __init__(self, strategy: FabricStrategyMixin) -> None:
        self._strategy = strategy

    def no_backward_sync(self, module: torch.nn.Module, enabled: bool) -> Any:
        """A context in which backward passes through ``module`` only accumulate (when ``enabled``)."""
        return self._strategy.accumulating(module) if enabled else nullcontext()
