"""``AccordStrategy``: Lightning's ``Trainer`` on ``accord.torch``, as Lightning 1.x's ``HorovodStrategy`` was.

What it does, and why:

- At setup (when fitting) rank 0's parameters, buffers and optimizer options (and state, if it
  has one: :mod:`accord.lightning.state`) reach every rank, and
  each optimizer becomes an ``hvd.DistributedOptimizer`` with ``backward_passes_per_step`` =
  ``Trainer(accumulate_grad_batches=...)``: gradients are averaged by hooks while backward runs.
- Lightning calls ``optimizer.step(closure)`` with a closure that runs the training step and
  backward, so a ``DistributedOptimizer`` that synchronized at the start of ``step`` would wait
  before the gradients exist. Each step therefore runs in ``skip_synchronize()``, and the strategy
  synchronizes right after the backward that precedes an optimizer step (not after the backward
  passes Lightning accumulates, which it runs inside ``block_backward_sync``). Gradient clipping,
  which Lightning applies between that backward and the step, so sees the averaged gradients,
  identical on every rank. (The context is entered per step, not once for the whole fit:
  ``load_state_dict``, which resuming from a checkpoint calls, ends a ``skip_synchronize`` in
  force, as Horovod's does.)
- When a rank's training data for an epoch ends (uneven data: a sampler of the user's, an
  iterable dataset), it calls ``hvd.join()``: until the others end too, it takes part in their
  gradient averages with zeros (Horovod's rule) instead of leaving them waiting; then the ranks
  that stepped fewer times take the weights (and optimizer and scheduler states) of one that
  stepped the most, and validation and the epoch's end begin on every rank together, from the
  same weights.
- ``reduce``/``all_gather``/``broadcast``/``barrier`` (``self.log(..., sync_dist=True)``,
  ``self.all_gather``, the callbacks) give DDP's results (:mod:`accord.lightning.collectives`).
- ``Trainer(sync_batchnorm=True)`` replaces the BatchNorm layers by ``hvd.SyncBatchNorm`` (torch's
  SyncBatchNorm, which DDP uses, needs a torch.distributed process group).
- Checkpoints are written by rank 0 only (Lightning's rule for every strategy, kept here).
- ``scale_lr=True`` (what ``strategy="horovod"`` selects) multiplies every learning rate, and the
  schedulers' base rates, by the number of ranks at setup, as Lightning 1.x's HorovodStrategy did;
  ``strategy="accord"`` leaves them as written, as DDP does.

The class is built for each Lightning package installed (``pytorch_lightning`` and ``lightning``)
by :mod:`accord.lightning.flavors`, from :class:`TrainerStrategyMixin` and that package's
``ParallelStrategy``.
"""
from __future__ import annotations

from contextlib import contextmanager, nullcontext
from typing import Any, Iterator

import torch

import accord.torch as hvd
from accord.lightning import collectives
from accord.lightning.state import after_join, broadcast_module, broadcast_optimizer, parameter_names


