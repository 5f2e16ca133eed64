"""Local checks of a request before it is queued: membership, root, scatter splits, op and dtype.

They raise :class:`~accord.errors.InvalidArgumentError` (a ValueError and, as in Horovod, a
RuntimeError) on the submitting rank only (Horovod raises these locally too); problems that need
the other ranks' view (shape or dtype mismatches) are found by the negotiation. Alltoall splits
are per-rank data and are not checked here: the communicator checks them when the ranks
exchange them, and bad splits on one rank then raise on every rank
(:func:`accord.comm.agreement.alltoall_splits`) instead of leaving the others waiting.
"""
from __future__ import annotations

from typing import Sequence

import torch

from accord.comm.ops import ReduceOp
from accord.engine.request import REDUCING_OPS, Op, Request
from accord.engine.sets import ProcessSetRegistry
from accord.errors import InvalidArgumentError, with_hint


def validate(r: Request, sets: ProcessSetRegistry, rank: int) -> None:
    """Raise InvalidArgumentError if ``r`` cannot run on ``rank`` (see the module docstring)."""
    try:
        group = sets.members(r.process_set_id)
    except KeyError:
        raise InvalidArgumentError(with_hint(f"{r.op.value} {r.name!r}: unknown process set {r.process_set_id}",
                                   "register it with add_process_set on every rank first")) from None
    if rank not in group:
        raise InvalidArgumentError(with_hint(
            f"{r.op.value} {r.name!r}: rank {rank} is not in process set {r.process_set_id} {list(group)}",
            "submit collectives of a process set only on its member ranks"))
    if r.op is not Op.BARRIER:
        if r.tensor is None:
            raise InvalidArgumentError(f"{r.op.value} {r.name!r} needs a tensor")
        sets.communicator(r.process_set_id, r.signature.device)  # raises if none
    if r.op in REDUCING_OPS:
        if r.reduce_op == ReduceOp.ADASUM:
            raise InvalidArgumentError(with_hint(f"{r.op.value} {r.name!r}: Adasum is not supported",
                                       "use Sum or Average"))
        if r.dtype == torch.bool and (r.prescale_factor != 1 or r.postscale_factor != 1):
            raise InvalidArgumentError(f"{r.op.value} {r.name!r}: bool tensors cannot be scaled")
    if r.wire_dtype is not None and not (
            r.op is Op.ALLREDUCE and r.owned and r.tensor is not None and r.tensor.is_floating_point()
            and r.wire_dtype.is_floating_point):
        raise InvalidArgumentError(with_hint(
            f"{r.op.value} {r.name!r}: a {None if r.tensor is None else r.tensor.dtype} tensor cannot be "
            f"cast to {r.wire_dtype} by the engine",
            "only in-place allreduces of floating tensors travel in another floating dtype"))
    if r.splits is not None and r.op is Op.SCATTER and r.root_rank == rank:
        if len(r.splits) != len(group) or sum(r.splits) != r.tensor.shape[0] or min(r.splits) < 0:
            raise InvalidArgumentError(with_hint(
                f"{r.op.value} {r.name!r}: splits {list(r.splits)} must have {len(group)} "
                f"non-negative entries summing to dim 0 ({r.tensor.shape[0]})",
                "pass one row count per rank of the process set"))


def root_outside_message(name: str, op: str, root: int, set_id: int, members: Sequence[int]) -> str:
    """The error of a rooted op whose root is not a member of its process set. The negotiation
    raises it on every member (InvalidArgumentError): the root is per-rank data, and refused on
    one rank alone, the others would wait for that rank forever."""
    return with_hint(f"{op} {name!r}: root rank {root} is not in process set {set_id} {list(members)}",
                     "pass a global rank that belongs to the process set")


def validate_group(requests: Sequence[Request], sets: ProcessSetRegistry, rank: int) -> None:
    """:func:`validate` each request of one (grouped) call; also refuse a name used twice in it."""
    seen: set[str] = set()
    for r in requests:
        validate(r, sets, rank)
        if r.name in seen:
            raise InvalidArgumentError(with_hint(f"the name {r.name!r} appears twice in one group on rank {rank}",
                                       "give every tensor of a grouped call its own name"))
        seen.add(r.name)
