"""``DistributedTrainer``: a ``gluon.Trainer`` whose gradients are summed over the ranks by
accord's engine instead of a KVStore (Horovod's MXNet trainer).

``step(batch_size)`` with each rank's own batch size then updates with the average gradient
over every rank's samples: the trainer's scale is multiplied by
``gradient_predivide_factor / size``, gradients by ``1 / gradient_predivide_factor`` before the
sum. Gradients are submitted last layer first, each as soon as MXNet's backward has written it,
so the engine reduces (and fuses) them while backward is still running; ``step`` returns once
every reduced gradient is written. ``compression=Compression.fp16`` sends them as float16 (the
engine casts on the wire); a user's NDArray compressor is applied around the allreduce as in
Horovod (see :mod:`accord.mxnet.compression`).
"""
from __future__ import annotations

import warnings
from collections import OrderedDict
from typing import Any

from accord.comm.ops import ReduceOp
from accord.engine import NoneCompressor as WireUnchanged
from accord.engine import Op
from accord.errors import with_hint
from accord.frontend.process_sets import ProcessSet, global_process_set
from accord.mxnet.bridge import DenseStandIns, mx, write_view
from accord.mxnet.compression import Compression, engine_compressor
from accord.mxnet.mpi_ops import submit, wait_all
from accord.mxnet.optimizer import DistributedOptimizer


class DistributedTrainer(mx.gluon.Trainer):
    """The distributed trainer for data-parallel training.

    Args:
        params: the parameters to train (dict, ParameterDict or list).
        optimizer: an ``mx.optimizer.Optimizer`` or its name; a DistributedOptimizer is
            unwrapped (with a warning), as in Horovod.
        optimizer_params: the optimizer's arguments when ``optimizer`` is a name.
        compression: ``Compression.none`` (default), ``.fp16``, ``.bf16``, or a
            :class:`~accord.mxnet.compression.Compressor` of one's own (run on the NDArrays).
        gradient_predivide_factor: splits the averaging before and after the sum.
        prefix: prepended to the gradient names (two trainers in one program need different
            prefixes).
        num_groups: accepted for compatibility (the engine fuses gradients by itself).
        process_set: the ranks to average over.
    """

    def __init__(self, params: Any, optimizer: Any, optimizer_params: dict | None = None,
                 compression: Any = Compression.none, gradient_predivide_factor: float = 1.0,
                 prefix: str | None = None, num_groups: int = 0,
                 process_set: ProcessSet = global_process_set) -> None:
        if isinstance(optimizer, DistributedOptimizer):
            optimizer = optimizer._optimizer
            warnings.warn("DistributedTrainer does not take DistributedOptimizer as its optimizer. "
                          "We have unwrapped it for you.", stacklevel=2)
        if not isinstance(prefix, (str, type(None))):
            raise ValueError(with_hint(f"prefix must be a str or None, got {type(prefix).__name__}",
                                       "pass prefix='model_a.' (or leave it out)"))
        if isinstance(params, dict):
            params = OrderedDict(params)
        elif isinstance(params, (list, tuple)):
            # every rank must name a gradient after the same index
            params = sorted(params, key=lambda p: p.name)
        super().__init__(params, optimizer, optimizer_params=optimizer_params, kvstore=None)
        self._compression = compression
        self._engine_compression = engine_compressor(compression)
        self._process_set = process_set
        self._gradient_predivide_factor = float(gradient_predivide_factor)
        self._prefix = prefix or ""
        self._num_groups = int(num_groups)
        self._scale *= gradient_predivide_factor / process_set.size()

    def _allreduce_grads(self) -> None:
        if self._process_set.size() == 1 or not self._process_set.included():
            return
        handles, copies, compressed, sparse = [], [], [], DenseStandIns()
        # Backward writes the last layers' gradients first: submitting those first lets the
        # engine reduce them while MXNet is still computing the rest (write_view waits for
        # each gradient only).
        for i in reversed(range(len(self._params))):
            param = self._params[i]
            if param.grad_req == "null":
                continue
            grads = param.list_grad()
            for other in grads[1:]:  # several devices in this process: sum them first
                grads[0] += other
            # a row_sparse gradient is reduced in its dense form, and its rows beside it
            grad, rows = sparse.dense_with_rows(grads[0])
            if rows is not None:
                handles += submit(Op.ALLREDUCE, [write_view(rows)], f"{self._prefix}{i}.rows",
                                  self._process_set, in_place=True, reduce_op=ReduceOp.SUM)
            wire, wire_compression = grad, self._engine_compression
            if wire_compression is None:  # a user's compressor: on the NDArray, as Horovod does
                wire, ctx = self._compression.compress(grad)
                compressed.append((grad, wire, ctx))
                wire_compression = WireUnchanged
            handles += submit(Op.ALLREDUCE, [write_view(wire)], self._prefix + str(i),
                              self._process_set, in_place=True, reduce_op=ReduceOp.SUM,
                              prescale_factor=1.0 / self._gradient_predivide_factor,
                              compression=wire_compression)
            if len(grads) > 1:
                copies.append(grads)
        wait_all(handles)
        for grad, wire, ctx in compressed:
            result = self._compression.decompress(wire, ctx)
            if result is not grad:
                grad[:] = result
        sparse.write_back()
        for grads in copies:
            for other in grads[1:]:
                grads[0].copyto(other)
