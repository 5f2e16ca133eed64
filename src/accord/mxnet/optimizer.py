"""``DistributedOptimizer``: wraps an ``mx.optimizer.Optimizer`` so that every update first sums
the gradient over the ranks (Horovod's MXNet optimizer, for the Module API and custom loops).

As in Horovod, the wrapped optimizer's ``rescale_grad`` is multiplied by
``gradient_predivide_factor / size`` and gradients are scaled by ``1 / gradient_predivide_factor``
before the sum, so the update sees the average over the ranks. Unlike Horovod, public attributes
set on the wrapper (``rescale_grad``, ``param_dict``, ``lr``...) reach the wrapped optimizer:
``gluon.Trainer`` sets ``rescale_grad = scale / batch_size`` there every step, and Horovod's
wrapper keeps it to itself, so there the batch size is silently ignored.
"""
from __future__ import annotations

from typing import Any

from accord.comm.ops import ReduceOp
from accord.engine import Op
from accord.frontend.process_sets import ProcessSet, global_process_set
from accord.mxnet.bridge import DenseStandIns, mx, write_view
from accord.mxnet.mpi_ops import submit, wait_all


def sum_gradients(indices: list[Any], grads: list[Any], predivide: float, process_set: ProcessSet,
                  prefix: str = "") -> None:
    """Sum each gradient NDArray over the ranks in place (scaled by ``1 / predivide`` first),
    named after its index; the engine fuses them. Returns once every result is written. A
    row_sparse gradient is summed in its dense form and keeps every row some rank's gradient held."""
    handles, sparse = [], DenseStandIns()
    for index, grad in zip(indices, grads):
        values, rows = sparse.dense_with_rows(grad)
        handles += submit(Op.ALLREDUCE, [write_view(values)], f"{prefix}{index}",
                          process_set, in_place=True, reduce_op=ReduceOp.SUM,
                          prescale_factor=1.0 / predivide)
        if rows is not None:
            handles += submit(Op.ALLREDUCE, [write_view(rows)], f"{prefix}{index}.rows",
                              process_set, in_place=True, reduce_op=ReduceOp.SUM)
    wait_all(handles)
    sparse.write_back()


class DistributedOptimizer(mx.optimizer.Optimizer):
    """An optimizer whose updates use gradients summed over the ranks (see the module doc).

    Args:
        optimizer: the ``mx.optimizer.Optimizer`` to wrap.
        gradient_predivide_factor: gradients are divided by it before the sum, and the result
            by ``size / factor`` after it.
        num_groups: accepted for compatibility (the engine fuses gradients by itself).
        process_set: the ranks to average over.
    """

    _OWN = ("_optimizer", "_gradient_predivide_factor", "_num_groups", "_process_set")

    def __init__(self, optimizer: Any, gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                 process_set: ProcessSet = global_process_set) -> None:
        object.__setattr__(self, "_optimizer", optimizer)
        object.__setattr__(self, "_gradient_predivide_factor", float(gradient_predivide_factor))
        object.__setattr__(self, "_num_groups", int(num_groups))
        object.__setattr__(self, "_process_set", process_set)
        optimizer.rescale_grad *= gradient_predivide_factor / process_set.size()

    def __getattr__(self, item: str) -> Any:
        if item in DistributedOptimizer._OWN:
            raise AttributeError(item)
        return getattr(self._optimizer, item)

    def __setattr__(self, item: str, value: Any) -> None:
        if item in DistributedOptimizer._OWN:
            object.__setattr__(self, item, value)
        else:
            setattr(self._optimizer, item, value)

    def create_state(self, index: Any, weight: Any) -> Any:
        """The wrapped optimizer's ``create_state`` (no communication).

        Args:
            index: the weight's index (or name), as MXNet passes it.
            weight: the weight NDArray.

        Returns:
            The wrapped optimizer's state for that weight.
        """
        return self._optimizer.create_state(index, weight)

    def create_state_multi_precision(self, index: Any, weight: Any) -> Any:
        """The wrapped optimizer's ``create_state_multi_precision``, unchanged.

        Args:
            index: which weight, as in :meth:`create_state`.
            weight: the (possibly float16) weight.

        Returns:
            The state, float32 master weights included where the wrapped optimizer keeps them.
        """
        return self._optimizer.create_state_multi_precision(index, weight)

    def _do_allreduce(self, index: Any, grad: Any) -> None:
        if self._process_set.size() == 1 or not self._process_set.included():
            return
        indices = list(index) if isinstance(index, (list, tuple)) else [index]
        grads = list(grad) if isinstance(grad, (list, tuple)) else [grad]
        sum_gradients(indices, grads, self._gradient_predivide_factor, self._process_set)

    def update(self, index: Any, weight: Any, grad: Any, state: Any) -> None:
        """Sum ``grad`` over the process set (in place), then run the wrapped optimizer's update.

        Nothing is communicated on one rank, or on a rank outside the set.

        Args:
            index: the weight's index, or a list of them (one allreduce per gradient).
            weight: the weight(s), updated in place.
            grad: the gradient(s), overwritten with their sum over the ranks (each divided by
                ``gradient_predivide_factor`` first; the wrapped optimizer's ``rescale_grad``,
                multiplied by ``predivide / size`` at construction, makes it an average).
            state: what :meth:`create_state` returned.

        Raises:
            CollectiveError: the allreduce failed (also an MXNetError).
        """
        self._do_allreduce(index, grad)
        self._optimizer.update(index, weight, grad, state)

    def update_multi_precision(self, index: Any, weight: Any, grad: Any, state: Any) -> None:
        """:meth:`update` for mixed precision: the same allreduce, then the wrapped optimizer's
        ``update_multi_precision``.

        Args:
            index: the weight's index or indices.
            weight: float16 or float32 weight(s), updated in place.
            grad: the gradient(s), summed over the ranks in place first.
            state: from :meth:`create_state_multi_precision`.

        Raises:
            CollectiveError: the gradients' allreduce failed.
        """
        self._do_allreduce(index, grad)
        self._optimizer.update_multi_precision(index, weight, grad, state)

    def set_learning_rate(self, lr: float) -> None:
        """Set the wrapped optimizer's learning rate.

        Args:
            lr: the new learning rate.
        """
        self._optimizer.set_learning_rate(lr)

    def set_lr_mult(self, args_lr_mult: dict) -> None:
        """Set per-parameter learning-rate multipliers on the wrapped optimizer.

        Args:
            args_lr_mult: parameter name to multiplier.
        """
        self._optimizer.set_lr_mult(args_lr_mult)

    def set_wd_mult(self, args_wd_mult: dict) -> None:
        """Set per-parameter weight-decay multipliers on the wrapped optimizer.

        Args:
            args_wd_mult: a dict from parameter name to weight-decay multiplier.
        """
        self._optimizer.set_wd_mult(args_wd_mult)

