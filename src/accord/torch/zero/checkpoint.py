"""A sharded optimizer's state in the per-rank form ``torch.distributed.checkpoint`` reshards.

The form is torch's own for a sharded model (what ``get_optimizer_state_dict`` returns for an
FSDP2 model): ``{"state": {name: {key: value}}, "param_groups": [{..., "params": [names]}]}``,
keyed by parameter name. A per-element value is a DTensor of its parameter's shape on a 1-D
mesh over the ranks, sharded by rows (``Shard(0)``; a 0-d parameter's value is replicated);
the other values (``step``) are plain. DCP's planner matches the chunks saved at one world size
to the chunks a template asks for at another, so a checkpoint saved at N ranks loads at any M.

Why rows and not the spans the optimizer owns: a span of a bucket cuts tensors at any element,
which no DTensor placement expresses. So saving gathers a bucket's state (one bucket at a time)
and keeps this rank's rows of each parameter, and loading gathers each parameter's rows and
keeps this rank's span. Both are collectives; the transient memory is one bucket's state per key
(saving) or one parameter's (loading).
"""
from __future__ import annotations

import copy
from typing import Any, Iterable, Sequence

import torch

from accord.errors import BackendError, ConfigError, with_hint
from accord.torch import gateway
from accord.torch.process_sets import ProcessSet
from accord.torch.zero.layout import Layout, Slot
from accord.torch.zero.state_dict import bucket_entry, copy_value

HINT_GROUP = ("call torch.distributed.init_process_group (e.g. init_process_group('accord') after "
              "hvd.init()) on every rank, with the same ranks as accord")


def dtensor_api() -> tuple[Any, Any, Any]:
    """``(DTensor, Shard, Replicate)`` from wherever this torch keeps them."""
    try:
        from torch.distributed.tensor import DTensor, Replicate, Shard
    except ImportError:  # (before torch 2.5 they live in the private package only)
        from torch.distributed._tensor import DTensor, Replicate, Shard
    return DTensor, Shard, Replicate


