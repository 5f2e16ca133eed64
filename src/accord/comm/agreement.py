"""Collective arguments every rank agrees on before any data moves.

A bad argument on one rank must raise on every rank, not leave the others waiting in the
collective. The checks here are pure (they look at one rank's arguments and say what is wrong),
and :func:`check_headers` turns the small integer headers that ranks exchange first into the
same error everywhere: which ranks passed bad arguments, or who sent which dtype and shape.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from accord.comm import dtypes
from accord.errors import InvalidArgumentError, MismatchError, with_hint

# Allgathers one list of ints (same length on every rank); one row per rank comes back.
Exchange = Callable[[list[int]], list[list[int]]]


def shape_hash(shape: Sequence[int]) -> int:
    """A number equal on two ranks when their shapes are (almost surely) equal."""
    value = 0
    for dim in shape:
        value = (value * 1000003 + int(dim) + 1) % (2**61 - 1)
    return value


def header(ok: bool, work: torch.Tensor, *sizes: int) -> list[int]:
    """What a rank announces before a ragged collective: ok flag, dtype, rank, shape hash, sizes."""
    return [1 if ok else 0, dtypes.dtype_code(work.dtype), work.dim(), shape_hash(work.shape[1:]), *sizes]


def output_problem(kind: str, out: Any, dtype: torch.dtype, device: torch.device,
                   shape: Sequence[int] | None, trailing: Sequence[int] | None = None) -> str:
    """What is wrong with a caller-given output ``out`` ("" when nothing is).

    Args:
        kind: the collective's name, for the message.
        out: the caller's output (anything; only a tensor can be right).
        dtype: the dtype the result has.
        device: the device the result is on.
        shape: the result's full shape, or None where only ``trailing`` is known here (a
            ragged allgather's total rows are known after the ranks exchange them).
        trailing: the result's dims after dim 0 (when ``shape`` is None).
    """
    if not isinstance(out, torch.Tensor):
        return with_hint(f"{kind}: output must be a torch.Tensor, got {type(out).__name__}",
                         "pass a tensor, or output=None for a new result")
    if out.layout is not torch.strided:
        return with_hint(f"{kind}: output must be a dense tensor, got layout {out.layout}",
                         "pass a dense tensor (torch.empty(...))")
    wanted = "" if shape is None else f" {list(shape)}"
    if out.dtype != dtype:
        return with_hint(f"{kind}: output has dtype {out.dtype}, the result is {dtype}{wanted}",
                         f"pass an output of dtype {dtype} (torch.empty(..., dtype={dtype}))")
    if out.device != device:
        return with_hint(f"{kind}: output is on {out.device}, the result is on {device}",
                         f"pass an output on {device}, the input's device")
    if shape is not None and tuple(out.shape) != tuple(shape):
        return with_hint(f"{kind}: output has shape {list(out.shape)}, the result has shape {list(shape)}",
                         f"pass an output of shape {list(shape)}")
    if shape is None and (out.dim() != len(trailing) + 1 or tuple(out.shape[1:]) != tuple(trailing)):
        return with_hint(f"{kind}: output has shape {list(out.shape)}, the result has shape "
                         f"[total rows, {', '.join(str(d) for d in trailing)}]".replace(", ]", "]"),
                         "pass an output whose dims after dim 0 are the input's")
    if not out.is_contiguous():
        return with_hint(f"{kind}: output is not contiguous (shape {list(out.shape)}, strides "
                         f"{list(out.stride())})", "pass a contiguous output (torch.empty(...))")
    return ""


def check_root(root: int, size: int, ranks: Sequence[int]) -> None:
    """Raise ValueError unless ``root`` is a rank of a communicator of ``size`` ranks."""
    if not isinstance(root, int) or not 0 <= root < size:
        raise ValueError(with_hint(
            f"root {root!r} is not a rank of this communicator (size {size}, global ranks {list(ranks)})",
            f"pass a communicator rank between 0 and {size - 1}"))


def scatter_problem(chunks: Any, size: int) -> str:
    """What is wrong with root's scatter ``chunks`` ("" when nothing is)."""
    if not isinstance(chunks, (list, tuple)) or len(chunks) != size:
        return f"expected a list of {size} tensors, got {type(chunks).__name__}" + (
            f" of length {len(chunks)}" if isinstance(chunks, (list, tuple)) else "")
    if not all(isinstance(c, torch.Tensor) and c.dim() >= 1 for c in chunks):
        return "every chunk must be a tensor with at least one dimension"
    kinds = {(c.dtype, tuple(c.shape[1:])) for c in chunks}
    if len(kinds) != 1:
        return "chunks differ in dtype or shape after dim 0: " + ", ".join(
            f"{c.dtype} {list(c.shape)}" for c in chunks)
    if dtypes.dtype_code(chunks[0].dtype) < 0:
        return f"dtype {chunks[0].dtype} is not supported"
    return ""


