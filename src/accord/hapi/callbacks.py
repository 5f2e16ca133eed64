"""Callbacks for ``Model.fit/evaluate/predict`` (Paddle's hook names and defaults).

``fit`` always has a :class:`ProgBarLogger` (unless one is given) and a :class:`ModelCheckpoint`
(which does nothing without ``save_dir``). Metric values in ``logs`` are already summed over
ranks when a callback sees them, so decisions taken from them (early stopping) agree on every
rank; output is written by rank 0 only.
"""
from __future__ import annotations

import math
import os
import sys
from typing import IO, Any, Iterable, Sequence

from accord.errors import with_hint
from accord.hapi.progress import ProgressBar

__all__ = ["Callback", "CallbackList", "EarlyStopping", "LRScheduler", "ModelCheckpoint",
           "ProgBarLogger", "config_callbacks"]

Logs = dict[str, Any]


class Callback:
    """Base class; override the hooks you need. ``self.model`` and ``self.params`` are set by
    ``fit``/``evaluate``/``predict`` (params: epochs, steps, verbose, metrics, save_dir, ...)."""

    def __init__(self) -> None:
        self.model: Any = None
        self.params: dict[str, Any] = {}

    def set_params(self, params: dict[str, Any]) -> None:
        """Called by ``fit``/``evaluate``/``predict`` before any hook.

        Args:
            params: the run's settings: ``epochs``, ``steps`` (per epoch, ``None`` when
                unknown), ``metrics`` (the names in the logs), ``verbose``, ``save_dir``,
                ``log_freq``.
        """
        self.params = params

    def set_model(self, model: Any) -> None:
        """Called with the :class:`~accord.hapi.Model` being run, before any hook.

        Args:
            model: the Model (``model.stop_training = True`` ends ``fit`` after the epoch).
        """
        self.model = model

    def on_train_begin(self, logs: Logs | None = None) -> None:
        """Called once when ``fit`` starts, before the first epoch.

        Args:
            logs: an empty dict.
        """

    def on_train_end(self, logs: Logs | None = None) -> None:
        """Called once when ``fit`` ends (after the last epoch, or an early stop).

        Args:
            logs: the last epoch's logs (as for :meth:`on_epoch_end`).
        """

    def on_eval_begin(self, logs: Logs | None = None) -> None:
        """Called when an evaluation starts (``evaluate``, or within ``fit``).

        Args:
            logs: ``steps`` (this rank's batches) and ``metrics`` (the names to be reported).
        """

    def on_eval_end(self, logs: Logs | None = None) -> None:
        """Called when an evaluation ends, with its results summed over the ranks.

        Args:
            logs: ``loss`` and each metric's value, ``samples`` (over every rank), ``steps``.
        """

    def on_predict_begin(self, logs: Logs | None = None) -> None:
        """Called when ``predict`` starts.

        Args:
            logs: ``steps``, the number of batches of this rank.
        """

    def on_predict_end(self, logs: Logs | None = None) -> None:
        """Called when ``predict`` has gathered its outputs.

        Args:
            logs: ``samples``, how many predictions were gathered.
        """

    def on_epoch_begin(self, epoch: int, logs: Logs | None = None) -> None:
        """Called at the start of each training epoch (after ``params["steps"]`` was updated
        when the loader's length changed).

        Args:
            epoch: the epoch's number, from 0.
            logs: ``{}``.
        """

    def on_epoch_end(self, epoch: int, logs: Logs | None = None) -> None:
        """Called at the end of each training epoch, before its evaluation.

        Args:
            epoch: the number of the epoch just trained, from 0.
            logs: the epoch's ``loss`` and metrics (over every rank), ``samples``, ``step``,
                ``epoch_time`` (seconds) and ``samples_per_sec``.
        """

    def on_train_batch_begin(self, step: int, logs: Logs | None = None) -> None:
        """Called before each training batch.

        Args:
            step: the batch's index in the epoch, from 0.
            logs: an empty dict.
        """

    def on_train_batch_end(self, step: int, logs: Logs | None = None) -> None:
        """Called after each training batch.

        Args:
            step: the index of the batch just trained, from 0.
            logs: ``step`` (``step + 1``); every ``log_freq`` steps and at the last, also the
                loss and metrics so far, summed over the ranks.
        """

    def on_eval_batch_begin(self, step: int, logs: Logs | None = None) -> None:
        """Called before each evaluation batch.

        Args:
            step: the batch's index in this evaluation, from 0.
            logs: nothing yet: an empty dict.
        """

    def on_eval_batch_end(self, step: int, logs: Logs | None = None) -> None:
        """Called after each evaluation batch.

        Args:
            step: the index of the batch just evaluated.
            logs: ``step``; on one process, every ``log_freq`` steps, the values so far (with
                several ranks, the values come only at :meth:`on_eval_end`).
        """

    def on_predict_batch_begin(self, step: int, logs: Logs | None = None) -> None:
        """Called before each prediction batch; ``logs`` is empty (Paddle's signature).

        Args:
            step: the batch's index, from 0.
            logs: ``{}`` here.
        """

    def on_predict_batch_end(self, step: int, logs: Logs | None = None) -> None:
        """Called after each prediction batch.

        Args:
            step: the index of the batch just predicted.
            logs: ``step`` (``step + 1``).
        """


