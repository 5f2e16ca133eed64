"""``Model.fit(..., elastic=True)``: fit under ``hvd.elastic.run`` (accordrun --min-np /
--host-discovery-script), so training survives workers that fail and follows hosts that come
and go, as Horovod's Keras elastic callbacks do for ``model.fit``.

The training set is read through an :class:`~accord.torch.elastic.ElasticSampler`; the network,
the optimizer, the sampler and the progress (``epoch``, ``batch``, ``commits``: committed steps
since the start) form a ``TorchState`` (``model.elastic_state``) that is committed after every
step (:class:`ElasticCommit`, the last callback). When the job re-forms, every rank goes back to
the last commit, the new ranks receive it from rank 0 (the lowest surviving rank), the model's
world is refreshed (new size and rank) and fit resumes where the commit left it, mid-epoch.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Sequence

from torch.utils.data import DataLoader, Sampler

from accord.hapi.callbacks import Callback
from accord.hapi.data import as_dataset
from accord.hapi.world import resolve_world

__all__ = ["ElasticCommit", "fit_elastic"]


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


def fit_elastic(model: Any, train_data: Any, epochs: int, batch_size: int, shuffle: bool = True,
                seed: int = 0, callbacks: Sequence[Callback] | None = None,
                **fit_kwargs: Any) -> dict[str, list[float]]:
    """Run ``model.fit`` elastically (see the module docstring); returns the history of the
    epochs trained by this process."""
    import accord.torch as hvd

    dataset = as_dataset(train_data, "train_data")
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=shuffle, seed=seed)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=_Resuming(sampler))
    state = hvd.elastic.TorchState(model.network, model._state.optimizer, sampler=sampler,
                                   epoch=0, batch=0, commits=0)
    model.elastic_state = state
    state.register_reset_callbacks([lambda: setattr(model._state, "world", resolve_world())])
    history: dict[str, list[float]] = defaultdict(list)
    commit = ElasticCommit(state, batch_size)

    @hvd.elastic.run
    def train(state: Any) -> None:
        while state.epoch < epochs:
            logs = model.fit(loader, epochs=1, batch_size=batch_size,
                             callbacks=list(callbacks or []) + [commit], **fit_kwargs)
            for key, values in logs.items():
                history[key].extend(values)
            state.epoch += 1
            state.batch = 0
            sampler.set_epoch(state.epoch)
            state.commit()

    train(state)
    return dict(history)
