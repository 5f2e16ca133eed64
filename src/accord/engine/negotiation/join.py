"""Join (Horovod's ``hvd.join()``): a rank that has run out of data keeps serving its peers.

A joined rank sets the JOINED slot of the negotiation vector and asks for a full exchange every
cycle, so every rank sees who has joined; :func:`~accord.engine.negotiation.negotiate.decide` counts joined
ranks as present for every name. For each ready name a joined rank did not submit it runs a
*stand-in* built from the agreed signature, so the collective lines up on every rank:

- allreduce / reducescatter / reduce: zeros of the agreed shape (Horovod contributes zeros
  for every reduce op; Average still divides by the full process set size);
- allgather / gather / alltoall: zero rows (alltoall: zero rows to every rank);
- broadcast / scatter: a receive buffer (the result is dropped);
- barrier: takes part.

What each collective does while some ranks have joined (a decision per collective; Horovod
0.28 instead raises on the other ranks for allgather, alltoall, broadcast and reducescatter):

- allreduce, reduce: the joined ranks add zeros (as in Horovod);
- reducescatter: the same, so each active rank gets its slice of the active ranks' sum
  (Average divides by the whole set's size, as allreduce does): kept, it is well defined;
- allgather, gather: the joined ranks contribute no rows: the result is the active ranks' rows,
  in rank order: kept;
- alltoall: the joined ranks send no rows and drop what they receive: every active rank gets
  exactly what the other active ranks sent it: kept;
- broadcast, scatter with an active root: the joined ranks receive and drop the data: kept;
- broadcast, scatter, reduce, gather whose root has joined without submitting it: not
  defined (no data to send, or nobody to receive), so a MismatchError on every rank that
  submitted it *and* on the joined root, whose join() raises it (it should have submitted);
- barrier: the joined ranks take part.

``join()`` returns on every rank once all have joined, with the rank that joined last (ranks
that join in the same cycle: the highest of them). It is decided by the global set; while a rank
is joined its other process sets serve their collectives the same way (see
:mod:`accord.engine.engine`). If a rank shuts down (it failed, or finished without joining)
while another waits in join(), that join() raises ShutdownError at once.
"""
from __future__ import annotations

from typing import Sequence

import torch

from accord.comm.ops import ReduceOp
from accord.engine.request import RAGGED_OPS, REDUCING_OPS, ROOTED_OPS, Handle, Op, Request, Signature
from accord.errors import with_hint


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r} in an agreed signature")
    return dtype


def _device(kind: str, index: int) -> torch.device:
    if kind == "cuda":
        return torch.device("cuda", index if index >= 0 else torch.cuda.current_device())
    return torch.device(kind or "cpu")


def stand_in(name: str, sig: Signature, members: Sequence[int], device_index: int = -1) -> Request:
    """The request a joined rank runs for ``name``, which only other ranks submitted."""
    op = Op(sig.op)
    if op is Op.BARRIER:
        return Request(name, op, process_set_id=sig.process_set)
    ragged = op in RAGGED_OPS
    shape = (0, *sig.shape) if ragged else tuple(sig.shape)
    tensor = torch.zeros(shape, dtype=_dtype(sig.wire_dtype), device=_device(sig.device, device_index))
    if op in REDUCING_OPS and sig.reduce_op == ReduceOp.BAND:
        tensor = torch.bitwise_not(tensor)  # all bits set: what leaves the others' AND as it is
    splits = (0,) * len(members) if op is Op.ALLTOALL else None
    return Request(
        name, op, tensor, reduce_op=ReduceOp(sig.reduce_op) if op in REDUCING_OPS else ReduceOp.SUM,
        root_rank=sig.root if op in ROOTED_OPS else -1, prescale_factor=sig.prescale,
        postscale_factor=sig.postscale, process_set_id=sig.process_set, splits=splits,
        dtype=_dtype(sig.dtype), owned=True)


class JoinState:
    """This rank's side of join: the caller's pending request and who has joined, in order.

    Only the engine thread calls :meth:`observe`, with the joined ranks of every full exchange
    (while any rank is joined, every cycle has one), so every rank reaches the same answer in
    the same cycle.
    """

    def __init__(self) -> None:
        self.handle: Handle | None = None  # the waiting join() call, if any
        self.device = -1
        self._seen: set[int] = set()

    def observe(self, joined: Sequence[int], size: int) -> int | None:
        """Record this cycle's joined ranks; once all ``size`` have joined, forget them and
        return the rank that joined last."""
        now = set(joined)
        fresh, self._seen = now - self._seen, now
        if len(now) < size:
            return None
        self._seen = set()
        return max(fresh or now)


def joined_root_message(name: str, sig: Signature) -> str:
    """The error for a rooted op whose root rank has called join() instead of submitting it."""
    if sig.op in (Op.BROADCAST.value, Op.SCATTER.value):
        why = "so there is no data to send"
    else:
        why = "so no rank would receive the result"
    return with_hint(f"{sig.op} {name!r}: root rank {sig.root} has joined (hvd.join()) without "
                     f"submitting it, {why}",
                     "submit rooted collectives on the root before it calls join(), or pick a "
                     "root rank that has not joined")
