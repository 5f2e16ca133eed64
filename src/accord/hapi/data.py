"""Turn what a user passes to ``fit``/``evaluate``/``predict`` into per-rank data loaders.

- Training reads :class:`accord.data.DistributedSampler` shards (padded to equal length, so every
  rank runs the same number of steps, which the gradient allreduce needs). With one process the
  same sampler is used with one replica, so a 1-rank and an N-rank run see the same global
  batches for the same seed and epoch. With ``work_load_list`` the shards are weighted and
  unpadded instead (ranks then run different numbers of steps: see :mod:`accord.hapi.workload`).
- Evaluation and prediction read contiguous, unpadded shards (:class:`ContiguousShard`): every
  sample is counted exactly once, and gathering predictions in rank order restores dataset order.
"""
from __future__ import annotations

from typing import Any, Iterator, Sequence, Sized

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, IterableDataset, Sampler, TensorDataset

from accord.data.samplers import DistributedSampler
from accord.errors import with_hint

__all__ = ["ContiguousShard", "as_dataset", "eval_loader", "set_epoch", "train_loader"]


def _is_array(value: Any) -> bool:
    return isinstance(value, (np.ndarray, torch.Tensor))


def _tensor(value: Any) -> torch.Tensor:
    return value if isinstance(value, torch.Tensor) else torch.as_tensor(np.asarray(value))


def as_dataset(data: Any, what: str) -> Dataset:
    """A Dataset for ``data``: a Dataset (anything with ``__len__`` and ``__getitem__``), an
    ``(X, y)`` pair of arrays, or a single array of inputs (for ``predict``).

    Raises:
        TypeError: ``data`` is none of these. ValueError: ``X`` and ``y`` differ in length.
    """
    if _is_array(data):
        return TensorDataset(_tensor(data))
    if isinstance(data, (tuple, list)) and 1 <= len(data) <= 8 and all(_is_array(a) for a in data):
        tensors = [_tensor(a) for a in data]
        lengths = [t.shape[0] if t.dim() else None for t in tensors]
        if None in lengths or len(set(lengths)) != 1:
            raise ValueError(with_hint(
                f"{what}: the arrays have lengths {lengths}; each must have one row per sample",
                "pass (X, y) with X.shape[0] == y.shape[0]"))
        return TensorDataset(*tensors)
    if isinstance(data, IterableDataset):
        raise ValueError(with_hint(
            f"{what} is an iterable dataset ({type(data).__name__}): accord shards datasets by index, "
            "which an iterable dataset cannot be read by",
            "pass a map-style Dataset (__len__ and __getitem__) or (X, y) arrays, or a DataLoader over "
            "the iterable dataset that yields this rank's share and has a length (equal on every rank)"))
    if isinstance(data, Dataset) or (hasattr(data, "__len__") and hasattr(data, "__getitem__")):
        return data
    raise TypeError(with_hint(
        f"{what} must be a torch Dataset, an (X, y) pair of arrays or a DataLoader; got {type(data).__name__}",
        "wrap your data in torch.utils.data.TensorDataset or pass numpy arrays as (X, y)"))


def _no_length(what: str, kind: str) -> str:
    return with_hint(
        f"{what} ({kind}) has no length: fit, evaluate and predict count an epoch's batches to "
        "keep every rank running the same steps (and to shard the data), so an iterable dataset "
        "without __len__ cannot be used",
        "pass a map-style Dataset (__len__ and __getitem__) or (X, y) arrays, or give the iterable "
        "dataset a __len__ (its batches per rank must then be equal on every rank)")


def _sized(loader: DataLoader, what: str) -> DataLoader:
    """``loader`` if it knows its number of batches, else a ValueError naming ``what``."""
    try:
        len(loader)
    except TypeError:
        raise ValueError(_no_length(what, f"a DataLoader over {type(loader.dataset).__name__}")) from None
    return loader


class ContiguousShard(Sampler[int]):
    """Indices ``[rank * n // size, (rank + 1) * n // size)``: disjoint, covering, unpadded."""

    def __init__(self, dataset: Sized, num_replicas: int, rank: int) -> None:
        n = len(dataset)
        self.begin = rank * n // num_replicas
        self.end = (rank + 1) * n // num_replicas

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.begin, self.end))

    def __len__(self) -> int:
        return self.end - self.begin


def _loader(dataset: Dataset, sampler: Sampler[int], batch_size: int, drop_last: bool,
            num_workers: int) -> DataLoader:
    if batch_size < 1:
        raise ValueError(with_hint(f"batch_size must be >= 1, got {batch_size}", "pass the batch size per rank"))
    if isinstance(dataset, TensorDataset) and num_workers == 0:
        # In-memory tensors: index a whole batch at once instead of collating one row at a time.
        batches = BatchSampler(sampler, batch_size, drop_last)
        return DataLoader(dataset, sampler=batches, batch_size=None)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, drop_last=drop_last,
                      num_workers=num_workers)


def train_loader(data: Any, batch_size: int, size: int, rank: int, shuffle: bool, seed: int,
                 drop_last: bool = False, num_workers: int = 0,
                 work_load_list: Sequence[float] | None = None) -> DataLoader:
    """This rank's training loader (a DataLoader given by the user is returned unchanged).

    Raises:
        ValueError: ``work_load_list`` with a DataLoader, or one that does not fit the job.
    """
    if isinstance(data, DataLoader):
        if work_load_list is not None:
            raise ValueError(with_hint(
                f"work_load_list={list(work_load_list)} cannot weight a DataLoader: fit uses a "
                "DataLoader as it is, so its sampler decides what each rank reads",
                "pass the Dataset (or (X, y) arrays) and let fit shard it, or give the DataLoader "
                "an accord.data.DistributedSampler(dataset, work_load_list=...)"))
        return _sized(data, "train_data")
    dataset = as_dataset(data, "train_data")
    sampler = DistributedSampler(dataset, num_replicas=size, rank=rank, shuffle=shuffle, seed=seed,
                                 work_load_list=work_load_list)
    return _loader(dataset, sampler, batch_size, drop_last, num_workers)


def eval_loader(data: Any, batch_size: int, size: int, rank: int, what: str,
                num_workers: int = 0) -> DataLoader:
    """This rank's unpadded evaluation/prediction loader (a user's DataLoader is used as is)."""
    if isinstance(data, DataLoader):
        return _sized(data, what)
    dataset = as_dataset(data, what)
    return _loader(dataset, ContiguousShard(dataset, size, rank), batch_size, False, num_workers)


def set_epoch(loader: DataLoader, epoch: int) -> None:
    """Re-seed the loader's shuffle for ``epoch`` when its sampler supports it."""
    sampler = loader.sampler
    candidates = (sampler, getattr(sampler, "sampler", None),
                  getattr(getattr(loader, "batch_sampler", None), "sampler", None))
    for candidate in candidates:
        if hasattr(candidate, "set_epoch"):
            candidate.set_epoch(epoch)
            return
