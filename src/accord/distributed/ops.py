"""torch.distributed's reduce ops and options as the engine's: which op, which scale factor, which
root, and what a call cannot use (so that every rank of the group refuses it together)."""
from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.distributed as dist

from accord.comm.dtypes import plan_reduction
from accord.comm.ops import ReduceOp
from accord.errors import with_hint

_TYPES = dist.ReduceOp.RedOpType
_OPS = {
    _TYPES.SUM: ReduceOp.SUM,
    _TYPES.AVG: ReduceOp.AVERAGE,
    _TYPES.PRODUCT: ReduceOp.PRODUCT,
    _TYPES.MIN: ReduceOp.MIN,
    _TYPES.MAX: ReduceOp.MAX,
    _TYPES.BAND: ReduceOp.BAND,
    _TYPES.BOR: ReduceOp.BOR,
    _TYPES.BXOR: ReduceOp.BXOR,
}

_PLAIN = {kind: (engine_op, 1.0, "") for kind, engine_op in _OPS.items()}  # the answers without a factor
_REFUSED: dict[tuple[torch.dtype, ReduceOp], str] = {}  # refused()'s answer per dtype and op


def reduction(op: Any) -> tuple[ReduceOp, float, str]:
    """``(engine op, prescale factor, problem)`` for a torch reduce op (a ``ReduceOp`` or its
    ``RedOpType``); ``problem`` is "" when the op can run.

    PREMUL_SUM (``dist._make_nccl_premul_sum(factor)``) is a SUM of the inputs scaled by a number
    first; torch makes its factor readable from Python from 2.5 on, and a tensor factor is not
    supported.
    """
    kind = getattr(op, "op", op)
    plain = _PLAIN.get(kind)
    if plain is not None:
        return plain
    if kind == _TYPES.PREMUL_SUM:
        try:
            factor = op.factor
        except (AttributeError, RuntimeError):
            factor = None
        if isinstance(factor, torch.Tensor) and factor.numel() == 1:
            factor = factor.item()
        if isinstance(factor, (int, float)):
            return ReduceOp.SUM, float(factor), ""
        return ReduceOp.SUM, 1.0, with_hint(
            "PREMUL_SUM with a factor this torch does not let accord read",
            "multiply the tensor by the factor and use ReduceOp.SUM (torch >= 2.5 exposes scalar factors)")
    return ReduceOp.SUM, 1.0, with_hint(f"reduce op {op!r} is not known to the accord backend",
                                        "use SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR or PREMUL_SUM")


def refused(tensors: Sequence[torch.Tensor], op: ReduceOp) -> str:
    """Why ``op`` cannot reduce these tensors' dtype ("" when it can): the same answer on every
    rank that passes the same dtype, so all of them fail the call together."""
    for t in tensors:
        key = (t.dtype, op)
        answer = _REFUSED.get(key)
        if answer is None:
            try:
                plan_reduction(t.dtype, op, lambda dtype, lib_op: True)
                answer = ""
            except (ValueError, RuntimeError) as exc:
                answer = str(exc)
            _REFUSED[key] = answer  # the same for every call: dtype and op decide it
        if answer:
            return answer
    return ""



def group_rank_to_global(members: Sequence[int], rank: int, what: str) -> tuple[int, str]:
    """The global rank of member ``rank`` of a group, and a problem when there is none."""
    if 0 <= rank < len(members):
        return members[rank], ""
    return members[0], with_hint(f"{what} {rank} is not a rank of this group of {len(members)}",
                                 f"pass a rank in [0, {len(members)})")
