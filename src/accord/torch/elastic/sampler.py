"""``ElasticSampler``: a distributed sampler that survives the job changing size mid-epoch.

It remembers which samples were processed this epoch (``record_batch``/``record_indices``); on
a reset the remaining ones are re-split over the ranks that are left, so no sample is lost or
repeated within the epoch (except the padding that keeps every rank's share equal, as in
torch's DistributedSampler). The shuffle order depends only on ``seed + epoch``.
"""
from __future__ import annotations

import math
import random
from typing import Any, Iterator, Sized

import torch

from accord.torch import gateway


class ElasticSampler(torch.utils.data.Sampler):
    """Horovod's ElasticSampler: ``ElasticSampler(dataset, shuffle=True, seed=0)``.

    Call ``state.commit()`` after ``sampler.record_batch(batch_idx, batch_size)`` so a restored
    state knows what was already processed; call ``set_epoch(epoch)`` at each epoch start.
    """

    def __init__(self, dataset: Sized, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_indices: set[int] = set()
        self.num_replicas = 0
        self.rank = 0
        self.remaining_indices: list[int] = []
        self.num_samples = 0
        self.total_size = 0
        self.indices: list[int] = []
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Start a new epoch: nothing is processed yet, and the shuffle order changes."""
        self.epoch = epoch
        self.processed_indices = set()
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Mark batch ``batch_idx`` of the current iteration as processed, on every rank: each
        rank records the whole job's batch (its own and the other ranks' shares, which it can
        compute), so a rank that dies after a commit takes nothing with it and its samples are
        not trained on twice. (Horovod records only the rank's own share.)"""
        start = batch_idx * batch_size
        padded = self._padded()
        for rank in range(self.num_replicas):
            share = padded[rank:self.total_size:self.num_replicas]
            self.record_indices(share[start:start + batch_size])

    def record_indices(self, indices: Any) -> None:
        """Mark these dataset indices as processed."""
        self.processed_indices.update(int(i) for i in indices)

    def get_indices(self, batch_idx: int, batch_size: int) -> list[int]:
        """The dataset indices of batch ``batch_idx`` in this rank's current iteration."""
        start = batch_idx * batch_size
        return self.indices[start:min(start + batch_size, len(self.indices))]

    def state_dict(self) -> dict[str, Any]:
        """What to save: the epoch and the processed indices."""
        return {"epoch": self.epoch, "processed_indices": set(self.processed_indices)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the epoch and processed indices, and re-split what remains."""
        self.epoch = state_dict["epoch"]
        self.processed_indices = set(state_dict["processed_indices"])
        self.reset()

    def reset(self) -> None:
        """Re-split the unprocessed samples over the current ranks (1 rank before init)."""
        initialized = gateway.is_initialized()
        self.num_replicas = gateway.size() if initialized else 1
        self.rank = gateway.rank() if initialized else 0
        remaining = [i for i in range(len(self.dataset)) if i not in self.processed_indices]
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(remaining)
        self.remaining_indices = remaining
        self.num_samples = int(math.ceil(len(remaining) / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas

    def _padded(self) -> list[int]:
        indices = self.remaining_indices[:]
        if indices:
            while len(indices) < self.total_size:  # pad so every rank gets the same count
                indices += indices[:self.total_size - len(indices)]
        return indices

    def __iter__(self) -> Iterator[int]:
        self.indices = self._padded()[self.rank:self.total_size:self.num_replicas]
        return iter(self.indices)

    def __len__(self) -> int:
        return self.num_samples
