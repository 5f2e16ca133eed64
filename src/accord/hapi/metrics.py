"""Metrics whose state is a vector of sums, so ranks combine them exactly.

Paddle's protocol is kept (``compute`` -> ``update`` -> ``accumulate`` / ``reset`` / ``name``),
and one method is added: :meth:`Metric.state` returns the additive state (e.g. correct counts
and the sample count). ``Model`` sums every rank's state with one allreduce and asks
:meth:`Metric.result` for the value, so with uneven shards the global accuracy is
``sum(correct) / sum(count)``, never an average of per-rank averages.
"""
from __future__ import annotations

import abc
from typing import Any, Callable, Sequence

import torch

from accord.errors import with_hint

__all__ = ["Accuracy", "Mean", "Meters", "Metric"]


class Metric(abc.ABC):
    """Base class: subclasses keep additive state and say how to turn it into values."""

    @abc.abstractmethod
    def reset(self) -> None:
        """Forget everything accumulated."""

    @abc.abstractmethod
    def update(self, *args: Any) -> None:
        """Accumulate one batch.

        Args:
            *args: the outputs of :meth:`compute` (a tuple is spread, anything else passed
                as one argument).
        """

    @abc.abstractmethod
    def state(self) -> torch.Tensor:
        """The additive state, what ``Model`` sums over the ranks.

        Returns:
            A 1-D float64 CPU tensor (a copy) that ranks can sum elementwise.
        """

    @abc.abstractmethod
    def result(self, state: torch.Tensor) -> float | list[float]:
        """The metric's value(s) for a ``state``.

        Args:
            state: what :meth:`state` returned, possibly summed over ranks.

        Returns:
            One float, or a list with one per name of :meth:`name`.
        """

    @abc.abstractmethod
    def name(self) -> list[str]:
        """The keys the metric's values get in logs and in ``fit``'s history.

        Returns:
            One name per value of :meth:`result`.
        """

    def compute(self, pred: torch.Tensor, label: torch.Tensor) -> Any:
        """Turn a batch's outputs and labels into :meth:`update`'s arguments.

        Args:
            pred: the network's output for the batch.
            label: the batch's labels.

        Returns:
            :meth:`update`'s arguments: a tuple is spread; by default ``(pred, label)``.
        """
        return pred, label

    def accumulate(self) -> float | list[float]:
        """The value over what this process has seen (no communication).

        Returns:
            ``result(state())``: one float, or a list of them.
        """
        return self.result(self.state())


