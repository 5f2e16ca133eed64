"""``ElasticSampler``: a distributed sampler that survives the job changing size mid-epoch.

It remembers which samples were processed this epoch (``record_batch``/``record_indices``); on
a reset the remaining ones are re-split over the ranks that are left, so no sample is lost or
repeated within the epoch (except the padding that keeps every rank's share equal, as in
torch's DistributedSampler). The order is the epoch's shuffle (``seed + epoch``) less what was
processed, so the splits are Horovod's: at the epoch's start and after any number of batches.

Horovod 0.24+ counts instead of remembering (``processed_num``; ``state_dict()`` holds
``{"epoch", "processed_num"}``). Both are offered: ``processed_num`` is the number of distinct
samples processed this epoch, ``state_dict()`` holds both forms, and ``load_state_dict`` takes
a Horovod state too (its first ``processed_num`` samples of the epoch's order are the processed
ones, as Horovod reads them).
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

    Args:
        dataset: the dataset to sample (only its length is used).
        shuffle: shuffle each epoch, seeded by ``(seed, epoch)``, the same order on every rank.
        seed: the shuffle's base seed; pass the same on every rank.
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
        self._recorded = 0  # samples of this iteration's order that record_batch has marked
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Start a new epoch: nothing is processed yet, and the shuffle order changes.

        Args:
            epoch: the epoch number; the shuffle is seeded by ``(seed, epoch)`` on every rank.
        """
        self.epoch = epoch
        self.processed_indices = set()
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Mark the job's next batch of this iteration as processed: ``batch_size`` samples of
        every rank's share (each rank can compute the others'), so a rank that dies after a
        commit takes nothing with it. As in Horovod 0.24+, calls count batches in order and
        ``batch_idx`` is not used: the ranks' shares interleave, so the job's k-th batch is
        the k-th block of ``batch_size * num_replicas`` samples of the iteration's order.

        Args:
            batch_idx: Horovod's argument; not used (see above).
            batch_size: samples per rank in the batch just trained on.
        """
        block = batch_size * self.num_replicas
        self.record_indices(self._padded()[self._recorded:self._recorded + block])
        self._recorded += block

    def record_indices(self, indices: Any) -> None:
        """Mark these dataset indices as processed.

        Args:
            indices: dataset indices (any iterable of ints).
        """
        self.processed_indices.update(int(i) for i in indices)

    def get_indices(self, batch_idx: int, batch_size: int) -> list[int]:
        """The dataset indices of batch ``batch_idx`` in this rank's current iteration.

        Args:
            batch_idx: the batch's number in this iteration, from 0.
            batch_size: samples per batch on this rank.

        Returns:
            Up to ``batch_size`` dataset indices (fewer at the end of the iteration).
        """
        start = batch_idx * batch_size
        return self.indices[start:min(start + batch_size, len(self.indices))]

    @property
    def processed_num(self) -> int:
        """How many samples of this epoch were processed, by the whole job (Horovod 0.24+)."""
        return len(self.processed_indices)

    def state_dict(self) -> dict[str, Any]:
        """What to save for a commit.

        Returns:
            ``{"epoch", "processed_indices", "processed_num"}``: the epoch, a copy of the
            processed indices and their number (Horovod's form).
        """
        return {"epoch": self.epoch, "processed_indices": set(self.processed_indices),
                "processed_num": self.processed_num}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the epoch and processed samples (ours, or Horovod's ``processed_num``), and
        re-split what remains.

        Args:
            state_dict: what :meth:`state_dict` returned (here or in Horovod).
        """
        self.epoch = state_dict["epoch"]
        if "processed_indices" in state_dict:
            self.processed_indices = set(state_dict["processed_indices"])
        else:  # Horovod's count: the first samples of the epoch's order were processed
            self.processed_indices = set(self._epoch_order()[:int(state_dict["processed_num"])])
        self.reset()

    def _epoch_order(self) -> list[int]:
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        return order

    def reset(self) -> None:
        """Re-split the unprocessed samples over the current ranks (1 rank before init)."""
        initialized = gateway.is_initialized()
        self.num_replicas = gateway.size() if initialized else 1
        self.rank = gateway.rank() if initialized else 0
        processed = self.processed_indices
        # the epoch's order, less what was processed: after a prefix of it, Horovod's split
        self.remaining_indices = [i for i in self._epoch_order() if i not in processed]
        self._recorded = 0
        self.num_samples = int(math.ceil(len(self.remaining_indices) / self.num_replicas))
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
