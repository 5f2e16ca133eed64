"""A sharded optimizer's state in ``torch.optim``'s own form, and back.

The consolidated form is exactly what the plain optimizer class would return for the same
parameters (``{"state": {index: {key: tensor}}, "param_groups": [...]}``, indices counting the
parameters of every group in order), so it does not depend on the world size: it loads into
the plain class, and into a sharded optimizer at any world size, each rank keeping its span.

A state entry is *per element* when it is a tensor shaped like its parameter (``exp_avg``,
``momentum_buffer``); everything else (``step``, other scalars) is the same for every element
of a shard and is copied to each parameter of it. For 0-d parameters the two cannot be told
apart by shape, so the scalar keys torch.optim uses are named in :data:`SCALAR_KEYS`.
"""
from __future__ import annotations

import copy
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch

from accord.errors import with_hint
from accord.torch.zero.layout import Bucket, Layout, Slot

SCALAR_KEYS = frozenset({"step", "mu_product", "eta", "mu"})

Gather = Callable[[torch.Tensor, str], torch.Tensor]  # (this rank's shard, a key) -> every rank's, concatenated


def _per_element(key: str, value: Any, shape: Sequence[int]) -> bool:
    if not torch.is_tensor(value) or tuple(value.shape) != tuple(shape):
        return False
    return len(shape) > 0 or key not in SCALAR_KEYS


def _local_order(local: torch.optim.Optimizer, shards: Sequence[torch.Tensor]) -> list[int]:
    """Bucket index of each of ``local``'s parameters, in its state-dict order."""
    bucket = {id(s): b for b, s in enumerate(shards)}
    return [bucket[id(p)] for group in local.param_groups for p in group["params"]]


def each_state_value(local: torch.optim.Optimizer, shards: Sequence[torch.Tensor], layout: Layout,
                     gather: Gather) -> Iterator[tuple[Slot, str, Any, bool]]:
    """Every parameter's state values, from every rank's shard state (a collective: one gather
    per bucket and per-element key, in the same order on every rank).

    Yields ``(slot, key, value, per_element)``: a per-element value is the parameter's flat part
    of the gathered bucket (a view, valid until the next value of its bucket is gathered),
    anything else is the shard's value itself (the same for every parameter of the bucket).
    """
    for bucket in layout.buckets:
        shard = shards[bucket.index]
        entry = local.state.get(shard, {})
        for key in sorted(entry, key=str):
            value = entry[key]
            if torch.is_tensor(value) and value.dim() == 1 and value.shape == shard.shape:
                full = gather(value.detach(), f"{bucket.index}.{key}")
                for slot in bucket.slots:
                    yield slot, key, full[slot.offset:slot.offset + slot.numel], True
            else:
                for slot in bucket.slots:
                    yield slot, key, value, False


def copy_value(value: Any) -> Any:
    """A copy of a state or option value that shares no memory with it."""
    return value.clone() if torch.is_tensor(value) else copy.deepcopy(value)


def consolidate(local: torch.optim.Optimizer, shards: Sequence[torch.Tensor], layout: Layout,
                index: Sequence[int], param_groups: Sequence[dict[str, Any]],
                gather: Gather) -> dict[str, Any]:
    """The full state from every rank's shard state (a collective, see :func:`each_state_value`).

    Args:
        local: the optimizer over this rank's shards.
        shards: this rank's shard tensors, one per bucket.
        layout: the buckets.
        index: optimizer parameter index of each layout parameter.
        param_groups: the user's groups (their options are saved).
        gather: concatenates every rank's shard of a tensor.
    Returns:
        A ``torch.optim`` state dict.
    """
    state: dict[int, dict[str, Any]] = {}
    for slot, key, value, per_element in each_state_value(local, shards, layout, gather):
        shape = layout.params[slot.param].shape
        state.setdefault(index[slot.param], {})[key] = \
            value.view(shape).clone() if per_element else copy_value(value)
    groups, start = [], 0
    for group in param_groups:
        n = len(group["params"])
        groups.append({**{k: copy.deepcopy(v) for k, v in group.items() if k != "params"},
                       "params": list(range(start, start + n))})
        start += n
    return {"state": state, "param_groups": groups}


