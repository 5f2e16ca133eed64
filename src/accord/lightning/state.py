"""What the ranks of a strategy take from one another: rank 0's model and optimizer at setup, the
most advanced rank's after uneven data; and the names of the gradients ``hvd.DistributedOptimizer``
averages.

At setup an optimizer that has no state yet (the usual case: made by ``configure_optimizers`` or
just before ``fabric.setup``) gets only rank 0's options (learning rates, momentum, ...):
``hvd.broadcast_optimizer_state`` would first create a state by a step with zero gradients, which
counts as a step for Adam's bias correction, so training would no longer match one process (or
DDP). One that has a state (restored, or stepped before) gets rank 0's state as well. Rank 0
decides which, so every rank runs the same collectives.

After uneven data (:func:`after_join`): while a rank had joined, the others went on stepping, its
part of their averages zeros (Horovod's rule), but it did not step itself. So once every rank has
joined, the ranks that stepped fewer times take the model, optimizer and scheduler states of one
that stepped the most, and every rank goes on from the same weights.

Every rank must name a gradient the same way. The module's own names (``named_parameters()``) are
used where the optimizer's parameter belongs to a module set up; a parameter no module holds (an
optimizer over extra tensors) is named by its position in the optimizer, which every rank shares.
"""
from __future__ import annotations

from typing import Any, Iterable, Sequence

import torch

import accord.torch as hvd
from accord.lightning.collectives import Names


def broadcast_module(module: torch.nn.Module, root: int = 0) -> None:
    """Overwrite ``module``'s parameters and buffers with rank ``root``'s, in place."""
    hvd.broadcast_parameters(module.state_dict(), root_rank=root)


def broadcast_optimizer(optimizer: torch.optim.Optimizer, names: Names) -> None:
    """Give ``optimizer`` rank 0's options, and rank 0's state when rank 0's optimizer has one."""
    if hvd.broadcast_object(bool(optimizer.state), root_rank=0, name=names.next("has_state")):
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        return
    options = hvd.broadcast_object([{k: v for k, v in group.items() if k != "params"}
                                    for group in optimizer.param_groups], root_rank=0,
                                   name=names.next("options"))
    for group, chosen in zip(optimizer.param_groups, options):
        group.update(chosen)


def after_join(steps: int, modules: Sequence[torch.nn.Module], optimizers: Sequence[torch.optim.Optimizer],
               schedulers: Sequence[Any], names: Names) -> int | None:
    """Call on every rank once all have joined, with the optimizer steps this rank took since the
    last call: if some rank took fewer, every rank takes the states of the first rank that took
    the most. Returns that rank, or None when every rank took as many steps."""
    counts = hvd.allgather(torch.tensor([steps], dtype=torch.int64), name=names.next("steps")).tolist()
    if min(counts) == max(counts):
        return None
    source = counts.index(max(counts))
    for module in modules:
        broadcast_module(module, source)
    for optimizer in optimizers:
        hvd.broadcast_optimizer_state(optimizer, root_rank=source)
    for scheduler in schedulers:
        scheduler.load_state_dict(hvd.broadcast_object(scheduler.state_dict(), root_rank=source,
                                                       name=names.next("scheduler")))
    return source


def parameter_names(optimizer: torch.optim.Optimizer, modules: torch.nn.Module | Iterable[torch.nn.Module] | None,
                    index: int) -> list[tuple[str, torch.Tensor]]:
    """``(name, parameter)`` for every parameter of ``optimizer`` (the ``index``-th of its strategy),
    named after ``modules`` where they hold it."""
    if isinstance(modules, torch.nn.Module):
        modules = [modules]
    known: dict[torch.Tensor, str] = {}
    for position, module in enumerate(modules or []):
        prefix = "" if position == 0 else f"module{position}."
        for name, parameter in module.named_parameters():
            known.setdefault(parameter, prefix + name)
    named, seen = [], set()
    for g, group in enumerate(optimizer.param_groups):
        for j, parameter in enumerate(group["params"]):
            if parameter in seen:
                continue
            seen.add(parameter)
            named.append((known.get(parameter, f"optimizer{index}.group{g}.param{j}"), parameter))
    return named
