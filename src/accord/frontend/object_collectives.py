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
# The length a sender announces when it could not pickle its object: every receiver then raises
# too, instead of waiting for a payload that will never come.
_UNPICKLABLE = -1
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


def _try_dumps(obj: Any, call: bytes, sender: int) -> tuple[torch.Tensor, Exception | None]:
    """The sealed payload, or an empty one and the error when ``obj`` cannot be pickled."""
    try:
        return _dumps(obj, call, sender), None
    except Exception as exc:  # pickling runs the object's own code: anything may come out
        return torch.empty(0, dtype=torch.uint8), exc


def _unpicklable(what: str, ranks: list[int], here: int, own: Exception | None) -> None:
    """Raise on every rank once the announced lengths say some sender could not pickle: the
    sender its own error, the others a CollectiveError naming the senders."""
    if not ranks:
        return
    if own is not None:
        raise own
    raise CollectiveError(with_hint(
        f"{what}: rank(s) {ranks} could not pickle their object, so rank {here} has nothing to "
        "receive (their own error says why)",
        "pass objects pickle (or cloudpickle) can serialize: no open files, locks, sockets or "
        "generators; send tensors through broadcast_parameters / allgather"))


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
        CollectiveError (HorovodInternalError): a seal or length check failed, the collective,
            or (on the other ranks) the root could not pickle ``obj``.
        Exception: on the root, what pickling ``obj`` raised (once every rank has been told).
    """
    here = engine.topology().rank
    is_root = here == root_rank
    call, _ = _call("broadcast", name, set_id)
    payload, failed = _try_dumps(obj, call, root_rank) if is_root else (torch.empty(0, dtype=torch.uint8), None)
    length = torch.tensor([_UNPICKLABLE if failed else payload.numel()], dtype=torch.int64)
    engine.synchronize(engine.submit("broadcast", length, _named("broadcast", name, "sz"), in_place=True,
                                      root_rank=root_rank, process_set_id=set_id))
    _unpicklable("broadcast_object", [root_rank] if int(length.item()) == _UNPICKLABLE else [], here, failed)
    _check_lengths([int(length.item())], f"rank {root_rank}'s broadcast_object")
    if not is_root:
        payload = torch.empty(int(length.item()), dtype=torch.uint8)
    engine.synchronize(engine.submit("broadcast", payload, _named("broadcast", name, "t"), in_place=True,
                                      root_rank=root_rank, process_set_id=set_id))
    return obj if is_root else _loads(payload, call, root_rank)


def allgather_object(obj: Any, name: str | None, set_id: int) -> list[Any]:
    """Every member's ``obj``, in rank order.

    Raises:
        CollectiveError (HorovodInternalError): a seal or length check failed, the collective,
            or another member could not pickle its ``obj``.
        Exception: on a member that could not pickle its ``obj``, what pickling raised (once
            every member has been told).
    """
    here = engine.topology().rank
    call, members = _call("allgather", name, set_id)
    payload, failed = _try_dumps(obj, call, here)
    sizes = engine.synchronize(engine.submit(
        "allgather", torch.tensor([_UNPICKLABLE if failed else payload.numel()], dtype=torch.int64),
        _named("allgather", name, "sz"), process_set_id=set_id))
    _unpicklable("allgather_object", [r for r, n in zip(members, sizes.tolist()) if n == _UNPICKLABLE],
                 here, failed)
    _check_lengths(sizes.tolist(), "allgather_object")
    gathered = engine.synchronize(engine.submit("allgather", payload, _named("allgather", name, "t"),
                                                 process_set_id=set_id))
    out, start = [], 0
    for sender, n in zip(members, sizes.tolist()):
        out.append(_loads(gathered[start:start + n], call, sender))
        start += n
    return out
