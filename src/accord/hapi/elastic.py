"""``Model.fit(..., elastic=True)``: fit under ``hvd.elastic.run`` (accordrun --min-np /
--host-discovery-script), so training survives workers that fail and follows hosts that come
and go, as Horovod's Keras elastic callbacks do for ``model.fit``.

The training set is read through an :class:`~accord.torch.elastic.ElasticSampler`; the network,
the optimizer, the sampler, the progress (``epoch``, ``batch``, ``commits``: committed steps since
the start), the stop a callback asked for (``stop_training``) and under AMP O2 the float32
master weights (``masters``, an ``nn.Module``: committed, restored and synced with the half
network they belong to) form a ``TorchState``
(``model.elastic_state``) that is committed after every step (:class:`ElasticCommit`, the last
callback). When the job re-forms, every rank goes back to
the last commit, the new ranks receive it from rank 0 (the lowest surviving rank), the model's
world is refreshed (new size and rank) and fit resumes where the commit left it, mid-epoch.

A stop asked just before a re-formation (EarlyStopping at an epoch's end, whose commit is
interrupted) is not lost: it is committed, the ranks agree on it when they resume (any rank's
stop counts, as in ``fit``), and training ends as it would have without the re-formation: at
once when it was asked at an epoch's end, else at the next log step.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Sequence

import torch
from torch.utils.data import DataLoader, Sampler

from accord.hapi.callbacks import Callback
from accord.hapi.data import as_dataset
from accord.hapi.training import fit as run_fit
from accord.hapi.world import resolve_world

__all__ = ["ElasticCommit", "agreed_stop", "elastic_state", "fit_elastic"]


class ElasticCommit(Callback):
    """Record each training batch in the sampler and commit the elastic state (may raise
    ``HostsUpdatedInterrupt``, which ``hvd.elastic.run`` handles)."""

    def __init__(self, state: Any, batch_size: int) -> None:
        super().__init__()
        self.state = state
        self.batch_size = batch_size

    def on_train_batch_end(self, step: int, logs: dict[str, Any] | None = None) -> None:
        self.state.sampler.record_batch(step, self.batch_size)
        self.state.batch = step + 1
        self.state.commits += 1
        # The earlier callbacks may just have asked to stop: the commit below may be the last
        # before a re-formation, which would otherwise forget it.
        self.state.stop_training = bool(self.model.stop_training)
        self.state.commit()


class _Resuming(Sampler):
    """The elastic sampler without ``set_epoch``: fit re-seeds its loader's sampler at each of
    its epochs, which would forget what this epoch already trained on."""

    def __init__(self, sampler: Any) -> None:
        self._elastic = sampler

    def __iter__(self):
        return iter(self._elastic)

    def __len__(self) -> int:
        return len(self._elastic)


def elastic_state(model: Any, sampler: Any) -> Any:
    """The ``TorchState`` of ``model``'s training over ``sampler``, at epoch 0, batch 0."""
    import accord.torch as hvd

    masters = model._state.masters
    objects = {} if masters is None else {"masters": masters}
    return hvd.elastic.TorchState(model.network, model._state.optimizer, sampler=sampler,
                                  epoch=0, batch=0, commits=0, stop_training=False, **objects)


def agreed_stop(model: Any, state: Any) -> bool:
    """Whether any rank's last commit holds a stop (one allreduce, on every rank).

    Needed even though a synced state is rank 0's: after a removal only, the ranks keep their
    own commits (no sync), and a stop asked on one rank is agreed only at the next log step.
    """
    flag = torch.tensor([float(bool(state.stop_training))], dtype=torch.float64)
    total = model._state.world.allreduce_sum(flag, "accord.hapi.elastic.stop")
    return bool(total[0] > 0)


def fit_elastic(model: Any, train_data: Any, eval_data: Any, batch_size: int, epochs: int,
                eval_freq: int, log_freq: int, save_dir: str | None, save_freq: int, verbose: int,
                drop_last: bool, shuffle: bool, num_workers: int,
                callbacks: Sequence[Callback] | None, seed: int) -> dict[str, list[float]]:
    """Run ``model.fit`` elastically (see the module docstring); returns the history of the
    epochs trained by this process.

    One training loop runs every epoch, as without ``elastic``: callbacks see the real epoch
    numbers (checkpoint names, ``eval_freq``) and a stop (EarlyStopping) ends training. After a
    re-formation the loop starts again from the committed epoch, with ``on_train_begin``, as
    Horovod's Keras ``fit`` does when ``hvd.elastic.run`` calls it again.
    """
    import accord.torch as hvd

    dataset = as_dataset(train_data, "train_data")
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=shuffle, seed=seed)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=_Resuming(sampler),
                        drop_last=drop_last, num_workers=num_workers)
    state = elastic_state(model, sampler)
    model.elastic_state = state
    state.register_reset_callbacks([lambda: setattr(model._state, "world", resolve_world())])
    history: dict[str, list[float]] = defaultdict(list)
    commit = ElasticCommit(state, batch_size)

    def end_epoch(epoch: int, logs: dict[str, Any]) -> None:
        for key, value in logs.items():
            history[key].append(value)
        state.epoch = epoch + 1
        state.batch = 0
        state.stop_training = bool(model.stop_training)  # EarlyStopping asks at the epoch's end
        sampler.set_epoch(state.epoch)
        state.commit()

    @hvd.elastic.run
    def train(state: Any) -> None:
        stop = agreed_stop(model, state)
        # batch 0 with a stop: it was asked at an epoch's end, where fit stops at once (as
        # Paddle's fit, which has no elastic mode, breaks after the epoch whose evaluation
        # asked to stop); mid-epoch, fit's loop stops at its next log step, as without a reset.
        first = epochs if stop and state.batch == 0 else state.epoch
        # Always run the loop, even with no epoch left (epochs=0, a stop, or a re-formation at
        # the last epoch's commit): the callbacks see train begin and end, as in fit without
        # elastic and in Paddle's fit, which calls on_begin/on_end('train') around its epoch
        # loop whatever the epochs (with epochs=0 its on_end then fails on an unset ``logs``).
        run_fit(model._state, model, loader, eval_data, batch_size, epochs, eval_freq, log_freq,
                save_dir, save_freq, verbose, drop_last, shuffle, num_workers,
                list(callbacks or []) + [commit], seed, None, first_epoch=first,
                after_epoch=end_epoch, stop_training=stop)

    train(state)
    return dict(history)
