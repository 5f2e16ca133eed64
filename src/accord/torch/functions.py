"""Helpers over the collectives: broadcasting a model's parameters and an optimizer's state,
and broadcasting / allgathering arbitrary Python objects.

``broadcast_object`` / ``allgather_object`` pickle and seal objects; what is checked before
anything is unpickled is written in :mod:`accord.frontend.object_collectives` (shared with accord.mxnet).
"""
from __future__ import annotations

from typing import Any

import torch

from accord.frontend import object_collectives as objects
from accord.torch import async_ops as A
from accord.torch import gateway
from accord.torch.gateway import synchronize
from accord.torch.process_sets import ProcessSet, global_process_set, set_id_of


def broadcast_parameters(params: Any, root_rank: int,
                         process_set: ProcessSet = global_process_set) -> None:
    """Overwrite ``params`` in place with root's values.

    Args:
        params: ``model.state_dict()`` (a dict), or a list of tensors or of (name, tensor) pairs,
            e.g. ``list(model.named_parameters())``. A generator is rejected, as in Horovod.
        root_rank: global rank whose values everyone receives.
        process_set: the ranks taking part (default: all); every member must call.

    Raises:
        ValueError: ``params`` is neither a dict nor a list.
    """
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, list):
        items = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise ValueError("invalid params of type: %s" % type(params))
    handles = [A.broadcast_async_(p, root_rank, name, process_set) for name, p in items]
    for h in handles:
        synchronize(h)


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int,
                              model: torch.nn.Module | None = None,
                              process_set: ProcessSet = global_process_set) -> None:
    """Make every rank's optimizer state (buffers, step counts, lr and other options) root's.

    An optimizer without state yet gets it first, as in Horovod, by one step with zero
    gradients: every parameter that requires grad is left with a zero ``.grad`` (scripts read
    it afterwards); the step's effect on the parameters is undone (so weight decay does not
    move them), and parameters that do not require grad are not touched. ``model`` is accepted
    for Horovod compatibility.

    Args:
        optimizer: the optimizer (or a ``DistributedOptimizer``) to overwrite with root's state.
        root_rank: the global rank whose state is sent; the same on every rank.
        model: ignored (Horovod's argument).
        process_set: the ranks taking part (default: all); every member must call.

    Raises:
        ValueError: ``optimizer`` is an LBFGS (its state is not a set of tensors).
        CollectiveError: a broadcast failed (see :func:`accord.torch.broadcast`).
    """
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    sharded = getattr(optimizer, "_accord_broadcast_state", None)
    if sharded is not None:  # a sharded DistributedOptimizer: each rank holds part of the state
        sharded(root_rank)
        return
    if len(optimizer.state_dict()["state"]) == 0:
        _initialize_state(optimizer)
    is_root = gateway.rank() == root_rank
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state_dict = broadcast_state_dict(optimizer.state_dict(), root_rank, params, process_set)
    if not is_root:
        optimizer.load_state_dict(state_dict)