def alltoall_splits(work: torch.Tensor, splits: Any, size: int) -> tuple[str, list[int]]:
    """(problem, rows to send to each rank); the problem is "" when ``splits`` are valid.

    ``splits`` None means an even split of dim 0. On a problem the sizes are all zero, so the
    header exchange still has its agreed length.
    """
    if work.dim() == 0:
        return "the tensor is a scalar; alltoall needs at least one dimension", [0] * size
    rows = work.shape[0]
    if splits is None:
        if rows % size:
            return (f"dim 0 ({rows}) is not divisible by the {size} ranks and no splits "
                    "were given", [0] * size)
        return "", [rows // size] * size
    values = splits.tolist() if isinstance(splits, torch.Tensor) else list(splits)
    if len(values) != size or any(int(v) < 0 for v in values) or sum(int(v) for v in values) != rows:
        return (f"splits {values} must have {size} non-negative entries summing to dim 0 "
                f"({rows})", [0] * size)
    return "", [int(v) for v in values]


def check_headers(kind: str, work: torch.Tensor, headers: list[list[int]], problem: str,
                  ranks: Sequence[int], rank: int, exchange: Exchange) -> None:
    """Raise the same error on every rank when any rank's :func:`header` disagrees.

    Args:
        kind: the collective's name, for the message.
        work: this rank's tensor.
        headers: every rank's header, in communicator order.
        problem: this rank's own argument problem ("" when none).
        ranks: the communicator's global ranks; ``rank`` is this rank's index in them.
        exchange: allgathers ints; used on the rare mismatch path to fetch full shapes.

    Raises:
        InvalidArgumentError (a ValueError and, as Horovod's error, a RuntimeError): some rank
            flagged its arguments as invalid.
        MismatchError: ranks differ in dtype, number of dimensions or shape after dim 0.
    """
    bad = [ranks[i] for i, h in enumerate(headers) if not h[0]]
    if bad:
        mine = f"; here (rank {ranks[rank]}): {problem}" if problem else ""
        raise InvalidArgumentError(with_hint(f"{kind}: invalid arguments on ranks {bad}{mine}",
                                             f"fix the {kind} arguments on those ranks"))
    if len({tuple(h[1:4]) for h in headers}) == 1:
        return
    # Rare path: fetch every rank's full shape to say exactly who sent what.
    ndim = max(h[2] for h in headers)
    shape = list(work.shape) + [-1] * (ndim - work.dim())
    shapes = exchange([dtypes.dtype_code(work.dtype), *shape])
    seen = ", ".join(
        f"rank {ranks[i]} sent {_dtype_name(s[0])} {[d for d in s[1:] if d >= 0]}" for i, s in enumerate(shapes))
    raise MismatchError(with_hint(
        f"Mismatched {kind} tensors over ranks {list(ranks)}: {seen}",
        "every rank must pass the same dtype and the same shape after the first dimension"))


def normalize_ranks(ranks: Sequence[int], world_size: int) -> tuple[int, ...]:
    """Check a member list and return it in communicator order (ascending global rank).

    Raises:
        ValueError: empty, duplicated, or outside ``0 .. world_size-1``.
    """
    values = [int(r) for r in ranks]
    bad = [r for r in values if not 0 <= r < world_size]
    if not values or bad or len(set(values)) != len(values):
        raise ValueError(with_hint(
            f"invalid communicator ranks {values} for a job of {world_size} ranks"
            + (f" (out of range: {bad})" if bad else ""),
            f"pass distinct global ranks between 0 and {world_size - 1}"))
    return tuple(sorted(values))


def _dtype_name(code: int) -> str:
    return str(dtypes.dtype_from_code(code)).replace("torch.", "") if 0 <= code < len(dtypes.DTYPES) else "?"