class TrainerStrategyMixin:
    """A Lightning ``Trainer`` strategy on accord's engine (see the module's docstring).

    Args:
        accelerator, parallel_devices, checkpoint_io, precision_plugin: as for Lightning's
            strategies (usually left to the Trainer's own arguments).
        scale_lr: multiply the learning rates by the number of ranks at setup (Lightning 1.x's
            HorovodStrategy did; ``strategy="horovod"`` sets it).
        compression: ``hvd.Compression.none`` (default), ``fp16`` or ``bf16`` for the gradients on
            the wire.
    """

    strategy_name = "accord"
    # Set by accord.lightning.flavors to that Lightning package's classes.
    _environment_class: type
    _join_callback_class: type

    def __init__(self, accelerator: Any = None, parallel_devices: list[torch.device] | None = None,
                 checkpoint_io: Any = None, precision_plugin: Any = None, *, scale_lr: bool = False,
                 compression: Any = None) -> None:
        from lightning_utilities.core.rank_zero import rank_zero_only  # installed with Lightning

        hvd.init()
        super().__init__(accelerator=accelerator, parallel_devices=parallel_devices,
                         cluster_environment=self._environment_class(), checkpoint_io=checkpoint_io,
                         precision_plugin=precision_plugin)
        rank_zero_only.rank = hvd.rank()
        self.scale_lr = scale_lr
        self.compression = compression if compression is not None else hvd.Compression.none
        self._accumulating = False
        self._failed = False
        self._join_callback: Any = None
        self._trainer: Any = None
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
    def is_distributed(self) -> bool:
        """True: the Trainer then gives each rank its share of the data (a DistributedSampler)."""
        return True

    @property
    def root_device(self) -> torch.device:
        """This rank's device: the CPU, or the GPU of its local rank (among the Trainer's devices
        when it names one per local rank, else among the visible GPUs)."""
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

    @property
    def handles_gradient_accumulation(self) -> bool:
        """False: Lightning accumulates (no step in between); the optimizer only counts the passes."""
        return False

    # --- setup and teardown -------------------------------------------------------------------

    def model_to_device(self) -> None:
        """Move the model to :attr:`root_device`."""
        assert self.model is not None
        self.model.to(self.root_device)

    def setup(self, trainer: Any) -> None:
        """Set up as Lightning does, then (when fitting) give every rank rank 0's model and
        optimizer state and wrap the optimizers in ``hvd.DistributedOptimizer``."""
        self._trainer = trainer
        self._failed = False
        fitting = trainer.state.fn == "fit"
        if fitting and self._layer_sync is not None:  # Trainer(sync_batchnorm=True): accord's SyncBatchNorm
            self.model = hvd.convert_sync_batchnorm(self.model)
        super().setup(trainer)
        if not fitting:
            return
        optimizers = list(self.optimizers)
        if self.scale_lr:
            for optimizer in optimizers:
                for group in optimizer.param_groups:
                    group["lr"] *= hvd.size()
            for config in self.lr_scheduler_configs:
                if hasattr(config.scheduler, "base_lrs"):
                    config.scheduler.base_lrs = [lr * hvd.size() for lr in config.scheduler.base_lrs]
        module = self.lightning_module
        assert module is not None
        broadcast_module(module)
        for optimizer in optimizers:
            broadcast_optimizer(optimizer, self._names)
        passes = trainer.accumulate_grad_batches
        self.optimizers = [self._distributed(optimizer, module, index, passes)
                           for index, optimizer in enumerate(optimizers)]
        if self._join_callback is None:
            self._join_callback = self._join_callback_class()
        if self._join_callback not in trainer.callbacks:
            trainer.callbacks.append(self._join_callback)

    def _distributed(self, optimizer: torch.optim.Optimizer, module: torch.nn.Module, index: int,
                     passes: int) -> torch.optim.Optimizer:
        if callable(getattr(optimizer, "skip_synchronize", None)):  # the user's own DistributedOptimizer
            return optimizer
        return hvd.DistributedOptimizer(optimizer, named_parameters=parameter_names(optimizer, module, index),
                                        backward_passes_per_step=passes, compression=self.compression)

    def on_train_batch_start(self, batch: Any, batch_idx: int, *args: Any, **kwargs: Any) -> None:
        """Follow a changed ``accumulate_grad_batches`` (``GradientAccumulationScheduler`` sets it
        when an epoch starts, after the last step of the one before)."""
        super().on_train_batch_start(batch, batch_idx, *args, **kwargs)
        passes = self._trainer.accumulate_grad_batches if self._trainer is not None else 1
        for optimizer in self.optimizers:
            if getattr(optimizer, "backward_passes_per_step", passes) != passes:
                optimizer.set_backward_passes_per_step(passes)

    def on_exception(self, exception: BaseException) -> None:
        """Remember the failure: teardown then does not wait for the other ranks in ``join``."""
        self._failed = True
        super().on_exception(exception)

    def teardown(self) -> None:
        """Take the gradient hooks off the model, wait (``hvd.join``) until every rank has
        finished, then tear down as Lightning does."""
        for optimizer in self.optimizers:
            remove = getattr(optimizer, "remove_hooks", None)
            if callable(remove):
                remove()
        if self._trainer is not None and self._join_callback is not None:
            self._trainer.callbacks = [c for c in self._trainer.callbacks if c is not self._join_callback]
        if hvd.is_initialized() and not self._failed:
            self.join()
        super().teardown()

    def join(self) -> int:
        """``hvd.join()``: this rank has no more data; until every rank has joined, take part in the
        others' collectives (with zeros). Then, if some rank stepped fewer times since the last
        join, every rank takes the model, optimizer and scheduler states of one that stepped the
        most (:func:`accord.lightning.state.after_join`). Returns the last rank to join."""
        last = self._names.join()
        steps, self._steps = self._steps, 0
        modules = [self.lightning_module] if self.lightning_module is not None else []
        schedulers = [config.scheduler for config in self.lr_scheduler_configs]
        after_join(steps, modules, self.optimizers, schedulers, self._names)
        return last

    # --- gradients ----------------------------------------------------------------------------

    @contextmanager
    def block_backward_sync(self) -> Iterator[None]:
        """Lightning runs the backward passes it accumulates in here: no synchronization after them."""
        self._accumulating = True
        try:
            yield None
        finally:
            self._accumulating = False

    def optimizer_step(self, optimizer: Any, closure: Any, model: Any = None, **kwargs: Any) -> Any:
        """Step as Lightning does, the optimizer skipping its own synchronization (see
        :meth:`post_backward`)."""
        skip = getattr(optimizer, "skip_synchronize", None)
        with skip() if callable(skip) else nullcontext():
            return super().optimizer_step(optimizer, closure, model, **kwargs)

    def post_backward(self, closure_loss: torch.Tensor) -> None:
        """After the backward before an optimizer step: wait for the averaged gradients (and start
        the averages of any whose hooks have not fired, such as an epoch's last, shorter
        accumulation)."""
        super().post_backward(closure_loss)
        if self._accumulating:
            return
        self._steps += 1
        for optimizer in self.optimizers:
            synchronize = getattr(optimizer, "synchronize", None)
            if callable(synchronize):
                synchronize()

    # --- collectives --------------------------------------------------------------------------

    def reduce(self, tensor: Any, group: Any = None, reduce_op: Any = "mean") -> Any:
        """Reduce ``tensor`` over every rank (``reduce_op``: "mean", "sum", "max", "min", "product"
        or torch.distributed.ReduceOp); anything else than a tensor comes back unchanged."""
        return collectives.reduce(tensor, self._names, group, reduce_op)

    def all_gather(self, tensor: torch.Tensor, group: Any = None, sync_grads: bool = False) -> torch.Tensor:
        """Every rank's ``tensor`` stacked along a new first dimension (``(world_size, *shape)``)."""
        return collectives.all_gather(tensor, self._names, group, sync_grads)

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """Rank ``src``'s ``obj`` on every rank."""
        return collectives.broadcast(obj, self._names, src)

    def barrier(self, name: str | None = None, *args: Any, **kwargs: Any) -> None:
        """Wait until every rank has reached a barrier."""
        collectives.barrier()


class JoinCallbackMixin:
    """Calls the strategy's ``join()`` (``hvd.join()``) after this rank's last training batch of an
    epoch (AccordStrategy adds it to the Trainer's callbacks while it fits)."""

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        """Join once the epoch's data on this rank is used up (the loop knows it from its fetcher,
        or from ``limit_train_batches``)."""
        progress = trainer.fit_loop.epoch_loop.batch_progress
        if progress.is_last_batch or batch_idx + 1 >= trainer.num_training_batches:
            trainer.strategy.join()
