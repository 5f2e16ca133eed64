"""A distributed sampler: each rank reads its own shard, optionally weighted, and can resume.

Without ``work_load_list`` the shards are the ones ``torch.utils.data.DistributedSampler`` makes
(same permutation for the same seed and epoch, same padding, same strided assignment), so a run
moved from DDP to accord reads the same samples. With ``work_load_list`` the permutation is cut
into consecutive shares by MXNet's rule (:func:`accord.data.split.slice_bounds`): exact cover, no
padding, share sizes proportional to the weights.

Resuming: :meth:`DistributedSampler.state_dict` records how far this rank has read in the current
epoch; after :meth:`load_state_dict` the next iteration yields exactly the indices not yet read.

Deliberate differences from torch's sampler (indices and ``len`` are otherwise the same,
``tests/unit/test_sampler_parity.py``): without a process group ``num_replicas``/``rank`` default
to ``(1, 0)`` where torch raises; ``seed`` must be an int and ``set_epoch`` an int >= 0; ``len``
counts what is left after :meth:`load_state_dict` until that iteration starts.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Iterator, Sequence, Sized

import torch
from torch.utils.data import Sampler

from accord.data.split import slice_bounds

__all__ = ["DistributedSampler", "default_world"]

WorldFn = Callable[[], tuple[int, int]]


def default_world() -> tuple[int, int]:
    """``(num_replicas, rank)`` of this process from torch.distributed's default group, else
    ``(1, 0)``. accord's ``init()`` starts that group with the job's ranks (or checks that the
    one the program started matches), so accord jobs and DDP jobs both answer here."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class DistributedSampler(Sampler[int]):
    """Yield this rank's indices of ``dataset`` for the current epoch.

    Args:
        dataset: anything with ``len``.
        num_replicas: the job's size; ``None`` asks ``world`` (default: :func:`default_world`).
        rank: this process's rank; ``None`` asks ``world``.
        shuffle: permute by ``(seed, epoch)`` (identical on every rank), else keep order.
        seed: base seed; must be the same on every rank.
        drop_last: without weights, drop the tail so shards are equal instead of padding them by
            repeating indices from the start (torch's rule). Ignored with ``work_load_list``,
            whose shares always cover the dataset exactly.
        work_load_list: one positive weight per rank; rank i gets about ``w_i / sum(w)`` of the data.
        world: callable returning ``(num_replicas, rank)``, for tests or custom launchers.

    Raises:
        ValueError: bad rank/size, a weight list of the wrong length, or more ranks than samples
            in weighted mode.
    """

    def __init__(
        self,
        dataset: Sized,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        work_load_list: Sequence[float] | None = None,
        world: WorldFn | None = None,
    ) -> None:
        if num_replicas is None or rank is None:
            size, me = (world or default_world)()
            num_replicas = size if num_replicas is None else num_replicas
            rank = me if rank is None else rank
        if not _is_int(num_replicas) or num_replicas < 1:
            raise ValueError(
                f"num_replicas must be an int >= 1; got {num_replicas!r}.\n"
                "HINT: pass the job's world size, or leave it None after accord/torch.distributed init."
            )
        if not _is_int(rank) or not 0 <= rank < num_replicas:
            raise ValueError(
                f"rank must be an int in [0, {num_replicas - 1}]; got {rank!r}.\n"
                "HINT: pass this process's global rank, or leave it None after init."
            )
        if not _is_int(seed):
            raise ValueError(f"seed must be an int; got {seed!r}.\nHINT: use the same int on every rank.")
        self.dataset_len = len(dataset)
        self.num_replicas = num_replicas
        self.rank = rank
        self.shuffle = bool(shuffle)
        self.seed = seed
        self.drop_last = bool(drop_last)
        self.epoch = 0
        # numpy scalars become Python numbers: state_dict() must load with weights_only=True.
        self.work_load_list = None if work_load_list is None else [
            w.item() if hasattr(w, "item") else w for w in work_load_list]
        if self.work_load_list is not None:
            if len(self.work_load_list) != num_replicas:
                raise ValueError(
                    f"work_load_list has {len(self.work_load_list)} weights "
                    f"({self.work_load_list}) but there are {num_replicas} replicas.\n"
                    "HINT: give exactly one weight per rank, in rank order."
                )
            try:
                self._bounds = slice_bounds(self.dataset_len, self.work_load_list)
            except ValueError as exc:
                raise ValueError(
                    f"cannot shard a dataset of {self.dataset_len} samples over {num_replicas} "
                    f"ranks weighted {self.work_load_list}: {exc}"
                ) from None
            begin, end = self._bounds[rank]
            self.num_samples = end - begin
        elif self.drop_last and self.dataset_len % num_replicas:
            # Largest equal shard that needs no padding (torch's formula).
            self.num_samples = math.ceil((self.dataset_len - num_replicas) / num_replicas)
        else:
            self.num_samples = math.ceil(self.dataset_len / num_replicas)
        self.total_size = self.num_samples * num_replicas
        self._position = 0  # indices of the current epoch this rank has handed out
        self._pending_start: int | None = None  # set by load_state_dict, used by the next __iter__

    # --- the shard -----------------------------------------------------------------------------
    def _permutation(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.dataset_len))
        gen = torch.Generator()
        gen.manual_seed(self.seed + self.epoch)
        return torch.randperm(self.dataset_len, generator=gen).tolist()

    def shard(self) -> list[int]:
        """This rank's indices for the current epoch.

        Returns:
            Every index this rank reads in the epoch, in order (the resume point is ignored):
            a strided share of the (shuffled, padded) permutation, or, with a work-load list,
            this rank's consecutive slice of it.
        """
        perm = self._permutation()
        if self.work_load_list is not None:
            begin, end = self._bounds[self.rank]
            return perm[begin:end]
        if self.total_size <= len(perm):
            padded = perm[: self.total_size]
        else:  # pad by cycling through the permutation from its start
            padded = [perm[i % len(perm)] for i in range(self.total_size)]
        return padded[self.rank : self.total_size : self.num_replicas]

    def __iter__(self) -> Iterator[int]:
        indices = self.shard()
        start = self._pending_start or 0
        self._pending_start = None
        self._position = start
        for i in range(start, len(indices)):
            self._position = i + 1
            yield indices[i]

    def __len__(self) -> int:
        return self.num_samples - (self._pending_start or 0)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch (re-seeds the shuffle). A new epoch drops any pending resume point.

        Args:
            epoch: the epoch number, the same on every rank.

        Raises:
            ValueError: ``epoch`` is not an int >= 0.
        """
        if not _is_int(epoch) or epoch < 0:
            raise ValueError(f"epoch must be an int >= 0; got {epoch!r}.\nHINT: pass the loop counter.")
        if epoch != self.epoch:
            self._pending_start = None
            self._position = 0
        self.epoch = epoch

    # --- resuming ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Where this rank stands: epoch and ``start_index`` (indices of this epoch already yielded).

        A DataLoader with worker processes reads ahead of the training loop; when that matters,
        overwrite ``start_index`` with the number of samples this rank actually consumed.

        Returns:
            ``epoch``, ``start_index``, and what the shard depends on (``seed``, ``shuffle``,
            ``drop_last``, ``num_replicas``, ``rank``, ``dataset_len``, ``work_load_list``),
            which :meth:`load_state_dict` checks.
        """
        return {
            "epoch": self.epoch,
            "start_index": self._position,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "num_replicas": self.num_replicas,
            "rank": self.rank,
            "dataset_len": self.dataset_len,
            "work_load_list": self.work_load_list,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the next iteration yields this rank's indices from ``state['start_index']`` on.

        Equal shards advance in lock-step, so every rank may load rank 0's state; weighted shards
        differ per rank, so each rank must load its own.

        Args:
            state: what :meth:`state_dict` returned (on this rank, or rank 0 for equal shards).

        Raises:
            ValueError: the state was made with a different dataset size, world size, seed,
                shuffle, drop_last or weights (its shard would differ), or a bad start index.
        """
        mine = self.state_dict()
        keys = ["dataset_len", "num_replicas", "seed", "shuffle", "drop_last", "work_load_list"]
        if self.work_load_list is not None:
            keys.append("rank")
        differ = {k: (state.get(k), mine[k]) for k in keys if k in state and state[k] != mine[k]}
        if differ:
            detail = ", ".join(f"{k}: saved {a!r} vs now {b!r}" for k, (a, b) in differ.items())
            raise ValueError(
                f"sampler state does not match this sampler ({detail}).\n"
                "HINT: resume with the same dataset, world size, seed and sampler options "
                "(weighted shards: each rank loads its own state)."
            )
        epoch, start = state.get("epoch"), state.get("start_index", 0)
        if not _is_int(epoch) or epoch < 0 or not _is_int(start) or not 0 <= start <= self.num_samples:
            raise ValueError(
                f"bad sampler state: epoch={epoch!r}, start_index={start!r} "
                f"(this rank's shard has {self.num_samples} samples).\n"
                "HINT: pass a dict returned by DistributedSampler.state_dict()."
            )
        self.epoch = epoch
        self._pending_start = start
        self._position = start
