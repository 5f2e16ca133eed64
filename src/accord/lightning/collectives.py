"""The collectives Lightning's strategies offer (``reduce``/``all_reduce``, ``all_gather``, ``broadcast``,
``barrier``), with the results Lightning's DDP strategy gives, on accord's engine.

Lightning code (``self.log(..., sync_dist=True)``, ``self.all_gather``, ``ModelCheckpoint``,
``EarlyStopping``, ``fabric.all_reduce``) is written against DDP's results, so these follow DDP,
not Horovod, where the two differ: ``all_gather`` stacks the ranks' tensors along a new first
dimension (Horovod concatenates), its gradient is summed over the ranks (Horovod averages), and a
mean is a sum divided by the world size, truncated back to the dtype for integer tensors (Horovod's
Average truncates the same way; DDP's Gloo path does exactly this). Nothing here imports Lightning.

Every collective is named by the strategy's :class:`Names`. accord, like Horovod, numbers unnamed
collectives in the order each rank submits them, and a rank that has joined (its data ended before
the others') submits none of the collectives it still takes part in: numbered, the ranks'
collectives would no longer pair up after uneven data. The names restart, on every rank at once,
after each join.
"""
from __future__ import annotations

from typing import Any

import torch

import accord.torch as hvd
from accord.errors import with_hint

# Lightning's names for a reduction (strings, or torch.distributed.ReduceOp members by name).
_OPS = {"mean": "mean", "avg": "mean", "sum": "sum", "max": "max", "min": "min",
        "product": "product", "prod": "product"}


def op_name(reduce_op: Any) -> str:
    """``"mean"``, ``"sum"``, ``"max"``, ``"min"`` or ``"product"`` for what Lightning passes as
    ``reduce_op``: None (a mean), a string or a ``torch.distributed.ReduceOp`` member.

    Raises:
        ValueError: an operation accord's strategies do not reduce with (PREMUL_SUM, the bitwise ones).
    """
    if reduce_op is None:
        return "mean"
    text = reduce_op if isinstance(reduce_op, str) else getattr(reduce_op, "name", str(reduce_op))
    name = _OPS.get(str(text).rsplit(".", 1)[-1].lower())
    if name is None:
        raise ValueError(with_hint(
            f"reduce_op={reduce_op!r} is not a reduction accord's Lightning strategies perform",
            "use 'mean' (the default), 'sum', 'max', 'min' or 'product', or torch.distributed.ReduceOp's "
            "SUM/AVG/MAX/MIN/PRODUCT"))
    return name


def refuse_group(group: Any, what: str) -> None:
    """Raise unless ``group`` means every rank (None or torch.distributed's WORLD).

    Raises:
        ValueError: a sub-group was named.
    """
    if group is None:
        return
    try:
        import torch.distributed as dist

        if group is dist.group.WORLD:
            return
    except (ImportError, AttributeError):  # a torch built without torch.distributed
        pass
    raise ValueError(with_hint(
        f"{what} over a sub-group ({group!r}) is not supported by accord's Lightning strategies: "
        "they reduce over every rank of the job",
        f"call {what} without `group`, or use accord.torch's process sets (hvd.add_process_set) for "
        "collectives over a subset of ranks"))


class Names:
    """The names of one strategy's collectives: ``accord.lightning.<what>.<joins so far>.<count>``."""

    def __init__(self) -> None:
        self.joins = 0
        self.count = 0

    def next(self, what: str) -> str:
        """A fresh name for a collective of kind ``what``."""
        self.count += 1
        return f"accord.lightning.{what}.{self.joins}.{self.count}"

    def join(self) -> int:
        """``hvd.join()``, then start the names afresh (every rank is here now); returns the last rank to join."""
        last = hvd.join()
        self.joins += 1
        self.count = 0
        return last


def reduce(tensor: Any, names: Names, group: Any = None, reduce_op: Any = "mean") -> Any:
    """Reduce ``tensor`` over every rank and return the result (a new tensor).

    Anything that is not a tensor comes back unchanged, as in Lightning's strategies. A mean is the
    sum divided by the number of ranks (for integer tensors truncated back to the dtype, toward zero).

    Raises:
        ValueError: a sub-group or an operation that is not supported (see :func:`op_name`).
    """
    if not isinstance(tensor, torch.Tensor):
        return tensor
    refuse_group(group, "reduce")
    name = op_name(reduce_op)
    source = tensor.detach().contiguous()
    if name == "mean":
        total = hvd.allreduce(source, op=hvd.Sum, name=names.next("reduce"))
        mean = total / hvd.size()
        return mean if total.is_floating_point() or total.is_complex() else mean.to(total.dtype)
    op = {"sum": hvd.Sum, "max": hvd.Max, "min": hvd.Min, "product": hvd.Product}[name]
    return hvd.allreduce(source, op=op, name=names.next("reduce"))


class _StackedGather(torch.autograd.Function):
    """Every rank's tensor stacked along a new first dimension; backward sums the gradient over
    the ranks and hands each rank its own row (what ``torch.distributed.nn.all_gather`` does)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, names: Names) -> torch.Tensor:
        ctx.rank, ctx.names = hvd.rank(), names
        return hvd.allgather(tensor.detach().unsqueeze(0).contiguous(), name=names.next("all_gather"))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        summed = hvd.allreduce(grad.contiguous(), op=hvd.Sum, name=ctx.names.next("all_gather_grad"))
        return summed[ctx.rank], None


def all_gather(tensor: torch.Tensor, names: Names, group: Any = None, sync_grads: bool = False) -> torch.Tensor:
    """Every rank's ``tensor`` (same shape on every rank), stacked: shape ``(world_size, *tensor.shape)``.

    With ``sync_grads`` the result is differentiable (each rank's input gets the gradient summed
    over the ranks for its row), as in DDP.

    Raises:
        ValueError: a sub-group was named.
    """
    refuse_group(group, "all_gather")
    if sync_grads:
        return _StackedGather.apply(tensor, names)
    with torch.no_grad():
        return hvd.allgather(tensor.detach().unsqueeze(0).contiguous(), name=names.next("all_gather"))


def broadcast(obj: Any, names: Names, src: int = 0) -> Any:
    """Rank ``src``'s ``obj`` (any picklable object) on every rank."""
    return hvd.broadcast_object(obj, root_rank=src, name=names.next("broadcast"))


def barrier() -> None:
    """Wait until every rank has reached a barrier."""
    hvd.barrier()

