"""Python objects over the collectives: what ``broadcast_object`` / ``allgather_object`` of every
frontend (accord.torch, accord.mxnet) run, through the session door.

Security: objects are pickled (cloudpickle when installed, as Horovod does) and travel only over
the job's own data plane. Every pickle is sealed with an HMAC under the job secret, bound to the
call (kind, process set and its members, the call's number on that set in this runtime, its
name, and the sender), and checked before unpickling: bytes that no rank of this job sealed for
this very call are refused, never unpickled, so an object sealed for an earlier call cannot be
replayed into a later one. Announced lengths are checked against ACCORD_MAX_OBJECT_BYTES before
anything is allocated. Unpickling runs code chosen by the sending rank: these functions trust the
job's ranks exactly as much as the training script itself does.
"""
from __future__ import annotations

import weakref
from typing import Any

import torch

from accord import engine
from accord.errors import CollectiveError, with_hint
from accord.frontend import settings
from accord.store.sealed_objects import dumps_sealed, loads_sealed
from accord.store.secret import SEAL_BYTES

_PURPOSE = b"accord object"
# per runtime (a new one after every init): (process set id, members) -> calls made on that set
_calls: "weakref.WeakKeyDictionary[Any, dict[tuple, int]]" = weakref.WeakKeyDictionary()


def _call(kind: str, name: str | None, set_id: int) -> tuple[bytes, tuple[int, ...]]:
    """What every seal of this call is bound to (the same on every member), and the members."""
    members = tuple(engine.process_set_members(set_id))
    counts = _calls.setdefault(engine.runtime(), {})
    number = counts[(set_id, members)] = counts.get((set_id, members), 0) + 1
    return _PURPOSE + f"|{kind}|set {set_id} {list(members)}|call {number}|name {name!r}|from ".encode(), members


def _dumps(obj: Any, call: bytes, sender: int) -> torch.Tensor:
    sealed = dumps_sealed(engine.runtime().secret, call + str(sender).encode(), obj)
    return torch.frombuffer(bytearray(sealed), dtype=torch.uint8)


def _loads(data: torch.Tensor, call: bytes, sender: int) -> Any:
    try:
        return loads_sealed(engine.runtime().secret, call + str(sender).encode(), data.numpy().tobytes())
    except ValueError as exc:  # never unpickle what a rank of this job did not seal for this call
        raise CollectiveError(str(exc)) from None


def _check_lengths(lengths: list[int], what: str) -> None:
    """Refuse announced lengths outside [seal size, ACCORD_MAX_OBJECT_BYTES] before allocating
    (the same on every rank, since every rank sees the same announced lengths)."""
    limit = settings.max_object_bytes()
    bad = [n for n in lengths if not SEAL_BYTES <= n <= limit]
    if bad:
        raise CollectiveError(with_hint(
            f"{what} announced {bad[0]} bytes for a pickled object; accepted: {SEAL_BYTES} to "
            f"{limit} (ACCORD_MAX_OBJECT_BYTES); nothing was allocated",
            "send smaller objects (tensors go through broadcast_parameters), or raise "
            "ACCORD_MAX_OBJECT_BYTES on every rank; if the objects are small, something other "
            "than the job's ranks wrote to the data plane: run it on a trusted network"))


def _named(op: str, name: str | None, part: str) -> str | None:
    return f"{op}.{name}.{part}" if name else None


def broadcast_object(obj: Any, root_rank: int, name: str | None, set_id: int) -> Any:
    """Return global rank ``root_rank``'s ``obj`` on every rank of set ``set_id``.

    Raises:
        CollectiveError (HorovodInternalError): a seal or length check failed, or the collective.
    """
    is_root = engine.topology().rank == root_rank
    call, _ = _call("broadcast", name, set_id)
    payload = _dumps(obj, call, root_rank) if is_root else torch.empty(0, dtype=torch.uint8)
    length = torch.tensor([payload.numel()], dtype=torch.int64)
    engine.synchronize(engine.submit("broadcast", length, _named("broadcast", name, "sz"), in_place=True,
                                      root_rank=root_rank, process_set_id=set_id))
    _check_lengths([int(length.item())], f"rank {root_rank}'s broadcast_object")
    if not is_root:
        payload = torch.empty(int(length.item()), dtype=torch.uint8)
    engine.synchronize(engine.submit("broadcast", payload, _named("broadcast", name, "t"), in_place=True,
                                      root_rank=root_rank, process_set_id=set_id))
    return obj if is_root else _loads(payload, call, root_rank)


def allgather_object(obj: Any, name: str | None, set_id: int) -> list[Any]:
    """Every member's ``obj``, in rank order.

    Raises:
        CollectiveError (HorovodInternalError): a seal or length check failed, or the collective.
    """
    call, members = _call("allgather", name, set_id)
    payload = _dumps(obj, call, engine.topology().rank)
    sizes = engine.synchronize(engine.submit(
        "allgather", torch.tensor([payload.numel()], dtype=torch.int64), _named("allgather", name, "sz"),
        process_set_id=set_id))
    _check_lengths(sizes.tolist(), "allgather_object")
    gathered = engine.synchronize(engine.submit("allgather", payload, _named("allgather", name, "t"),
                                                 process_set_id=set_id))
    out, start = [], 0
    for sender, n in zip(members, sizes.tolist()):
        out.append(_loads(gathered[start:start + n], call, sender))
        start += n
    return out
