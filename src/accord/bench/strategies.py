"""How gradients are averaged in a measured run: the thing being compared.

- ``local``: one process, no communication (the 1-process reference for scaling efficiency).
- ``accord``: ``hvd.DistributedOptimizer`` (hooks submit each gradient to the engine as soon as
  autograd produces it; the engine fuses and allreduces; ``synchronize()`` waits), with
  optional fp16/bf16 compression. Under O2 it reduces the half model's gradients and a second,
  plain optimizer steps the float32 master weights.
- ``ddp``: ``torch.nn.parallel.DistributedDataParallel`` on the default Gloo (or NCCL) group.
- ``accord-ddp``: the same DDP on a process group of accord's torch.distributed backend
  (``dist.new_group(backend="accord")``), the path of ``init_process_group("accord")``.
- ``horovod-style``: what Horovod does without its engine: a hook per parameter launches an
  async ``torch.distributed.all_reduce`` of its gradient (no fusion), ``step`` waits for all
  and divides by the world size.

Every strategy broadcasts rank 0's initial weights (DDP does it in its constructor).
"""
from __future__ import annotations

import contextlib
from datetime import timedelta
from typing import Any, ContextManager, Iterator

import torch
import torch.distributed as dist
from torch import nn

from accord.bench.precision import Precision

KINDS = ("local", "accord", "accord-ddp", "ddp", "horovod-style")


def start_baseline_group(timeout_s: float = 300.0) -> bool:
    """Start torch.distributed's default group for the baselines (raw Gloo, DDP, the Horovod-style
    hooks), met on accord's store once accord runs: accord leaves the default group to the
    program. Gloo for CPU tensors, NCCL for CUDA ones where torch has it. Returns whether it
    started one (False: the program has one already)."""
    from accord import engine

    if dist.is_initialized():
        return False
    topology = engine.topology()
    backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"
    dist.init_process_group(backend, store=dist.PrefixStore("bench-baseline", engine.runtime().store),
                            rank=topology.rank, world_size=topology.size, timeout=timedelta(seconds=timeout_s))
    return True


def stop_baseline_group(started: bool) -> None:
    """Destroy the default group :func:`start_baseline_group` started (``started`` is its answer)."""
    from accord import group_teardown

    if started and dist.is_initialized():
        group_teardown.destroy_process_group()


@contextlib.contextmanager
def baseline_group(timeout_s: float = 300.0) -> Iterator[None]:
    """:func:`start_baseline_group` for the duration of a block."""
    started = start_baseline_group(timeout_s)
    try:
        yield
    finally:
        stop_baseline_group(started)


class Strategy:
    """A model ready to call, the optimizer that steps, and the gradient reduction."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model = model
        self.optimizer = optimizer

    def reduce(self) -> None:
        """Make every rank's gradients the average (after backward, before the step)."""

    def stepping(self) -> ContextManager[Any]:
        """Context around the optimizer step."""
        return contextlib.nullcontext()

    def close(self) -> None:
        """Remove hooks this strategy installed."""


def _sgd(params: Any, lr: float) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=lr, momentum=0.9)


class _Accord(Strategy):
    def __init__(self, model: nn.Module, precision: Precision, lr: float, compression: str) -> None:
        import accord.torch as hvd

        comp = {"none": hvd.Compression.none, "fp16": hvd.Compression.fp16,
                "bf16": hvd.Compression.bf16}[compression]
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        model = precision.prepare(model)
        if precision.level == "O2":
            # Reduce the half gradients (half the bytes, as apex O2 + DDP); step the masters.
            self._reducer = hvd.DistributedOptimizer(_sgd(model.parameters(), lr), compression=comp,
                                                     named_parameters=model.named_parameters())
            optimizer = _sgd(precision.optimizer_params(model), lr)
        else:
            self._reducer = optimizer = hvd.DistributedOptimizer(
                _sgd(model.parameters(), lr), compression=comp, named_parameters=model.named_parameters())
        super().__init__(model, optimizer)
        self._steps_with_reducer = optimizer is self._reducer

    def reduce(self) -> None:
        self._reducer.synchronize()

    def stepping(self) -> ContextManager[Any]:
        # Horovod's pattern for AMP: synchronize() explicitly, then step without a second sync.
        return self._reducer.skip_synchronize() if self._steps_with_reducer else contextlib.nullcontext()


class _HorovodStyle(Strategy):
    def __init__(self, model: nn.Module, precision: Precision, lr: float, size: int) -> None:
        with torch.no_grad():
            for t in [*model.parameters(), *model.buffers()]:
                dist.broadcast(t, src=0)
        model = precision.prepare(model)
        super().__init__(model, _sgd(precision.optimizer_params(model), lr))
        self._size = size
        self._works: list[Any] = []
        self._hooks = [p.register_post_accumulate_grad_hook(self._launch)
                       for p in model.parameters() if p.requires_grad]
        self._params = [p for p in model.parameters() if p.requires_grad]

    def _launch(self, p: torch.Tensor) -> None:
        self._works.append(dist.all_reduce(p.grad, async_op=True))

    def reduce(self) -> None:
        for work in self._works:
            work.wait()
        self._works.clear()
        grads = [p.grad for p in self._params if p.grad is not None]
        if grads:
            torch._foreach_div_(grads, float(self._size))

    def close(self) -> None:
        for hook in self._hooks:
            hook.remove()


def make_strategy(kind: str, model: nn.Module, precision: Precision, *, lr: float, size: int,
                  device: torch.device, compression: str = "none", group: Any = None) -> Strategy:
    """Wrap ``model`` (float32, on ``device``) for ``kind``; see the module docstring.

    Args:
        kind: one of :data:`KINDS`.
        model: the float32 model, on ``device``.
        precision: the AMP level and dtype.
        lr: the SGD learning rate.
        size: ranks that average gradients.
        device: where the model is.
        compression: accord's gradient compression (``accord`` only).
        group: the process group of ``accord-ddp`` (an accord-backend group; None: the default group).

    Returns:
        The strategy.

    Raises:
        ValueError: ``kind`` is unknown.
    """
    if kind == "local":
        model = precision.prepare(model)
        return Strategy(model, _sgd(precision.optimizer_params(model), lr))
    if kind == "accord":
        return _Accord(model, precision, lr, compression)
    if kind in ("ddp", "accord-ddp"):
        model = precision.prepare(model)
        ids = [device.index] if device.type == "cuda" else None
        ddp = nn.parallel.DistributedDataParallel(model, device_ids=ids,
                                                  process_group=group if kind == "accord-ddp" else None)
        return Strategy(ddp, _sgd(precision.optimizer_params(model), lr))
    if kind == "horovod-style":
        return _HorovodStyle(model, precision, lr, size)
    raise ValueError(f"unknown strategy {kind!r}; known: {KINDS}")
