"""Checks of a request before it is queued: membership, scatter splits, op and dtype.

Two kinds of refusal, both :class:`~accord.errors.InvalidArgumentError` (a ValueError and, as in
Horovod, a RuntimeError):

- What no peer waits for is raised here, on the submitting rank: a process set this rank does
  not know or is not a member of (no peer of the set expects it to submit), no tensor, no
  communicator for the device, a cast only the engine's own requests ask for.
- What may differ between ranks (per-call arguments and per-rank data: the reduce op, scale
  factors of a bool tensor, root's scatter splits, and what a frontend refuses in a tensor) is
  not raised here: refused on one rank alone, its peers, which submitted a fine request under
  the same name, would wait for that rank forever. The request is marked instead
  (:meth:`~accord.engine.request.Request.refuse`) and queued; the negotiation fails the name on
  every member once all have submitted it (:func:`refused_message`), as it does for a root
  outside the set (:func:`root_outside_message`). Alltoall splits are checked where the ranks
  exchange them (:func:`accord.comm.agreement.alltoall_splits`), to the same effect.

Problems that need the other ranks' view (shape or dtype mismatches) are found by the
negotiation.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import torch

from accord.comm.ops import ReduceOp
from accord.engine.request import REDUCING_OPS, Op, Request
from accord.engine.sets import ProcessSetRegistry
from accord.errors import InvalidArgumentError, with_hint


def validate(r: Request, sets: ProcessSetRegistry, rank: int) -> None:
    """Raise InvalidArgumentError if ``r`` cannot run on ``rank`` and no peer waits for it, or
    mark ``r`` refused when peers may (see the module docstring)."""
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
    if r.wire_dtype is not None and not (
            r.op is Op.ALLREDUCE and r.owned and r.tensor is not None and r.tensor.is_floating_point()
            and r.wire_dtype.is_floating_point):
        raise InvalidArgumentError(with_hint(
            f"{r.op.value} {r.name!r}: a {None if r.tensor is None else r.tensor.dtype} tensor cannot be "
            f"cast to {r.wire_dtype} by the engine",
            "only in-place allreduces of floating tensors travel in another floating dtype"))
    problem = _problem(r, len(group), rank)
    if problem:
        r.refuse(problem)


def _problem(r: Request, set_size: int, rank: int) -> str:
    """What is wrong with ``r``'s per-call arguments on this rank ("" when nothing is)."""
    if r.op in REDUCING_OPS:
        if r.reduce_op == ReduceOp.ADASUM:
            return with_hint(f"{r.op.value} does not support Adasum", "use Sum or Average")
        if r.dtype == torch.bool and (r.prescale_factor != 1 or r.postscale_factor != 1):
            return with_hint(f"a bool tensor cannot be scaled (prescale {r.prescale_factor}, postscale "
                             f"{r.postscale_factor})", "scale bool tensors by 1, or reduce another dtype")
    # Gather and root's scatter split dim 0 (the communicators take it before any exchange).
    if (r.op is Op.GATHER or (r.op is Op.SCATTER and r.root_rank == rank)) and r.tensor.dim() == 0:
        return with_hint(f"{r.op.value} needs a tensor with at least one dimension, got a scalar",
                         "reshape it, e.g. tensor.reshape(1)")
    if r.splits is not None and r.op is Op.SCATTER and r.root_rank == rank:
        rows = r.tensor.shape[0]
        if len(r.splits) != set_size or sum(r.splits) != rows or min(r.splits, default=0) < 0:
            return with_hint(f"root's splits {list(r.splits)} must have {set_size} non-negative entries "
                             f"summing to dim 0 ({rows})", "pass one row count per rank of the process set")
    return ""


def refused_message(name: str, op: str, problems: Mapping[int, str]) -> str:
    """The error of a name that some members submitted with unusable arguments (global rank ->
    its request's ``problem``). The negotiation raises it on every member
    (InvalidArgumentError) once all have submitted the name; identical problems are listed once."""
    ranks_of: dict[str, list[int]] = {}
    for r in sorted(problems):
        ranks_of.setdefault(problems[r], []).append(r)
    lines, hints = [], []
    for text, ranks in ranks_of.items():
        what, _, hint = text.partition("\nHINT: ")
        who = f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))
        lines.append(f"  {who}: {what}")
        if hint and hint not in hints:
            hints.append(hint)
    return with_hint(f"{op} {name!r}: invalid arguments on ranks {sorted(problems)}:\n" + "\n".join(lines),
                     "; ".join(hints) or f"fix the {op} arguments on those ranks")


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
