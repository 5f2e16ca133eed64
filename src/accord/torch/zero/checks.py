"""What a sharded optimizer refuses at construction, on every rank alike.

Every rank computes its layout from its own parameter list; if the lists differed, ranks would
reduce-scatter buffers of different sizes and wait for each other forever (or silently mix up
parameters). So the ranks exchange a signature of their parameters (one allgather) and every
rank raises the same error naming the first parameter that differs and what each rank has.

Optimizers whose step couples elements across a tensor or across tensors (a line search over
all parameters, per-tensor factored or orthogonalized updates) cannot step a flat shard that
cuts tensors apart: they are refused by name.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from accord.errors import with_hint

# torch.optim classes (by name: some exist only in newer torch) whose step is not elementwise.
COUPLED_OPTIMIZERS = {
    "LBFGS": "its line search uses the norm and dot products of every parameter at once",
    "SparseAdam": "it takes sparse gradients only, a flat shard holds dense ones",
    "Adafactor": "it factors each matrix's second moment into row and column statistics",
    "Muon": "it orthogonalizes each matrix's update as a whole",
}

Signature = list[tuple[str, tuple[int, ...], str, bool, int]]


def signature(named: Sequence[tuple[str, torch.Tensor]], groups: Sequence[int]) -> Signature:
    """Per parameter (in optimizer order): name, shape, dtype, requires_grad, parameter group."""
    return [(name, tuple(p.shape), str(p.dtype).replace("torch.", ""), bool(p.requires_grad), g)
            for (name, p), g in zip(named, groups)]


def first_difference(signatures: Sequence[Signature]) -> str:
    """'' when every rank's signature is the same, else what differs, with each rank's value."""
    reference = signatures[0]
    counts = [len(s) for s in signatures]
    if len(set(counts)) > 1:
        per_rank = ", ".join(f"rank {r}: {n}" for r, n in enumerate(counts))
        return f"the number of parameters differs between ranks ({per_rank})"
    fields = ("name", "shape", "dtype", "requires_grad", "parameter group")
    for i, entry in enumerate(reference):
        for f, field in enumerate(fields):
            values = [s[i][f] for s in signatures]
            if any(v != values[0] for v in values):
                per_rank = ", ".join(f"rank {r}: {v!r}" for r, v in enumerate(values))
                return f"parameter #{i} ({entry[0]!r} on rank 0) has a different {field} ({per_rank})"
    return ""


def check_same_everywhere(sig: Signature, allgather_object: Callable[[Any], list[Any]]) -> None:
    """Raise on every rank if the ranks' parameter signatures differ.

    Args:
        sig: this rank's :func:`signature`.
        allgather_object: gathers one picklable object from every rank of the set, in rank order.
    Raises:
        ValueError: the parameters differ between ranks (the same message on every rank).
    """
    difference = first_difference(allgather_object(sig))
    if difference:
        raise ValueError(with_hint(
            f"sharded DistributedOptimizer: {difference}",
            "every rank must build the same model and pass its parameters in the same order "
            "(e.g. named_parameters=model.named_parameters() on an identical model)"))


def check_optimizer(optimizer: torch.optim.Optimizer) -> None:
    """Refuse an optimizer whose step is not elementwise (see :data:`COUPLED_OPTIMIZERS`).

    Raises:
        ValueError: ``optimizer`` is one of them (same class on every rank, so every rank raises).
    """
    for cls in type(optimizer).__mro__:
        why = COUPLED_OPTIMIZERS.get(cls.__name__)
        if why is not None and cls.__module__.startswith("torch.optim"):
            raise ValueError(with_hint(
                f"shard_optimizer_state=True cannot shard {type(optimizer).__name__}: {why}",
                "use shard_optimizer_state=False for this optimizer, or an elementwise one "
                "(SGD, Adam, AdamW, Adagrad, RMSprop, ...)"))
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.is_sparse:
                raise ValueError(with_hint("shard_optimizer_state=True needs dense parameters, "
                                           f"got a sparse one of shape {list(p.shape)}",
                                           "use shard_optimizer_state=False"))