class CallbackList:
    """Calls a hook on every callback, in order."""

    def __init__(self, callbacks: Iterable[Callback]) -> None:
        self.callbacks = list(callbacks)

    def set_params(self, params: dict[str, Any]) -> None:
        for cb in self.callbacks:
            cb.set_params(params)

    def set_model(self, model: Any) -> None:
        for cb in self.callbacks:
            cb.set_model(model)

    def update_params(self, **changes: Any) -> None:
        """Change some params (e.g. ``steps`` when an epoch's length changes) on every callback."""
        for cb in self.callbacks:
            cb.set_params({**cb.params, **changes})

    def __getattr__(self, hook: str) -> Any:
        if not hook.startswith("on_"):
            raise AttributeError(hook)

        def call(*args: Any) -> None:
            for cb in self.callbacks:
                getattr(cb, hook)(*args)
        return call


def _is_chief(model: Any) -> bool:
    return getattr(model, "rank", 0) == 0


class ProgBarLogger(Callback):
    """Print ``Epoch 1/10`` and ``step 40/938 - loss: 0.1245 - acc: 0.8618 - 5ms/step`` on rank 0.

    Args:
        log_freq: print every this many steps (and at the last step).
        verbose: 0 silent; 1 a bar redrawn in place on a terminal (lines elsewhere); 2 lines.
        stream: where to write (default: sys.stdout at the time of printing).
    """

    def __init__(self, log_freq: int = 10, verbose: int = 2, stream: IO[str] | None = None) -> None:
        super().__init__()
        self.log_freq = max(1, int(log_freq))
        self.verbose = verbose
        self.stream = stream
        self._bar: ProgressBar | None = None
        self._last = 0

    def _out(self) -> IO[str]:
        return self.stream if self.stream is not None else sys.stdout

    def _active(self) -> bool:
        return bool(self.verbose) and _is_chief(self.model)

    def _print(self, text: str) -> None:
        out = self._out()
        out.write(text + "\n")
        out.flush()

    def _values(self, logs: Logs | None) -> list[tuple[str, float]]:
        logs = logs or {}
        return [(k, float(logs[k])) for k in self.params.get("metrics", []) if k in logs]

    def _start(self, steps: int | None) -> None:
        self._bar = ProgressBar(steps, verbose=self.verbose, stream=self._out())
        self._last = 0

    def _update(self, step: int, logs: Logs | None) -> None:
        values = self._values(logs)
        if self._bar is not None and values:
            self._bar.update(step, values)
            self._last = step

    def on_epoch_begin(self, epoch: int, logs: Logs | None = None) -> None:
        if self._active():
            self._print(f"Epoch {epoch + 1}/{self.params.get('epochs', '?')}")
            self._start(self.params.get("steps"))

    def on_train_batch_end(self, step: int, logs: Logs | None = None) -> None:
        if self._active():
            self._update(step + 1, logs)

    def on_epoch_end(self, epoch: int, logs: Logs | None = None) -> None:
        if self._active() and self._bar is not None:
            step = (logs or {}).get("step")
            if step and step != self._last:  # global values came after the loop (uneven steps)
                self._update(step, logs)
            self._bar.finish()

    def on_eval_begin(self, logs: Logs | None = None) -> None:
        if self._active():
            self._print("Eval begin...")
            self._start((logs or {}).get("steps"))

    def on_eval_batch_end(self, step: int, logs: Logs | None = None) -> None:
        if self._active():
            self._update(step + 1, logs)

    def on_eval_end(self, logs: Logs | None = None) -> None:
        if not self._active() or self._bar is None:
            return
        logs = logs or {}
        steps = logs.get("steps", self._last)
        if self._last != steps and steps:  # values are global only now (ranks ran uneven loops)
            self._update(steps, logs)
        self._bar.finish()
        self._print(f"Eval samples: {logs.get('samples', '?')}")

    def on_predict_begin(self, logs: Logs | None = None) -> None:
        if self._active():
            self._print("Predict begin...")

    def on_predict_end(self, logs: Logs | None = None) -> None:
        if self._active():
            self._print(f"Predict samples: {(logs or {}).get('samples', '?')}")


