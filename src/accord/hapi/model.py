"""``accord.Model``: Paddle's high-level training API, distributed without code changes.

::

    model = accord.Model(net)
    model.prepare(torch.optim.SGD(model.parameters(), lr=0.1), torch.nn.CrossEntropyLoss(),
                  Accuracy(topk=(1, 2)))
    model.fit((X_train, y_train), (X_test, y_test), epochs=10, batch_size=32)

Run it as ``python train.py``, ``accordrun -np 4 python train.py`` or inside ``accord.spawn``:
with more than one rank the optimizer is wrapped in ``DistributedOptimizer``, rank 0's initial
state is broadcast, training data is sharded (``batch_size`` is per rank), metrics are summed
over ranks, only rank 0 prints, and checkpoints are written by rank 0.

The loops live next door: :mod:`~accord.hapi.training` (fit), :mod:`~accord.hapi.evaluation`
(evaluate, predict), :mod:`~accord.hapi.steps` (one batch), :mod:`~accord.hapi.checkpoint`
(save, load); they work on the :class:`~accord.hapi.state.ModelState` this class owns.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from accord.errors import with_hint
from accord.hapi import data, evaluation, steps
from accord.hapi.callbacks import Callback, config_callbacks
from accord.hapi.checkpoint import load_on_every_rank, resume_epoch, save_checkpoint
from accord.hapi.master_weights import MasterWeights, check_optimizer
from accord.hapi.metrics import Metric
from accord.hapi.precision import amp_settings
from accord.hapi.state import ModelState, is_sharded_optimizer
from accord.hapi.training import check_fit_args
from accord.hapi.training import fit as run_fit
from accord.hapi.world import World, resolve_world
from accord.runtime import admission

__all__ = ["Model"]


class Model:
    """Wrap ``network`` for ``prepare`` / ``fit`` / ``evaluate`` / ``predict`` / ``save`` / ``load``.

    Args:
        network: the module to train; moved to ``device``.
        device: default ``cuda:<local_rank>`` when a GPU is visible, else the CPU; a bare
            ``"cuda"`` means this rank's GPU (``cuda:<local_rank>``).

    Raises:
        RendezvousError: the launcher started other ranks but they could not be reached.
    """

    def __init__(self, network: nn.Module, device: str | torch.device | None = None) -> None:
        world: World = resolve_world()
        place = world.placement(device)
        if place.type == "cuda":
            torch.cuda.set_device(place)
        network = network.to(place)
        self._state = ModelState(world, place, network, forward=network)
        self._wrapped: torch.optim.Optimizer | None = None  # the DistributedOptimizer we made

    # --- who and where ------------------------------------------------------------------------

    @property
    def world(self) -> World:
        """The ranks training together."""
        return self._state.world

    @property
    def device(self) -> torch.device:
        """Where the network and batches live."""
        return self._state.device

    @property
    def network(self) -> nn.Module:
        """The module being trained."""
        return self._state.network

    @property
    def stop_training(self) -> bool:
        """Set it (e.g. from a callback, on any rank) to stop ``fit`` on every rank."""
        return self._state.stop_training

    @stop_training.setter
    def stop_training(self, value: bool) -> None:
        self._state.stop_training = value

    @property
    def rank(self) -> int:
        """This process's rank (0 when alone)."""
        return self.world.rank

    @property
    def world_size(self) -> int:
        """Number of ranks training together."""
        return self.world.size

    @property
    def optimizer(self) -> torch.optim.Optimizer | None:
        """The optimizer in use (a ``DistributedOptimizer`` when there are several ranks)."""
        return self._state.optimizer

    def parameters(self) -> Any:
        """The network's parameters, to build the optimizer with.

        Returns:
            ``self.network.parameters()``, an iterator of tensors.
        """
        return self.network.parameters()

    # --- setup ----------------------------------------------------------------------------------

    def prepare(self, optimizer: torch.optim.Optimizer | None = None, loss: Any = None,
                metrics: Metric | Sequence[Metric] | None = None,
                amp_level: str | dict[str, Any] = "O0", compile: bool | dict[str, Any] = False) -> None:
        """Choose the optimizer, loss and metrics; broadcast rank 0's state to every rank.

        Args:
            optimizer: a torch optimizer over ``model.parameters()``; wrapped in
                ``accord.torch.DistributedOptimizer`` when there are several ranks (unless it is one).
            loss: ``loss(outputs, labels)`` returning the batch's mean loss, e.g. ``nn.CrossEntropyLoss()``.
            metrics: :class:`~accord.hapi.metrics.Metric` instances, e.g. ``Accuracy(topk=(1, 2))``.
            amp_level: Paddle's levels: "O0" (off); "O1" (autocast: bfloat16 on CPU, float16
                with loss scaling on CUDA; weights stay float32); "O2" (the network's weights
                and gradients in that half dtype, except normalization layers, which stay
                float32; the optimizer updates float32 master weights, copied back after each
                step; forward under autocast; loss scaling with float16 on CUDA; see
                :mod:`accord.hapi.precision`). Or ``{"level": "O1" | "O2", "dtype":
                "bfloat16" | "float16"}``. Preparing again undoes O2 first: the network takes
                back its dtype with the master weights' values.
            compile: True (or ``torch.compile`` keyword arguments) to compile the forward pass.

        Raises:
            ValueError: an unknown amp level, a dtype other than bfloat16/float16, or O2 with a
                ``DistributedOptimizer(op=Adasum)``.
            TypeError: a metric that is not a Metric.
        """
        metrics = [] if metrics is None else ([metrics] if isinstance(metrics, Metric) else list(metrics))
        for m in metrics:
            if not isinstance(m, Metric):
                raise TypeError(with_hint(f"metrics must be accord.hapi.Metric instances, got {type(m).__name__}",
                                          "subclass accord.hapi.Metric (state/result give exact cross-rank values)"))
        amp = amp_settings(amp_level, self.device)
        if amp.half_weights:
            check_optimizer(optimizer)
        state = self._state
        if state.masters is not None:  # back to the network's own weights before anything else
            state.masters.release([state.optimizer, optimizer])
            state.masters = None
        state.amp_dtype = amp.dtype
        state.scaler = torch.amp.GradScaler("cuda") if amp.scale_loss else None
        if self._wrapped is not None and self._wrapped is not optimizer:
            # A DistributedOptimizer we made earlier still hooks every parameter: unhook it, or
            # each backward would submit its gradients twice.
            self._wrapped.remove_hooks()
            self._wrapped = None
        if optimizer is not None and self.world.distributed and not steps.is_distributed_optimizer(optimizer):
            import accord.torch as hvd

            optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=self.network.named_parameters())
            self._wrapped = optimizer
        if amp.half_weights:
            # After wrapping: the DistributedOptimizer names and hooks the network's parameters,
            # then the masters take their place in the groups. Every rank's masters become rank
            # 0's in the broadcast below.
            state.masters = MasterWeights(self.network, optimizer, amp.dtype)
        state.optimizer, state.loss = optimizer, loss
        state.meters.configure(loss is not None, metrics)
        if admission.admitted() is None:
            self.world.broadcast_state(self.network, optimizer, masters=state.masters)
        # else: a worker added to a running elastic job, whose peers are not preparing: its
        # state comes from theirs when fit(elastic=True) starts (hvd.elastic.run syncs it)
        state.synced = True
        if compile:
            state.forward = torch.compile(self.network, **(compile if isinstance(compile, dict) else {}))
        else:
            state.forward = self.network

    # --- one batch (see accord.hapi.steps) -----------------------------------------------------

    def train_batch(self, inputs: Sequence[Any], label: Any) -> float:
        """One optimization step on one batch, with this rank's data only (the gradients are
        averaged over the ranks by the DistributedOptimizer); loss and metrics accumulate.

        Args:
            inputs: the network's inputs, one element per ``forward`` argument.
            label: the batch's labels, passed to the loss and the metrics.

        Returns:
            This rank's batch loss.

        Raises:
            RuntimeError: ``prepare`` was not given an optimizer and a loss.
            ValueError: ``label`` is None.
        """
        return steps.train_step(self._state, inputs, label)

    def eval_batch(self, inputs: Sequence[Any], label: Any) -> float | None:
        """Forward one batch without gradients, in eval mode, and accumulate loss and metrics.

        Args:
            inputs: the network's inputs, one element per ``forward`` argument.
            label: the labels, or None (nothing is accumulated then).

        Returns:
            This rank's batch loss; None without a loss or a label.
        """
        return steps.eval_step(self._state, inputs, label)

    def predict_batch(self, inputs: Sequence[Any]) -> list[torch.Tensor]:
        """The network's outputs for one batch, in eval mode and without gradients (no
        communication).

        Args:
            inputs: the network's inputs, one element per ``forward`` argument.

        Returns:
            list[torch.Tensor]: one tensor per output of the network.
        """
        return steps.predict_step(self._state, inputs)

    # --- metrics over the job -------------------------------------------------------------------

    def metrics_names(self) -> list[str]:
        """Names of the logged values.

        Returns:
            ``loss`` (when there is a loss), then each metric's names.
        """
        return self._state.metrics_names()

    # --- loops (see accord.hapi.training and accord.hapi.evaluation) ---------------------------

    def fit(self, train_data: Any = None, eval_data: Any = None, batch_size: int = 1,
            epochs: int = 1, eval_freq: int = 1, log_freq: int = 10, save_dir: str | None = None,
            save_freq: int = 1, verbose: int = 2, drop_last: bool = False, shuffle: bool = True,
            num_workers: int = 0, callbacks: Sequence[Callback] | None = None,
            seed: int = 0, work_load_list: Sequence[float] | None = None,
            elastic: bool = False, resume: bool | None = None) -> dict[str, list[float]]:
        """Train for ``epochs`` epochs, evaluating every ``eval_freq`` epochs.

        Differences from Paddle's ``Model.fit``: evaluation and checkpoints follow Keras's count,
        after epochs ``eval_freq``, ``2 * eval_freq``, ... (1-based) and always after the last,
        where Paddle evaluates after epochs 1, ``1 + eval_freq``, ...; the history is returned
        (Paddle returns None); ``batch_size`` is one int (Paddle also takes a (train, eval) pair).

        Args:
            train_data: a Dataset, ``(X, y)`` arrays, or a DataLoader (used as is: then sharding
                it is up to you).
            eval_data: the same kinds as ``train_data``, for the evaluations (None: none).
            batch_size: samples per step on each rank (the global batch is ``batch_size * world_size``).
                Each rank reads ``ceil(len / world_size)`` samples (torch's DistributedSampler:
                padded by repeating samples from the start); a last batch shorter than
                ``batch_size`` is kept unless ``drop_last``.
            epochs: epochs to run (0: none, the callbacks still see train begin and end).
            eval_freq: evaluate after every ``eval_freq``-th epoch (and after the last).
            log_freq: steps between log lines.
            verbose: 0 silent, 1 bar on a terminal, 2 lines.
            drop_last: drop each rank's last batch when it is shorter than ``batch_size``.
            save_dir: checkpoint ``save_dir/<epoch>`` (the 0-based epoch) after every
                ``save_freq``-th epoch, and ``save_dir/final`` at the end (rank 0 writes);
                None: no checkpoints.
            save_freq: epochs between checkpoints (counted as ``eval_freq``).
            shuffle: shuffle by ``(seed, epoch)``, identically on every rank.
            num_workers: DataLoader worker processes per rank.
            seed: the shuffle's seed.
            callbacks: extra :class:`Callback` objects. A callback that sets
                ``model.stop_training`` (on any rank) stops every rank at the next log step or
                epoch end.
            work_load_list: one positive weight per rank, e.g. ``[1, 3]``: rank ``i`` trains on
                about ``w_i / sum(w)`` of the data in batches of ``batch_size``, so ranks run
                different numbers of steps; step ``k`` updates on the union of the ranks'
                ``k``-th batches exactly as one process would (how: :mod:`accord.hapi.training`).
                Evaluation shards stay even. Not with a DataLoader or Adasum.
            elastic: train under ``hvd.elastic.run`` (accordrun ``--min-np``,
                ``--host-discovery-script``): the state is committed after every step and
                training goes on when workers fail, join or leave (:mod:`accord.hapi.elastic`;
                ``self.elastic_state`` holds ``epoch``, ``batch`` and ``commits``). Needs a
                Dataset or arrays; not with ``work_load_list``.
            resume: with ``save_dir``, start after its latest epoch checkpoint (loaded on every
                rank) instead of at epoch 0; None (the default): when this is a restarted attempt
                (``accordrun --max-restarts``: ``ACCORD_RESTART_COUNT`` / ``TORCHELASTIC_RESTART_COUNT``
                above 0). The history then holds the epochs run since. Not with ``elastic``
                (which resumes in memory).

        Returns:
            Per-epoch history: ``loss`` and metric names (global means), ``epoch_time`` (s),
            ``samples_per_sec`` (global), and ``eval_<name>`` for each evaluation.

        Raises:
            ValueError: ``work_load_list`` does not fit the job (one weight per rank, a
                non-empty share each) or the optimizer; a count that is not a positive int
                (``epochs``: >= 0); ``train_data`` that gives no step (empty, or ``drop_last``
                with ``batch_size`` above each rank's share), or an empty ``eval_data``
                (before training when it is a Dataset or arrays), on every rank.
        """
        check_fit_args(batch_size, epochs, eval_freq, log_freq, save_freq)
        if elastic:
            if work_load_list is not None or isinstance(train_data, torch.utils.data.DataLoader):
                raise ValueError(with_hint("fit(elastic=True) needs a Dataset or arrays and no work_load_list",
                                           "pass the Dataset: fit reads it through an ElasticSampler"))
            from accord.hapi.elastic import fit_elastic

            return fit_elastic(self, train_data, eval_data, batch_size, epochs, eval_freq, log_freq,
                               save_dir, save_freq, verbose, drop_last, shuffle, num_workers,
                               callbacks, seed)
        first_epoch = resume_epoch(self, save_dir, resume)
        return run_fit(self._state, self, train_data, eval_data, batch_size, epochs, eval_freq,
                       log_freq, save_dir, save_freq, verbose, drop_last, shuffle, num_workers,
                       callbacks, seed, work_load_list, first_epoch=first_epoch)

    def evaluate(self, eval_data: Any, batch_size: int = 1, log_freq: int = 10, verbose: int = 2,
                 num_workers: int = 0, callbacks: Sequence[Callback] | None = None) -> dict[str, Any]:
        """Loss and metrics over the whole evaluation set (every sample counted once, all ranks).

        Args:
            eval_data: a Dataset, ``(X, y)`` arrays, or a DataLoader (used as is).
            batch_size: samples per step on each rank.
            log_freq: steps between log lines.
            verbose: 0 silent, 1 bar on a terminal, 2 lines.
            num_workers: DataLoader worker processes per rank.
            callbacks: extra :class:`Callback` objects.

        Returns:
            ``{"loss": ..., <metric names>: ..., "samples": N}``, the same on every rank.

        Raises:
            ValueError: ``eval_data`` gives no labelled sample on any rank (a mean over no
                samples is undefined; Paddle raises too), on every rank alike. A rank whose
                share is empty is fine: the means are over all ranks' samples.
        """
        loader = data.eval_loader(eval_data, batch_size, self.world.size, self.world.rank,
                                  "eval_data", num_workers)
        cbks = config_callbacks(callbacks, self, {"steps": len(loader), "metrics": self.metrics_names()},
                                log_freq, verbose)
        return evaluation.eval_loop(self._state, self.eval_batch, loader, cbks, log_freq)

    def predict(self, test_data: Any, batch_size: int = 1, num_workers: int = 0,
                stack_outputs: bool = True, verbose: int = 1,
                callbacks: Sequence[Callback] | None = None) -> np.ndarray | list[Any]:
        """The network's outputs for every sample, in dataset order, on every rank.

        A batch with several elements is taken as ``(inputs..., label)`` and the label is ignored.
        Unlike Paddle's ``predict`` (``stack_outputs=False`` by default, and always a list with
        one entry per output, so ``result[0]`` is the first output), a single-output network's
        result is the array itself, as Keras's ``predict`` returns it: ``result[0]`` is then the
        first sample's output.

        Args:
            test_data: a Dataset, arrays, or a DataLoader; labels in it are ignored.
            batch_size: samples per step on each rank.
            num_workers: DataLoader worker processes per rank.
            stack_outputs: True: one array per output; False: a list of per-batch pieces.
            verbose: 0 silent, 1 bar on a terminal, 2 lines.
            callbacks: extra :class:`Callback` objects.

        Returns:
            One array for a single-output network, else a list with one array per output; with
            ``stack_outputs=False`` each array is instead a list of ``batch_size`` pieces.
        """
        self._state.sync_once()
        loader = data.eval_loader(test_data, batch_size, self.world.size, self.world.rank,
                                  "test_data", num_workers)
        cbks = config_callbacks(callbacks, self, {"steps": len(loader), "metrics": []}, 10, verbose)
        return evaluation.predict_loop(self.world, self.predict_batch, loader, cbks, batch_size,
                                       stack_outputs)

    # --- checkpoints ----------------------------------------------------------------------------

    def save(self, path: str, training: bool = True) -> None:
        """Write ``path.pt`` (the network's state_dict: half weights under AMP O2) and, when
        ``training``, ``path.opt.pt`` (optimizer and loss-scaler state, and under O2 the float32
        master weights). Only rank 0 writes; elsewhere this does nothing, so it may also be
        called from code that runs on rank 0 alone, except with a sharded optimizer
        (``shard_optimizer_state=True``) when ``training``: its state is consolidated from every
        rank's shard, so every rank must call it (the callbacks do).

        Args:
            path: the files' path without extension (its folder must exist).
            training: also write the optimizer's state, to resume training.
        """
        optimizer = self.optimizer if training else None
        state = optimizer.state_dict() if is_sharded_optimizer(optimizer) else None
        if self.rank == 0:
            save_checkpoint(path, self.network, optimizer, self._state.scaler, self._state.masters,
                            optimizer_state=state)

    def load(self, path: str, skip_mismatch: bool = False, reset_optimizer: bool = False) -> None:
        """Load what :meth:`save` wrote (``path`` or ``path.pt``) on every rank.

        Rank 0 reads the files with ``torch.load(weights_only=True)`` onto its device and, with
        several ranks, broadcasts parameters and optimizer state, so the other ranks need not
        see the files (and cannot read a stale copy). Call it on every rank. Under AMP O2 the
        master weights come from ``path.opt.pt`` when it has them (even with
        ``reset_optimizer``), else from the loaded half weights.

        Args:
            path: what was given to :meth:`save` (with or without ``.pt``).
            skip_mismatch: skip parameters missing from the file or of another shape.
            reset_optimizer: keep the optimizer's current state even if ``path.opt.pt`` exists.

        Raises:
            FileNotFoundError: ``path.pt`` does not exist (on rank 0; other ranks raise
                RuntimeError naming rank 0's error).
        """
        load_on_every_rank(self.world, path, self.network, self.device,
                           None if reset_optimizer else self.optimizer, self._state.scaler, skip_mismatch,
                           self._state.masters)
        self._state.synced = True
