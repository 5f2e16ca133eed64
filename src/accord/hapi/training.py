"""The training loop of ``Model.fit``: epochs, metric reductions at log steps, stops agreed
over the ranks, and weighted shares that give ranks different numbers of steps.

Equal shares (the default): every rank runs the same steps (padded shards), so the metrics
allreduce at each log step and at the last step lines up on every rank.

Weighted shares (``work_load_list``, see :mod:`accord.hapi.workload`): each rank scales its loss
by its share of the step's global batch, so the gradient allreduce yields the mean gradient over
that batch. A rank that runs out of data calls ``accord.torch.join()`` and from then on adds
zeros to the others' gradient allreduces (Average still divides by the full size, which the
scale accounts for). Our own collectives run only inside the steps every rank runs, and after
the join; then every rank takes the state of a rank that ran every step, since the others
skipped its last updates: network, AMP O2 master weights, optimizer, loss scaler, learning rates
and step-wise LR schedulers (Horovod's advice after join, done for you).
"""
from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from accord.comm.ops import ReduceOp
from accord.errors import with_hint
from accord.hapi import data
from accord.hapi.callbacks import Callback, CallbackList, LRScheduler, config_callbacks
from accord.hapi.evaluation import eval_loop, no_samples_error
from accord.hapi.state import ModelState
from accord.hapi.steps import is_distributed_optimizer, rows_of, split_batch, train_step
from accord.hapi.workload import StepPlan, weighted_plan

__all__ = ["EpochShape", "TRAIN_METRICS", "agree_stop", "check_fit_args", "fit", "train_epoch"]

TRAIN_METRICS = "accord.hapi.train.metrics"  # the name of the metrics allreduce of training


@dataclass(frozen=True)
class EpochShape:
    """The steps of one training epoch, as every rank sees them.

    Attributes:
        steps: global steps (the progress bar's total; the longest rank's steps).
        common: steps every rank runs; collectives inside the loop are only allowed there.
        plan: the per-rank batch rows with weighted shares, else None.
    """

    steps: int
    common: int
    plan: StepPlan | None = None

    @property
    def uneven(self) -> bool:
        """True when some rank runs out of data before the others."""
        return self.common != self.steps


def _gradient_op(optimizer: Any) -> ReduceOp | None:
    """How the optimizer combines gradients over ranks (Average when there is no reduction)."""
    if not is_distributed_optimizer(optimizer):
        return ReduceOp.AVERAGE
    op = getattr(optimizer, "op", None)
    return None if op is None else ReduceOp(op)


def epoch_shape(state: ModelState, loader: Any, batch_size: int, drop_last: bool,
                work_load_list: Sequence[float] | None) -> EpochShape:
    """The shape of an epoch over ``loader`` (built with the same ``work_load_list``).

    Raises:
        ValueError: weighted shares with an optimizer that neither averages nor sums gradients.
    """
    if work_load_list is None:
        return EpochShape(len(loader), len(loader))
    op = _gradient_op(state.optimizer)
    if op not in (ReduceOp.AVERAGE, ReduceOp.SUM):
        raise ValueError(with_hint(
            f"fit(work_load_list={list(work_load_list)}) needs gradients combined by Average or Sum, "
            f"but the optimizer uses {op.name if op is not None else type(state.optimizer).__name__}",
            "use accord.torch.DistributedOptimizer with op=Average (the default) or op=Sum, or "
            "drop work_load_list"))
    plan = weighted_plan(len(loader.dataset), work_load_list, batch_size, drop_last)
    if plan.steps[state.world.rank] != len(loader):  # the sampler and the plan must agree
        raise RuntimeError(with_hint(
            f"rank {state.world.rank} has {len(loader)} batches but the step plan says "
            f"{plan.steps[state.world.rank]} (plan: {plan.steps})",
            "this is a bug in accord.hapi; please report it with the dataset size and weights"))
    return EpochShape(plan.max_steps, plan.min_steps, plan)


