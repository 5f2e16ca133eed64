"""Split a batch into shares proportional to a work-load list (MXNet's ``work_load_list``).

MXNet's rule (``executor_manager._split_input_slice``, MXNet 1.9): share ``i`` gets
``round(w_i * B / sum(w))`` rows, Python's ``round`` (half to even); if those shares sum to less
than ``B`` the last share takes the rest; shares are laid out one after another and clipped at
``B``, so the last one always ends at ``B``. A share that comes out empty is an error ("too many
slices"). This module reproduces that rule exactly, so a script ported from MXNet gets the same
per-device batch sizes.

No torch import here: the functions only use ``len`` and slicing, so they work on tensors, numpy
arrays, lists and tuples alike.
"""
from __future__ import annotations

import math
import numbers
from typing import Any, Mapping, Sequence

__all__ = ["slice_bounds", "split_batch"]


def _is_weight(w: Any) -> bool:
    # numbers.Real admits numpy scalars (np.array([1, 3]) holds np.int64, not int); bool is no weight.
    return (isinstance(w, numbers.Real) and not isinstance(w, bool)
            and math.isfinite(w) and w > 0)


def _check_work_load(work_load_list: Sequence[float]) -> list[float]:
    weights = list(work_load_list)
    if not weights:
        raise ValueError(
            "work_load_list is empty.\n"
            "HINT: pass one positive weight per worker/device, e.g. [1, 1] or [2, 1]."
        )
    bad = [w for w in weights if not _is_weight(w)]
    if bad:
        raise ValueError(
            f"work_load_list must hold finite positive numbers; got {weights} (bad: {bad}).\n"
            "HINT: use positive relative speeds, e.g. [3, 1] gives the first worker 3/4 of the batch."
        )
    # Python floats: same shares as MXNet's int/float arithmetic (exact for ints below 2**53),
    # and round() of a numpy float32 would give a float where a row count is needed.
    return [float(w) for w in weights]


def slice_bounds(batch_size: int, work_load_list: Sequence[float]) -> list[tuple[int, int]]:
    """Return ``(begin, end)`` row bounds of each share of a batch of ``batch_size`` rows.

    Args:
        batch_size: number of rows (samples) in the batch, >= 0.
        work_load_list: one positive weight per share.

    Returns:
        One ``(begin, end)`` per weight; consecutive, non-empty, covering ``[0, batch_size)``.

    Raises:
        ValueError: a bad ``batch_size`` or weight list, or more shares than rows so that one
            would be empty.

    Example:
        >>> slice_bounds(10, [1, 1, 1])
        [(0, 3), (3, 6), (6, 10)]
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 0:
        raise ValueError(
            f"batch_size must be a non-negative int; got {batch_size!r}.\n"
            "HINT: pass len(batch) (the size of dimension 0)."
        )
    weights = _check_work_load(work_load_list)
    total = sum(weights)
    # Same expression and operand order as MXNet, so float rounding gives identical shares.
    counts = [round(w * batch_size / total) for w in weights]
    assigned = sum(counts)
    if assigned < batch_size:
        counts[-1] += batch_size - assigned
    bounds: list[tuple[int, int]] = []
    end = 0
    for count in counts:
        begin = min(end, batch_size)
        end = min(begin + count, batch_size)
        bounds.append((begin, end))
    empty = [i for i, (b, e) in enumerate(bounds) if b >= e]
    if empty:
        sizes = [e - b for b, e in bounds]
        raise ValueError(
            f"Too many slices: splitting a batch of {batch_size} by work_load_list {list(work_load_list)} "
            f"leaves share(s) {empty} empty (share sizes {sizes}).\n"
            "HINT: use a batch at least as large as the number of shares, with weights that give "
            "every share at least one row, or use fewer workers/devices."
        )
    return bounds


def _batch_len(batch: Any) -> int:
    try:
        return len(batch)
    except TypeError:
        shape = getattr(batch, "shape", None)
        raise ValueError(
            f"cannot split a batch of type {type(batch).__name__} with shape {shape}: it has no "
            "first dimension.\n"
            "HINT: pass a tensor, numpy array, list or tuple whose first dimension is the batch."
        ) from None


def split_batch(batch: Any, work_load_list: Sequence[float]) -> list[Any]:
    """Split ``batch`` along its first dimension into shares proportional to ``work_load_list``.

    Accepts a torch tensor or numpy array (the shares are views, no copy), a list or tuple of
    samples (shares of the same type), or a mapping of such (every value split the same way,
    e.g. ``{"data": x, "label": y}``; the values must agree on the batch size).

    Args:
        batch: a tensor, numpy array, list, tuple, or a mapping of those.
        work_load_list: one positive weight per share (MXNet's rule, see :func:`slice_bounds`).

    Returns:
        One share per weight, in order: the same type as ``batch`` (dicts for a mapping).

    Raises:
        ValueError: bad weights, empty shares, a batch with no first dimension, or mapping
            values of different batch sizes.

    Example:
        >>> split_batch(list(range(6)), [2, 1])
        [[0, 1, 2, 3], [4, 5]]
    """
    if isinstance(batch, Mapping):
        sizes = {key: _batch_len(value) for key, value in batch.items()}
        if len(set(sizes.values())) > 1:
            raise ValueError(
                f"the values of the batch mapping have different first dimensions: {sizes}.\n"
                "HINT: every entry (data, label, ...) must hold the same number of samples."
            )
        size = next(iter(sizes.values()), 0)
        bounds = slice_bounds(size, work_load_list)
        return [{key: value[b:e] for key, value in batch.items()} for b, e in bounds]
    bounds = slice_bounds(_batch_len(batch), work_load_list)
    return [batch[b:e] for b, e in bounds]