def check_groups(state_dict: dict[str, Any], param_groups: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The state dict's groups, once checked against the optimizer's.

    Raises:
        ValueError: a different number of groups, or of parameters in a group.
    """
    loaded = state_dict.get("param_groups")
    if not isinstance(loaded, list) or len(loaded) != len(param_groups):
        raise ValueError(with_hint(
            f"loaded state dict has {len(loaded) if isinstance(loaded, list) else loaded!r} parameter "
            f"groups, the optimizer has {len(param_groups)}",
            "load a state dict saved from an optimizer over the same model"))
    for g, (mine, theirs) in enumerate(zip(param_groups, loaded)):
        if len(mine["params"]) != len(theirs["params"]):
            raise ValueError(with_hint(
                f"parameter group {g} of the loaded state dict has {len(theirs['params'])} "
                f"parameters, the optimizer's has {len(mine['params'])}",
                "load a state dict saved from an optimizer over the same model"))
    return loaded


def shard_of(state_dict: dict[str, Any], local: torch.optim.Optimizer, shards: Sequence[torch.Tensor],
             layout: Layout, rank: int, index: Sequence[int]) -> dict[str, Any]:
    """The state dict for ``local`` (over ``rank``'s shards) cut out of a full one.

    Every rank builds an entry for every bucket whose parameters have state, with the same keys,
    even where its span is empty: later consolidations gather the same keys on every rank.
    """
    saved = state_dict.get("state", {})
    # state dicts written through JSON-like formats may carry string keys
    saved = {int(k): v for k, v in saved.items()}
    entries = [bucket_entry(bucket, {s.param: saved.get(index[s.param], {}) for s in bucket.slots},
                            shards[bucket.index], layout, rank) for bucket in layout.buckets]
    return local_state_dict(entries, local, shards, state_dict["param_groups"])  # (groups checked first)


def bucket_entry(bucket: Bucket, saved: Mapping[int, Mapping[str, Any]], shard: torch.Tensor,
                 layout: Layout, rank: int) -> dict[str, Any]:
    """``rank``'s shard state of one bucket, cut out of its parameters' full states.

    Args:
        bucket: the bucket.
        saved: layout parameter index -> its full state (``{key: value}``) for the bucket's
            parameters (missing or empty: no state).
        shard: ``rank``'s shard tensor of the bucket.
        layout: the buckets.
        rank: the rank (in the set) whose span is cut out.
    Returns:
        ``{key: value}`` for the shard (empty when no parameter has state).
    """
    entry: dict[str, Any] = {}
    for slot in bucket.slots:
        shape = layout.params[slot.param].shape
        for key, value in saved.get(slot.param, {}).items():
            if _per_element(key, value, shape):
                if key not in entry:
                    entry[key] = torch.zeros(shard.shape, dtype=value.dtype, device=shard.device)
            else:
                entry.setdefault(key, copy_value(value))
    for piece in bucket.pieces(rank):
        shape = layout.params[piece.param].shape
        for key, value in saved.get(piece.param, {}).items():
            if _per_element(key, value, shape):
                entry[key][piece.shard_offset:piece.shard_offset + piece.end - piece.start] = \
                    value.detach().reshape(-1)[piece.start:piece.end].to(shard.device)
    return entry


def local_state_dict(entries: Sequence[dict[str, Any]], local: torch.optim.Optimizer,
                     shards: Sequence[torch.Tensor], loaded_groups: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The state dict ``local.load_state_dict`` takes, from one entry per bucket (its
    :func:`bucket_entry`) and the loaded groups' options."""
    ids = {b: i for i, b in enumerate(_local_order(local, shards))}
    state = {ids[b]: entry for b, entry in enumerate(entries) if entry}
    groups, start = [], 0
    for mine, theirs in zip(local.param_groups, loaded_groups):
        n = len(mine["params"])
        groups.append({**{k: v for k, v in theirs.items() if k != "params"}, "params": list(range(start, start + n))})
        start += n
    return {"state": state, "param_groups": groups}