def _loss_scale(state: ModelState, shape: EpochShape, step: int, rows: int) -> float | None:
    """The factor on this rank's mean loss that turns the gradient allreduce into the mean over
    ``step``'s global batch (None with equal shares: no scaling at all)."""
    plan = shape.plan
    if plan is None:
        return None
    rank = state.world.rank
    if rows != plan.rows[rank][step]:
        raise RuntimeError(with_hint(
            f"rank {rank}, step {step}: the batch has {rows} rows but the step plan expects "
            f"{plan.rows[rank][step]}", "the training Dataset must not change length during fit"))
    share = plan.share(rank, step)
    # Average divides the sum by the size: undo that, so the sum of shares (1) remains.
    return share * state.world.size if _gradient_op(state.optimizer) is ReduceOp.AVERAGE else share


def _take_state_of(state: ModelState, cbks: CallbackList, root: int) -> None:
    """Make every rank's training state rank ``root``'s (after a join with uneven steps)."""
    world = state.world
    optimizer = state.optimizer
    world.broadcast_state(state.network, optimizer, state.scaler, root=root, masters=state.masters)
    # Learning rates live in param_groups (not optimizer state) and step-wise schedulers count
    # steps: the ranks that ran fewer steps are behind on both.
    schedulers = [cb.scheduler for cb in cbks.callbacks if isinstance(cb, LRScheduler) and cb.by_step]
    groups = [] if optimizer is None else [
        {k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    mine = {"groups": groups, "schedulers": [s.state_dict() for s in schedulers]}
    root_state = world.broadcast_object(mine, "accord.hapi.step_state", root)
    if world.rank == root:
        return
    if optimizer is not None:
        for group, options in zip(optimizer.param_groups, root_state["groups"]):
            group.update(options)
    for scheduler, saved in zip(schedulers, root_state["schedulers"]):
        scheduler.load_state_dict(saved)


def train_epoch(state: ModelState, loader: Any, cbks: CallbackList, log_freq: int,
                shape: EpochShape) -> dict[str, Any]:
    """One epoch on this rank; returns the global logs (``step``, ``samples``, loss, metrics)."""
    state.meters.reset()
    logs: dict[str, Any] = {}
    reduced = False
    for step, batch in enumerate(loader):
        cbks.on_train_batch_begin(step, {})
        inputs, label = split_batch(batch)
        train_step(state, inputs, label, _loss_scale(state, shape, step, rows_of(label, inputs)))
        logs = {"step": step + 1}
        # Only at steps every rank runs do all ranks reach this allreduce, in the same order,
        # and see the same agreed stop flag: they then leave the loop at the same step.
        reduced = step < shape.common and ((step + 1) % log_freq == 0 or step + 1 == shape.steps)
        agreed_stop = False  # read before the callbacks: a stop they ask for is not agreed yet
        if reduced:
            logs.update(state.logs(TRAIN_METRICS))
            agreed_stop = state.stop_training
        cbks.on_train_batch_end(step, logs)
        if agreed_stop:
            return logs  # every rank ran the same steps: nobody joins, nothing to copy
    if shape.uneven:
        state.world.join()
        _take_state_of(state, cbks, shape.plan.root if shape.plan is not None else 0)
    elif reduced:
        return logs
    return {"step": shape.steps, **state.logs(TRAIN_METRICS)}


def agree_stop(state: ModelState) -> bool:
    """Stop on every rank if a callback asked for it on any rank."""
    if state.world.distributed:
        flag = torch.tensor([float(state.stop_training)], dtype=torch.float64)
        state.stop_training = bool(state.world.allreduce_sum(flag, "accord.hapi.stop")[0] > 0)
    return state.stop_training


def check_fit_args(batch_size: Any, epochs: Any, eval_freq: Any, log_freq: Any, save_freq: Any) -> None:
    """Refuse counts ``fit`` cannot use (every rank checks the same values, so all refuse).

    Raises:
        ValueError: ``epochs`` is not an int >= 0, or another count is not an int >= 1.
    """
    counts = {"batch_size": (batch_size, 1), "epochs": (epochs, 0), "eval_freq": (eval_freq, 1),
              "log_freq": (log_freq, 1), "save_freq": (save_freq, 1)}
    for name, (value, least) in counts.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(with_hint(f"fit({name}={value!r}): {name} must be an int >= {least}",
                                       f"pass a whole number, e.g. {name}={max(least, 1)}"))


def _check_has_steps(shape: EpochShape, loader: Any, batch_size: int, drop_last: bool, size: int) -> None:
    """An epoch without a single step would train nothing and log made-up zeros: refuse it."""
    if shape.steps:
        return
    samples = len(loader.dataset) if hasattr(loader.dataset, "__len__") else "?"
    raise ValueError(with_hint(
        f"fit has no training step to run: {samples} training samples over {size} rank(s) with "
        f"batch_size={batch_size}, drop_last={drop_last} give 0 batches per epoch",
        "pass a non-empty train_data, and with drop_last=True a batch_size no larger than each "
        "rank's share (samples / ranks)"))


def fit(state: ModelState, model: Any, train_data: Any, eval_data: Any, batch_size: int, epochs: int,
        eval_freq: int, log_freq: int, save_dir: str | None, save_freq: int, verbose: int,
        drop_last: bool, shuffle: bool, num_workers: int, callbacks: Sequence[Callback] | None,
        seed: int, work_load_list: Sequence[float] | None, first_epoch: int = 0,
        after_epoch: Callable[[int, dict[str, Any]], None] | None = None,
        stop_training: bool = False) -> dict[str, list[float]]:
    """``Model.fit`` (see there for the arguments and the returned history) on ``state``.

    ``model`` is what callbacks see as ``self.model`` (the ``Model``); its ``eval_batch`` runs
    the evaluation batches. ``first_epoch`` and ``after_epoch(epoch, epoch_history)`` serve
    elastic training (:mod:`accord.hapi.elastic`): it resumes at a committed epoch, its loader
    may hold only the rest of that epoch (so the steps are counted again every epoch), and it
    commits after each epoch; an empty epoch is then allowed. ``stop_training`` is the stop
    it resumes with (agreed before a re-formation): the loop ends at its first log step.
    """
    world = state.world
    loader = data.train_loader(train_data, batch_size, world.size, world.rank, shuffle, seed,
                               drop_last, num_workers, work_load_list)
    shape = epoch_shape(state, loader, batch_size, drop_last, work_load_list)
    if after_epoch is None and epochs > 0:
        _check_has_steps(shape, loader, batch_size, drop_last, world.size)
    evaluator = None if eval_data is None else data.eval_loader(
        eval_data, batch_size, world.size, world.rank, "eval_data", num_workers)
    if evaluator is not None and evaluator is not eval_data and len(evaluator.dataset) == 0:
        # Known before training (the whole set, the same on every rank): better than failing
        # after the first epochs in eval_loop. (Paddle's fit goes on: with no batch, the eval
        # callbacks get the logs dict its training epoch last filled, a shared default.)
        raise no_samples_error("eval_data", evaluator, world.size)
    cbks = config_callbacks(callbacks, model, {"epochs": epochs, "steps": shape.steps,
                                               "metrics": state.metrics_names()},
                            log_freq, verbose, save_freq, save_dir, training=True)
    history: dict[str, list[float]] = defaultdict(list)
    state.stop_training = stop_training
    logs: dict[str, Any] = {}
    cbks.on_train_begin(logs)
    for epoch in range(first_epoch, epochs):
        data.set_epoch(loader, epoch)
        if epoch > first_epoch:  # a resumable loader's length changes after its first epoch
            shape = epoch_shape(state, loader, batch_size, drop_last, work_load_list)
            cbks.update_params(steps=shape.steps)
        cbks.on_epoch_begin(epoch, {})
        start = time.perf_counter()
        logs = train_epoch(state, loader, cbks, log_freq, shape)
        # Measured after the epoch's last collective: the slowest rank's time, on every rank.
        logs["epoch_time"] = time.perf_counter() - start
        logs["samples_per_sec"] = logs["samples"] / max(logs["epoch_time"], 1e-9)
        cbks.on_epoch_end(epoch, logs)
        done = {key: value for key, value in logs.items() if key != "step"}
        if evaluator is not None and ((epoch + 1) % eval_freq == 0 or epoch + 1 == epochs):
            done.update((f"eval_{key}", value) for key, value in
                        eval_loop(state, model.eval_batch, evaluator, cbks, log_freq).items())
        for key, value in done.items():
            history[key].append(value)
        if after_epoch is not None:
            after_epoch(epoch, done)
        if agree_stop(state):
            break
    cbks.on_train_end(logs)
    return dict(history)