def row_span(rows: int, world: int, rank: int) -> tuple[int, int]:
    """The rows ``[start, end)`` of dim 0 that ``Shard(0)`` gives ``rank``: ``torch.chunk``'s
    split, ``ceil(rows / world)`` each, the last ranks' shorter or empty."""
    each = -(-rows // world)
    start = min(rows, rank * each)
    return start, min(rows, start + each)


def device_mesh(process_set: ProcessSet, device_type: str) -> Any:
    """A 1-D mesh over every rank, in accord's rank order.

    Raises:
        BackendError: no ``torch.distributed`` default group.
        ConfigError: the set is not every rank, or torch's ranks are not accord's.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise BackendError(with_hint(
            "sharded_state_dict() builds DTensors, which need a torch.distributed default process "
            "group, and none is initialized", HINT_GROUP))
    size, rank = gateway.size(), gateway.rank()
    if process_set.size() != size:
        raise ConfigError(with_hint(
            f"sharded_state_dict() needs an optimizer sharded over every rank; this one shards "
            f"over the process set {process_set} ({process_set.size()} of {size} ranks)",
            "use state_dict() (the consolidated form, a collective over the set) for a sharded "
            "optimizer of a process set"))
    if (dist.get_world_size(), dist.get_rank()) != (size, rank):
        raise ConfigError(with_hint(
            f"torch.distributed's default group has rank {dist.get_rank()} of "
            f"{dist.get_world_size()} here, accord has rank {rank} of {size}", HINT_GROUP))
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device_type, (size,))


def to_sharded(values: Iterable[tuple[Slot, str, Any, bool]], layout: Layout, names: Sequence[str],
               all_names: Sequence[str], param_groups: Sequence[dict[str, Any]], mesh: Any,
               rank: int, world: int) -> dict[str, Any]:
    """The DCP form from every parameter's state values.

    Args:
        values: :func:`accord.torch.zero.state_dict.each_state_value`'s.
        layout: the buckets.
        names: the name of each layout parameter.
        all_names: the name of each optimizer parameter, in the groups' order.
        param_groups: the user's groups (their options are saved).
        mesh: :func:`device_mesh`'s.
        rank: this rank.
        world: the number of ranks.
    Returns:
        ``{"state": {name: {key: value}}, "param_groups": [...]}``.
    """
    DTensor, Shard, Replicate = dtensor_api()
    state: dict[str, dict[str, Any]] = {}
    for slot, key, value, per_element in values:
        if per_element:
            full = value.view(layout.params[slot.param].shape)
            if full.dim() == 0:
                local, placement = full.clone(), Replicate()
            else:
                start, end = row_span(full.shape[0], world, rank)
                local, placement = full[start:end].clone(), Shard(0)
            value = DTensor.from_local(local, mesh, [placement], run_check=False, shape=full.shape,
                                       stride=full.stride())
        else:
            value = copy_value(value)
        state.setdefault(names[slot.param], {})[key] = value
    groups, start = [], 0
    for group in param_groups:
        n = len(group["params"])
        groups.append({**{k: copy.deepcopy(v) for k, v in group.items() if k != "params"},
                       "params": list(all_names[start:start + n])})
        start += n
    return {"state": state, "param_groups": groups}


def check_names(state_dict: Any, all_names: Sequence[str],
                param_groups: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The DCP form's groups, once checked against the optimizer's parameter names.

    Raises:
        ConfigError: not that form, or other groups or parameter names than the optimizer's.
    """
    hint = "load a state dict from sharded_state_dict() of an optimizer over the same model"
    if not isinstance(state_dict, dict) or not isinstance(state_dict.get("state"), dict) \
            or not isinstance(state_dict.get("param_groups"), list):
        keys = sorted(map(str, state_dict)) if isinstance(state_dict, dict) else "-"
        raise ConfigError(with_hint(
            "load_sharded_state_dict() takes {'state': {name: {...}}, 'param_groups': [...]}, got "
            f"{type(state_dict).__name__} with keys {keys}", hint))
    loaded = state_dict["param_groups"]
    if len(loaded) != len(param_groups):
        raise ConfigError(with_hint(f"the state dict has {len(loaded)} parameter groups, the optimizer "
                                    f"has {len(param_groups)}", hint))
    start = 0
    for g, (mine, theirs) in enumerate(zip(param_groups, loaded)):
        n = len(mine["params"])
        want, got = list(all_names[start:start + n]), list(theirs.get("params", []))
        if want != got:
            raise ConfigError(with_hint(f"parameter group {g} of the state dict names the parameters "
                                        f"{got}, the optimizer's are {want}", hint))
        start += n
    unknown = sorted(set(state_dict["state"]) - set(all_names))
    if unknown:
        raise ConfigError(with_hint(f"the state dict has state for parameters the optimizer does not "
                                    f"have: {unknown}", hint))
    return loaded


def from_sharded(state_dict: dict[str, Any], layout: Layout, names: Sequence[str],
                 shards: Sequence[torch.Tensor], rank: int) -> list[dict[str, Any]]:
    """This rank's shard state of every bucket (:func:`bucket_entry`) from the DCP form (a
    collective: one gather per DTensor, in the same order on every rank).

    Raises:
        ConfigError: a per-element value whose shape is not its parameter's.
    """
    DTensor, _, _ = dtensor_api()
    saved = state_dict["state"]
    entries = []
    for bucket in layout.buckets:
        full: dict[int, dict[str, Any]] = {}
        for slot in bucket.slots:
            name, shape = names[slot.param], layout.params[slot.param].shape
            entry = {}
            for key, value in sorted(saved.get(name, {}).items(), key=lambda kv: str(kv[0])):
                if isinstance(value, DTensor):  # (what was saved per element)
                    if tuple(value.shape) != tuple(shape):
                        raise ConfigError(with_hint(
                            f"state {key!r} of parameter {name!r} has shape {list(value.shape)}, the "
                            f"parameter has shape {list(shape)}",
                            "load a state dict from sharded_state_dict() of an optimizer over the same model"))
                    value = value.full_tensor()
                entry[key] = value
            full[slot.param] = entry
        entries.append(bucket_entry(bucket, full, shards[bucket.index], layout, rank))
    return entries
