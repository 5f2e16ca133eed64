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
"""
from __future__ import annotations

import time
from collections import defaultdict
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from accord.errors import with_hint
from accord.hapi import data
from accord.hapi.callbacks import Callback, CallbackList, config_callbacks
from accord.hapi.checkpoint import load_on_every_rank, save_checkpoint
from accord.hapi.metrics import Meters, Metric
from accord.hapi.precision import amp_settings, autocast
from accord.hapi.world import World, resolve_world

__all__ = ["Model"]


def _is_distributed_optimizer(optimizer: Any) -> bool:
    return hasattr(optimizer, "synchronize") and hasattr(optimizer, "skip_synchronize")


def _split(batch: Any) -> tuple[tuple[Any, ...], Any]:
    """A batch is ``(inputs..., label)``; a single tensor or 1-tuple is inputs without label."""
    if isinstance(batch, (tuple, list)):
        if len(batch) == 1:
            return (batch[0],), None
        return tuple(batch[:-1]), batch[-1]
    return (batch,), None


def _first(outputs: Any) -> torch.Tensor:
    """The output metrics are computed on: the first of several."""
    return outputs[0] if isinstance(outputs, (tuple, list)) else outputs


def _numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu()
    return (t.float() if t.dtype == torch.bfloat16 else t).numpy()


class Model:
    """Wrap ``network`` for ``prepare`` / ``fit`` / ``evaluate`` / ``predict`` / ``save`` / ``load``.

    Args:
        network: the module to train; moved to ``device``.
        device: default ``cuda:<local_rank>`` when a GPU is visible, else the CPU.
    Raises:
        RendezvousError: the launcher started other ranks but they could not be reached.
    """

    def __init__(self, network: nn.Module, device: str | torch.device | None = None) -> None:
        self.world: World = resolve_world()
        self.device = torch.device(device) if device is not None else self.world.default_device()
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.network = network.to(self.device)
        self._forward: Any = self.network
        self._optimizer: torch.optim.Optimizer | None = None
        self._wrapped: torch.optim.Optimizer | None = None  # the DistributedOptimizer we made
        self._loss: Any = None
        self._meters = Meters()
        self._amp_dtype: torch.dtype | None = None
        self._scaler: Any = None
        self._synced = False
        self.stop_training = False

    # --- who and where ------------------------------------------------------------------------

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
        return self._optimizer

    def parameters(self) -> Any:
        """The network's parameters (to build the optimizer with)."""
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
            amp_level: "O0" (off) or "O1" (autocast: bfloat16 on CPU, float16 with loss scaling
                on CUDA); or ``{"level": "O1", "dtype": "bfloat16"}``.
            compile: True (or ``torch.compile`` keyword arguments) to compile the forward pass.
        Raises:
            ValueError: an unknown amp level. TypeError: a metric that is not a Metric.
        """
        metrics = [] if metrics is None else ([metrics] if isinstance(metrics, Metric) else list(metrics))
        for m in metrics:
            if not isinstance(m, Metric):
                raise TypeError(with_hint(f"metrics must be accord.hapi.Metric instances, got {type(m).__name__}",
                                          "subclass accord.hapi.Metric (state/result give exact cross-rank values)"))
        self._amp_dtype, use_scaler = amp_settings(amp_level, self.device)
        self._scaler = torch.amp.GradScaler("cuda") if use_scaler else None
        if self._wrapped is not None and self._wrapped is not optimizer:
            # A DistributedOptimizer we made earlier still hooks every parameter: unhook it, or
            # each backward would submit its gradients twice.
            for handle in getattr(self._wrapped, "_hook_handles", []):
                handle.remove()
            self._wrapped = None
        if optimizer is not None and self.world.distributed and not _is_distributed_optimizer(optimizer):
            import accord.torch as hvd

            optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=self.network.named_parameters())
            self._wrapped = optimizer
        self._optimizer, self._loss = optimizer, loss
        self._meters.configure(loss is not None, metrics)
        self.world.broadcast_state(self.network, optimizer)
        self._synced = True
        if compile:
            self._forward = torch.compile(self.network, **(compile if isinstance(compile, dict) else {}))
        else:
            self._forward = self.network

    def _sync_once(self) -> None:
        if not self._synced:
            self.world.broadcast_state(self.network, None)
            self._synced = True

    def _autocast(self) -> Any:
        return autocast(self._amp_dtype, self.device)

    def _to_device(self, value: Any) -> Any:
        if not torch.is_tensor(value):
            return value
        if value.is_floating_point():
            param = next((p for p in self.network.parameters() if p.is_floating_point()), None)
            dtype = param.dtype if param is not None else torch.float32
            return value.to(self.device, dtype=dtype, non_blocking=True)
        return value.to(self.device, non_blocking=True)

    def _label(self, label: Any) -> Any:
        label = self._to_device(label)
        if torch.is_tensor(label) and not label.is_floating_point() and label.dtype != torch.bool:
            label = label.long()  # class indices: losses want int64
        return label

    # --- one batch ------------------------------------------------------------------------------

    def _loss_of(self, outputs: Any, label: Any) -> torch.Tensor:
        loss = self._loss(outputs, label)
        return loss.mean() if loss.dim() else loss

    def train_batch(self, inputs: Sequence[Any], label: Any) -> float:
        """One optimization step on ``inputs``/``label``; returns this rank's batch loss."""
        if self._optimizer is None or self._loss is None:
            raise RuntimeError(with_hint("training needs an optimizer and a loss",
                                         "call model.prepare(optimizer, loss, metrics) first"))
        if label is None:
            raise ValueError(with_hint("training batches have no label (a single element per sample)",
                                       "pass (X, y) arrays, or a Dataset whose items are (inputs..., label)"))
        self.network.train()
        inputs = [self._to_device(x) for x in inputs]
        label = self._label(label)
        opt = self._optimizer
        opt.zero_grad(set_to_none=True)
        with self._autocast():
            outputs = self._forward(*inputs)
            loss = self._loss_of(outputs, label)
        if self._scaler is None:
            loss.backward()
            opt.step()
        else:  # loss scaling: unscale the averaged gradients, step without a second allreduce
            self._scaler.scale(loss).backward()
            if _is_distributed_optimizer(opt):
                opt.synchronize()
                self._scaler.unscale_(opt)
                with opt.skip_synchronize():
                    self._scaler.step(opt)
            else:
                self._scaler.step(opt)
            self._scaler.update()
        self._meters.track(_first(outputs), loss, label, int(label.shape[0]) if torch.is_tensor(label) else len(label))
        return float(loss.detach())

    @torch.no_grad()
    def eval_batch(self, inputs: Sequence[Any], label: Any) -> float | None:
        """Forward ``inputs`` without gradients and accumulate loss/metrics; returns the batch loss."""
        self.network.eval()
        inputs = [self._to_device(x) for x in inputs]
        label = self._label(label)
        with self._autocast():
            outputs = self._forward(*inputs)
            loss = self._loss_of(outputs, label) if self._loss is not None and label is not None else None
        rows = int(label.shape[0]) if torch.is_tensor(label) else int(inputs[0].shape[0])
        if label is not None:
            self._meters.track(_first(outputs), loss, label, rows)
        return None if loss is None else float(loss)

    @torch.no_grad()
    def predict_batch(self, inputs: Sequence[Any]) -> list[torch.Tensor]:
        """The network's outputs for ``inputs`` (a list, one tensor per output)."""
        self.network.eval()
        with self._autocast():
            outputs = self._forward(*[self._to_device(x) for x in inputs])
        return list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]

    # --- metrics over the job -------------------------------------------------------------------

    def metrics_names(self) -> list[str]:
        """Names of the logged values: ``loss`` then each metric's names."""
        return self._meters.names()

    def _logs(self, name: str | None) -> dict[str, Any]:
        """Loss and metrics so far; summed over ranks with one allreduce unless ``name`` is None.

        The same allreduce carries ``stop_training``: afterwards it is set on every rank if any
        rank asked to stop (so a callback that runs on rank 0 only cannot leave ranks waiting).
        """
        reduce = None if name is None else (lambda v: self.world.allreduce_sum(v, name=name))
        logs, self.stop_training = self._meters.logs(self.stop_training, reduce)
        return logs

    # --- loops --------------------------------------------------------------------------------

    def fit(self, train_data: Any = None, eval_data: Any = None, batch_size: int = 1,
            epochs: int = 1, eval_freq: int = 1, log_freq: int = 10, save_dir: str | None = None,
            save_freq: int = 1, verbose: int = 2, drop_last: bool = False, shuffle: bool = True,
            num_workers: int = 0, callbacks: Sequence[Callback] | None = None,
            seed: int = 0) -> dict[str, list[float]]:
        """Train for ``epochs`` epochs, evaluating every ``eval_freq`` epochs.

        Args:
            train_data, eval_data: a Dataset, ``(X, y)`` arrays, or a DataLoader (used as is:
                then sharding it is up to you).
            batch_size: samples per step on each rank (the global batch is ``batch_size * world_size``).
            log_freq: steps between log lines; verbose: 0 silent, 1 bar on a terminal, 2 lines.
            save_dir, save_freq: checkpoint ``save_dir/<epoch>`` every ``save_freq`` epochs and
                ``save_dir/final`` (rank 0 writes).
            shuffle, seed: shuffle by ``(seed, epoch)``, identically on every rank.
            callbacks: extra :class:`Callback` objects. A callback that sets
                ``model.stop_training`` (on any rank) stops every rank at the next log step or
                epoch end.
        Returns:
            Per-epoch history: ``loss`` and metric names (global means), ``epoch_time`` (s),
            ``samples_per_sec`` (global), and ``eval_<name>`` for each evaluation.
        """
        loader = data.train_loader(train_data, batch_size, self.world.size, self.world.rank,
                                   shuffle, seed, drop_last, num_workers)
        evaluator = None if eval_data is None else data.eval_loader(
            eval_data, batch_size, self.world.size, self.world.rank, "eval_data", num_workers)
        cbks = config_callbacks(callbacks, self, {"epochs": epochs, "steps": len(loader),
                                                  "metrics": self.metrics_names()},
                                log_freq, verbose, save_freq, save_dir, training=True)
        history: dict[str, list[float]] = defaultdict(list)
        self.stop_training = False
        logs: dict[str, Any] = {}
        cbks.on_train_begin(logs)
        for epoch in range(epochs):
            data.set_epoch(loader, epoch)
            cbks.on_epoch_begin(epoch, {})
            start = time.perf_counter()
            logs = self._train_epoch(loader, cbks, log_freq)
            logs["epoch_time"] = time.perf_counter() - start
            logs["samples_per_sec"] = logs["samples"] / max(logs["epoch_time"], 1e-9)
            cbks.on_epoch_end(epoch, logs)
            for key, value in logs.items():
                if key != "step":
                    history[key].append(value)
            if evaluator is not None and ((epoch + 1) % eval_freq == 0 or epoch + 1 == epochs):
                for key, value in self._eval_loop(evaluator, cbks, log_freq).items():
                    history[f"eval_{key}"].append(value)
            if self._agree_stop():
                break
        cbks.on_train_end(logs)
        return dict(history)

    def _agree_stop(self) -> bool:
        """Stop on every rank if a callback asked for it on any rank."""
        if self.world.distributed:
            flag = torch.tensor([float(self.stop_training)], dtype=torch.float64)
            self.stop_training = bool(self.world.allreduce_sum(flag, "accord.hapi.stop")[0] > 0)
        return self.stop_training

    def _train_epoch(self, loader: Any, cbks: CallbackList, log_freq: int) -> dict[str, Any]:
        self._meters.reset()
        steps = len(loader)
        logs: dict[str, Any] = {}
        for step, batch in enumerate(loader):
            cbks.on_train_batch_begin(step, {})
            inputs, label = _split(batch)
            self.train_batch(inputs, label)
            logs = {"step": step + 1}
            # Every rank runs the same steps (padded shards), so all reach this allreduce, and
            # all see the same agreed stop flag: they leave the loop at the same step.
            agreed_stop = False
            if (step + 1) % log_freq == 0 or step + 1 == steps:
                logs.update(self._logs("accord.hapi.train.metrics"))
                agreed_stop = self.stop_training
            cbks.on_train_batch_end(step, logs)
            if agreed_stop:
                break
        return logs

    def _eval_loop(self, loader: Any, cbks: CallbackList, log_freq: int) -> dict[str, Any]:
        self._sync_once()
        self._meters.reset()
        steps = len(loader)
        cbks.on_eval_begin({"steps": steps, "metrics": self.metrics_names()})
        for step, batch in enumerate(loader):
            cbks.on_eval_batch_begin(step, {})
            inputs, label = _split(batch)
            self.eval_batch(inputs, label)
            logs: dict[str, Any] = {"step": step + 1}
            # Shards may differ in length: no collective inside the loop; alone, show progress.
            if not self.world.distributed and ((step + 1) % log_freq == 0 or step + 1 == steps):
                logs.update(self._logs(None))
            cbks.on_eval_batch_end(step, logs)
        final = self._logs("accord.hapi.eval.metrics")
        cbks.on_eval_end({**final, "steps": steps})
        return final

    def evaluate(self, eval_data: Any, batch_size: int = 1, log_freq: int = 10, verbose: int = 2,
                 num_workers: int = 0, callbacks: Sequence[Callback] | None = None) -> dict[str, Any]:
        """Loss and metrics over the whole evaluation set (every sample counted once, all ranks).

        Returns:
            ``{"loss": ..., <metric names>: ..., "samples": N}``, the same on every rank.
        """
        loader = data.eval_loader(eval_data, batch_size, self.world.size, self.world.rank,
                                  "eval_data", num_workers)
        cbks = config_callbacks(callbacks, self, {"steps": len(loader), "metrics": self.metrics_names()},
                                log_freq, verbose)
        return self._eval_loop(loader, cbks, log_freq)

    def predict(self, test_data: Any, batch_size: int = 1, num_workers: int = 0,
                stack_outputs: bool = True, verbose: int = 1,
                callbacks: Sequence[Callback] | None = None) -> np.ndarray | list[Any]:
        """The network's outputs for every sample, in dataset order, on every rank.

        A batch with several elements is taken as ``(inputs..., label)`` and the label is ignored.

        Returns:
            One array for a single-output network, else a list with one array per output; with
            ``stack_outputs=False`` each array is instead a list of ``batch_size`` pieces.
        """
        self._sync_once()
        loader = data.eval_loader(test_data, batch_size, self.world.size, self.world.rank,
                                  "test_data", num_workers)
        cbks = config_callbacks(callbacks, self, {"steps": len(loader), "metrics": []}, 10, verbose)
        cbks.on_predict_begin({"steps": len(loader)})
        parts: list[list[torch.Tensor]] = []
        for step, batch in enumerate(loader):
            cbks.on_predict_batch_begin(step, {})
            outputs = self.predict_batch(_split(batch)[0])
            parts.append([o.detach().cpu() for o in outputs])
            cbks.on_predict_batch_end(step, {"step": step + 1})
        local = [torch.cat([p[i] for p in parts]) for i in range(len(parts[0]))] if parts else None
        gathered = self.world.allgather_rows(local, "accord.hapi.predict")
        arrays = [_numpy(t) for t in gathered or []]
        cbks.on_predict_end({"samples": arrays[0].shape[0] if arrays else 0})
        if not stack_outputs:
            arrays = [np.split(a, range(batch_size, a.shape[0], batch_size)) for a in arrays]
        if not arrays:  # no rank had any sample
            return np.empty((0,))
        return arrays[0] if len(arrays) == 1 else arrays

    # --- checkpoints ----------------------------------------------------------------------------

    def save(self, path: str, training: bool = True) -> None:
        """Write ``path.pt`` (the network's state_dict) and, when ``training``, ``path.opt.pt``
        (optimizer and loss-scaler state). Only rank 0 writes; elsewhere this does nothing, so
        it may also be called from code that runs on rank 0 alone."""
        if self.rank == 0:
            save_checkpoint(path, self.network, self._optimizer if training else None, self._scaler)

    def load(self, path: str, skip_mismatch: bool = False, reset_optimizer: bool = False) -> None:
        """Load what :meth:`save` wrote (``path`` or ``path.pt``) on every rank.

        Rank 0 reads the files with ``torch.load(weights_only=True)`` onto its device and, with
        several ranks, broadcasts parameters and optimizer state, so the other ranks need not
        see the files (and cannot read a stale copy). Call it on every rank.

        Args:
            skip_mismatch: skip parameters missing from the file or of another shape.
            reset_optimizer: keep the optimizer's current state even if ``path.opt.pt`` exists.
        Raises:
            FileNotFoundError: ``path.pt`` does not exist (on rank 0; other ranks raise
                RuntimeError naming rank 0's error).
        """
        load_on_every_rank(self.world, path, self.network, self.device,
                           None if reset_optimizer else self._optimizer, self._scaler, skip_mismatch)
        self._synced = True