def broadcast_state_dict(state_dict: dict[str, Any] | None, root_rank: int,
                         params: list[torch.Tensor] | None = None,
                         process_set: ProcessSet = global_process_set) -> dict[str, Any]:
    """Root's optimizer state dict (``torch.optim``'s form) on every rank of the set.

    Args:
        state_dict: root's state dict (others may pass None, or their own: only its
            ``param_groups`` structure is kept).
        root_rank: global rank that sends.
        params: the optimizer's parameters in state-dict order: CUDA state is received on its
            parameter's device (else on root's kind of device).
    Returns:
        Root's state dict (on root, ``state_dict`` itself).
    """
    is_root = gateway.rank() == root_rank
    # Root's layout decides: ranks whose state covers other parameters (e.g. root never saw a
    # gradient for some) still agree on every name, so nothing can stall.
    layout = None
    if is_root:
        layout = {"tensors": [], "scalars": {}, "options": [
            {k: v for k, v in group.items() if k != "params"} for group in state_dict["param_groups"]],
            "params": [list(group["params"]) for group in state_dict["param_groups"]]}
        for pid in sorted(state_dict["state"], key=str):
            for key in sorted(state_dict["state"][pid], key=str):
                value = state_dict["state"][pid][key]
                if torch.is_tensor(value):
                    layout["tensors"].append((pid, key, tuple(value.shape), str(value.dtype),
                                              value.device.type))
                else:
                    layout["scalars"][(pid, key)] = value
    layout = broadcast_object(layout, root_rank, process_set=process_set)
    received = []
    params = params or []
    for pid, key, shape, dtype, device in layout["tensors"]:
        if is_root:
            buf = state_dict["state"][pid][key]
        else:
            # On root's kind of device (collectives match devices across ranks): this rank's
            # parameter's GPU for CUDA state (exp_avg, ...), the CPU for CPU state (Adam's step).
            where = params[pid].device if device == "cuda" and isinstance(pid, int) and pid < len(params) \
                else torch.device(device)
            buf = torch.empty(shape, dtype=getattr(torch, dtype.replace("torch.", "")), device=where)
        received.append((pid, key, buf))
    broadcast_parameters([(f"optimizer_state.{pid}.{key}", buf) for pid, key, buf in received],
                         root_rank, process_set)
    if is_root:
        return state_dict
    state: dict[Any, dict[str, Any]] = {}
    for pid, key, buf in received:
        state.setdefault(pid, {})[key] = buf
    for (pid, key), value in layout["scalars"].items():
        state.setdefault(pid, {})[key] = value
    groups = [{**opts, "params": ids} for opts, ids in zip(layout["options"], layout["params"])]
    return {"state": state, "param_groups": groups}


def _initialize_state(optimizer: torch.optim.Optimizer) -> None:
    """Create optimizer state with a zero-gradient step; parameters are left as found, their
    ``.grad`` zero (Horovod's behaviour)."""
    saved = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad:
                saved.append((p, p.detach().clone()))
                grad = torch.zeros_like(p)
                p.grad = grad.to_sparse() if isinstance(optimizer, torch.optim.SparseAdam) else grad
    # A DistributedOptimizer's step() would allreduce; the wrapped class's step() does not.
    step = getattr(optimizer, "_accord_local_step", None) or optimizer.step
    step()
    with torch.no_grad():
        for p, value in saved:
            p.copy_(value)
            if p.grad is not None:
                p.grad.zero_()  # some optimizers update gradients in place (weight decay)


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """Return root's ``obj`` on every rank of the set (pickled and sealed: see
    :mod:`accord.frontend.object_collectives` for what is checked).

    Example: ``state = hvd.broadcast_object(state if hvd.rank() == 0 else None, root_rank=0)``.

    Args:
        obj: the object to send, on the root; ignored on the other ranks.
        root_rank: the global rank whose object is sent; the same on every rank.
        name: the collective's name, the same on every rank; ``None``: numbered in the order
            of the calls.
        process_set: the ranks taking part (default: all); every member must call.

    Returns:
        The root's object, unpickled on every rank (the root gets its own back).

    Raises:
        CollectiveError: the root could not pickle ``obj``, or the pickle announced more than
            ``ACCORD_MAX_OBJECT_BYTES``, or the broadcast failed.
    """
    return objects.broadcast_object(obj, root_rank, name, set_id_of(process_set))


def allgather_object(obj: Any, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> list[Any]:
    """Return every rank's ``obj`` as a list in rank order (pickled and sealed, as
    :func:`broadcast_object`).

    Args:
        obj: this rank's object (anything pickle can serialize).
        name: the collective's name, the same on every rank; ``None``: numbered in the order
            of the calls.
        process_set: the ranks taking part (default: all); every member must call.

    Returns:
        One object per rank of the set, in rank order.

    Raises:
        CollectiveError: a rank could not pickle its object, a pickle was over
            ``ACCORD_MAX_OBJECT_BYTES``, or the allgather failed.
    """
    return objects.allgather_object(obj, name, set_id_of(process_set))
