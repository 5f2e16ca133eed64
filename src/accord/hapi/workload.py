"""The steps of one epoch when training shares are weighted (``fit(work_load_list=...)``).

Rank ``r`` reads a share of ``n_r`` samples (MXNet's split rule, the one
:class:`accord.data.DistributedSampler` uses) in batches of ``batch_size`` rows, so ranks run
different numbers of steps. Step ``k`` is one optimization over the *global batch*: the union of
the ranks' ``k``-th batches (ranks out of data add nothing). Every rank computes the same plan
from the dataset size alone, without communication, and knows the global batch's rows at every
step: scaling its mean loss by ``rows / global_rows`` makes the sum of the ranks' gradients the
mean gradient over the global batch, which is what one process training on it computes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from accord.data.split import slice_bounds

__all__ = ["StepPlan", "batch_rows", "weighted_plan"]


def batch_rows(samples: int, batch_size: int, drop_last: bool) -> tuple[int, ...]:
    """Rows of each batch a DataLoader makes from ``samples`` samples (``drop_last``: no short tail)."""
    full, rest = divmod(samples, batch_size)
    return (batch_size,) * full + ((rest,) if rest and not drop_last else ())


@dataclass(frozen=True)
class StepPlan:
    """``rows[r][k]``: the rows of rank ``r``'s ``k``-th batch (a rank's tuple ends with its data)."""

    rows: tuple[tuple[int, ...], ...]

    @property
    def steps(self) -> tuple[int, ...]:
        """Steps each rank runs."""
        return tuple(len(r) for r in self.rows)

    @property
    def max_steps(self) -> int:
        """Steps of the epoch: the global batches (the longest rank's steps)."""
        return max(self.steps, default=0)

    @property
    def min_steps(self) -> int:
        """Steps every rank runs (inside them, collectives line up on every rank)."""
        return min(self.steps, default=0)

    @property
    def uneven(self) -> bool:
        """True when some rank runs out of data before the others."""
        return self.min_steps != self.max_steps

    @property
    def root(self) -> int:
        """The lowest rank that runs every step (its state is the epoch's result)."""
        return self.steps.index(self.max_steps)

    def global_rows(self, step: int) -> int:
        """Rows of the global batch of ``step``: every rank's ``step``-th batch together."""
        return sum(r[step] for r in self.rows if step < len(r))

    def share(self, rank: int, step: int) -> float:
        """``rank``'s fraction of the rows of ``step``'s global batch."""
        return self.rows[rank][step] / self.global_rows(step)


def weighted_plan(dataset_len: int, work_load_list: Sequence[float], batch_size: int,
                  drop_last: bool = False) -> StepPlan:
    """The plan of an epoch over ``dataset_len`` samples split by ``work_load_list``.

    Raises:
        ValueError: a bad weight list, or a share that would be empty (see ``slice_bounds``).
    Example:
        >>> weighted_plan(42, [1, 3], 4).rows   # shares of 10 and 32 samples
        ((4, 4, 2), (4, 4, 4, 4, 4, 4, 4, 4))
    """
    bounds = slice_bounds(dataset_len, work_load_list)
    return StepPlan(tuple(batch_rows(end - begin, batch_size, drop_last) for begin, end in bounds))