def _add(state: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
    # Accumulate where the batch lives: no device-to-host copy (and wait) per step on a GPU.
    if state.device != batch.device:
        state = state.to(batch.device)
    return state + batch


def _labels(label: torch.Tensor, rows: int) -> torch.Tensor:
    label = label.reshape(-1) if label.dim() > 1 and label.shape[-1] == 1 else label
    if label.dim() != 1 or label.shape[0] != rows:
        raise ValueError(with_hint(
            f"Accuracy needs one class index per row: labels of shape {tuple(label.shape)} "
            f"for predictions with {rows} rows",
            "pass integer class labels of shape (N,) or (N, 1)"))
    return label.long()


class Accuracy(Metric):
    """Top-k classification accuracy for each k in ``topk``.

    Args:
        topk: the k values, e.g. ``(1, 2)``; names are ``acc`` for a single k (Paddle's), else
            ``acc_top1``, ``acc_top2``, ...
        name: override the base name ``acc``.

    >>> m = Accuracy(topk=(1, 2))
    >>> m.update(*m.compute(torch.tensor([[0.1, 0.7, 0.2]]), torch.tensor([2])))
    >>> m.accumulate()
    [0.0, 1.0]
    """

    def __init__(self, topk: Sequence[int] = (1,), name: str | None = None) -> None:
        ks = tuple(int(k) for k in (topk if isinstance(topk, (tuple, list)) else (topk,)))
        if not ks or any(k < 1 for k in ks):
            raise ValueError(with_hint(f"Accuracy got topk={topk!r}", "pass positive ints, e.g. topk=(1, 2)"))
        self.topk = ks
        self.maxk = max(ks)
        self._base = name or "acc"
        self.reset()

    def reset(self) -> None:
        # [correct for each k..., samples]; float64 so counts stay exact far past 2**24.
        self._state = torch.zeros(len(self.topk) + 1, dtype=torch.float64)

    def compute(self, pred: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        """Which of each row's best ``maxk`` classes is the label.

        Args:
            pred: ``(N, classes)`` scores, with at least ``max(topk)`` classes.
            label: class indices, of shape ``(N,)`` or ``(N, 1)``.

        Returns:
            A float64 ``(N, maxk)`` 0/1 matrix: column j says whether the j-th
            best class is the label.

        Raises:
            ValueError: ``pred`` is not 2-D or has too few classes, or the labels do not match
                its rows.
        """
        pred = pred.detach()
        if pred.dim() != 2:
            raise ValueError(with_hint(f"Accuracy needs (N, classes) predictions, got shape {tuple(pred.shape)}",
                                       "return class scores from the network, one row per sample"))
        if pred.shape[1] < self.maxk:
            raise ValueError(with_hint(f"Accuracy with topk={self.topk} needs at least {self.maxk} "
                                       f"classes; predictions have {pred.shape[1]}",
                                       f"use k <= {pred.shape[1]}"))
        label = _labels(label.detach().to(pred.device), pred.shape[0])
        best = pred.topk(self.maxk, dim=1).indices
        return (best == label.unsqueeze(1)).to(torch.float64)

    def update(self, correct: torch.Tensor) -> None:
        """Add a batch's correct matrix.

        Args:
            correct: the ``(N, maxk)`` matrix :meth:`compute` returned.
        """
        counts = [correct[:, :k].sum() for k in self.topk]
        batch = torch.stack([*counts, correct.new_tensor(float(correct.shape[0]))])
        self._state = _add(self._state, batch)

    def state(self) -> torch.Tensor:
        return self._state.detach().cpu().clone()

    def result(self, state: torch.Tensor) -> float | list[float]:
        total = float(state[-1])
        values = [float(c) / total if total else 0.0 for c in state[:-1].tolist()]
        return values[0] if len(values) == 1 else values

    def name(self) -> list[str]:
        if len(self.topk) == 1:
            return [self._base]
        return [f"{self._base}_top{k}" for k in self.topk]


class Mean(Metric):
    """Sample-weighted mean of a per-batch value (the loss): state ``[sum(value * n), sum(n)]``.

    Args:
        name: the value's name in logs.
    """

    def __init__(self, name: str = "loss") -> None:
        self._name = name
        self.reset()

    def reset(self) -> None:
        self._state = torch.zeros(2, dtype=torch.float64)

    def update(self, value: torch.Tensor | float, count: int = 1) -> None:
        """Add a batch whose mean is ``value`` over ``count`` samples.

        Args:
            value: the batch's mean (a 0-d or one-element tensor, or a number).
            count: the batch's number of samples, its weight.
        """
        v = value.detach().double() if torch.is_tensor(value) else torch.tensor(float(value), dtype=torch.float64)
        self._state = _add(self._state, torch.stack([v.reshape(()) * count, v.new_tensor(float(count))]))

    def state(self) -> torch.Tensor:
        return self._state.detach().cpu().clone()

    def result(self, state: torch.Tensor) -> float:
        return float(state[0]) / float(state[1]) if float(state[1]) else 0.0

    def name(self) -> list[str]:
        return [self._name]


class Meters:
    """The loss and metrics of one pass plus its sample count, combined over ranks at once.

    :meth:`logs` packs every meter's state, a stop flag and the sample count into one float64
    vector, so one allreduce gives exact global values (and whether any rank asked to stop).
    """

    def __init__(self) -> None:
        self.loss: Mean | None = None
        self.metrics: list[Metric] = []
        self.samples = 0

    def configure(self, with_loss: bool, metrics: Sequence[Metric]) -> None:
        """Track the loss (when there is one) and ``metrics`` from now on."""
        self.loss = Mean("loss") if with_loss else None
        self.metrics = list(metrics)

    def all(self) -> list[Metric]:
        """Every meter, the loss first."""
        return ([self.loss] if self.loss is not None else []) + self.metrics

    def names(self) -> list[str]:
        """Names of the values :meth:`logs` reports: ``loss``, then each metric's."""
        return [n for m in self.all() for n in m.name()]

    def reset(self) -> None:
        """Start a new pass."""
        for m in self.all():
            m.reset()
        self.samples = 0

    @torch.no_grad()
    def track(self, pred: torch.Tensor, loss: torch.Tensor | None, label: Any, rows: int) -> None:
        """Add one batch: its predictions, mean loss and labels."""
        if loss is not None and self.loss is not None:
            self.loss.update(loss.detach(), rows)
        if pred.is_floating_point() and pred.element_size() < 4:
            pred = pred.float()  # half precision under autocast: compare in float32
        for m in self.metrics:
            args = m.compute(pred, label)
            m.update(*(args if isinstance(args, tuple) else (args,)))
        self.samples += rows

    def logs(self, stop: bool, reduce: Callable[[torch.Tensor], torch.Tensor] | None) -> tuple[dict[str, Any], bool]:
        """``({"samples": n, <name>: value, ...}, stop)``, summed over ranks by ``reduce`` when
        given (then ``stop`` is True if it was on any rank)."""
        meters = self.all()
        states = [m.state() for m in meters]
        extra = torch.tensor([float(stop), float(self.samples)], dtype=torch.float64)
        vector = torch.cat([*states, extra])
        if reduce is not None:
            vector = reduce(vector)
            stop = bool(vector[-2] > 0)
        logs: dict[str, Any] = {"samples": int(round(float(vector[-1])))}
        start = 0
        for m, st in zip(meters, states):
            values = m.result(vector[start:start + len(st)])
            start += len(st)
            logs.update(zip(m.name(), values if isinstance(values, list) else [values]))
        return logs, stop