class ModelCheckpoint(Callback):
    """Save ``save_dir/<epoch>`` every ``save_freq`` epochs and ``save_dir/final`` at the end
    (rank 0 writes; see ``Model.save``).

    Args:
        save_freq: save after every this many epochs (at least 1).
        save_dir: the folder; ``None``: the callback does nothing.
    """

    def __init__(self, save_freq: int = 1, save_dir: str | None = None) -> None:
        super().__init__()
        self.save_freq = max(1, int(save_freq))
        self.save_dir = save_dir

    def _save(self, name: str) -> None:
        path = os.path.join(self.save_dir, name)  # type: ignore[arg-type]
        if _is_chief(self.model) and self.params.get("verbose"):
            print(f"save checkpoint at {os.path.abspath(path)}", flush=True)
        self.model.save(path)

    def on_epoch_end(self, epoch: int, logs: Logs | None = None) -> None:
        if self.save_dir and (epoch + 1) % self.save_freq == 0:
            self._save(str(epoch))

    def on_train_end(self, logs: Logs | None = None) -> None:
        if self.save_dir:
            self._save("final")


class EarlyStopping(Callback):
    """Stop ``fit`` when the evaluation metric ``monitor`` stops improving.

    Args:
        monitor: a key of the evaluation logs, e.g. "loss" or "acc".
        mode: "min", "max", or "auto" (max for names containing "acc", else min).
        patience: evaluations without improvement that are tolerated.
        min_delta: smallest change that counts as an improvement.
        baseline: a value to beat before anything counts as an improvement.
        save_best_model: save ``save_dir/best_model`` at each improvement (when fit has a save_dir).

    Raises:
        ValueError: ``mode`` is not one of the three.
    """

    def __init__(self, monitor: str = "loss", mode: str = "auto", patience: int = 0,
                 min_delta: float = 0.0, baseline: float | None = None, save_best_model: bool = True) -> None:
        super().__init__()
        if mode not in ("auto", "min", "max"):
            raise ValueError(with_hint(f"EarlyStopping got mode={mode!r}", "use 'auto', 'min' or 'max'"))
        self.monitor = monitor
        self.sign = (1.0 if "acc" in monitor else -1.0) if mode == "auto" else (1.0 if mode == "max" else -1.0)
        self.patience = patience
        self.min_delta = abs(min_delta)
        self.baseline = baseline
        self.save_best_model = save_best_model
        self.best: float | None = None
        self.wait = 0
        self.stopped_epoch: int | None = None
        self._epoch = 0

    def on_train_begin(self, logs: Logs | None = None) -> None:
        self.wait = 0
        self.best = self.baseline if self.baseline is not None else None
        self.stopped_epoch = None

    def on_epoch_end(self, epoch: int, logs: Logs | None = None) -> None:
        self._epoch = epoch

    def on_eval_end(self, logs: Logs | None = None) -> None:
        if not logs or self.monitor not in logs:
            return
        value = logs[self.monitor]
        value = float(value[0] if isinstance(value, (list, tuple)) else value)
        best = -math.inf * self.sign if self.best is None else self.best
        if self.sign * (value - best) > self.min_delta:
            self.best, self.wait = value, 0
            save_dir = self.params.get("save_dir")
            if self.save_best_model and save_dir:
                self.model.save(os.path.join(save_dir, "best_model"))
        else:
            self.wait += 1
        if self.wait > self.patience:
            self.model.stop_training = True
            self.stopped_epoch = self._epoch


class LRScheduler(Callback):
    """Step a ``torch.optim.lr_scheduler`` scheduler after every epoch or after every step.

    Args:
        scheduler: the scheduler (its ``step()`` is called without arguments).
        by_step: step it after every training batch.
        by_epoch: step it after every epoch (the default).

    Raises:
        ValueError: ``by_step`` and ``by_epoch`` are both True or both False.
    """

    def __init__(self, scheduler: Any, by_step: bool = False, by_epoch: bool = True) -> None:
        super().__init__()
        if by_step == by_epoch:
            raise ValueError(with_hint(f"LRScheduler got by_step={by_step}, by_epoch={by_epoch}",
                                       "choose exactly one of by_step=True or by_epoch=True"))
        self.scheduler = scheduler
        self.by_step = by_step

    def on_train_batch_end(self, step: int, logs: Logs | None = None) -> None:
        if self.by_step:
            self.scheduler.step()

    def on_epoch_end(self, epoch: int, logs: Logs | None = None) -> None:
        if not self.by_step:
            self.scheduler.step()


def config_callbacks(callbacks: Sequence[Callback] | None, model: Any, params: dict[str, Any],
                     log_freq: int = 10, verbose: int = 2, save_freq: int = 1,
                     save_dir: str | None = None, training: bool = False) -> CallbackList:
    """The callbacks of one ``fit``/``evaluate``/``predict`` call, defaults added."""
    cbks = list(callbacks or [])
    if not any(isinstance(c, ProgBarLogger) for c in cbks):
        cbks.insert(0, ProgBarLogger(log_freq, verbose))
    if training and not any(isinstance(c, ModelCheckpoint) for c in cbks):
        cbks.append(ModelCheckpoint(save_freq, save_dir))
    out = CallbackList(cbks)
    out.set_model(model)
    out.set_params({**params, "verbose": verbose, "save_dir": save_dir, "log_freq": log_freq})
    return out
