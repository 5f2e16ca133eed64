"""accord.torch: Horovod's PyTorch API on accord's engine.

A Horovod script runs with one changed line::

    import accord.torch as hvd   # was: import horovod.torch as hvd

    hvd.init()
    model = Net()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size()),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)

Beyond Horovod: bfloat16 compression (``Compression.bf16``), Adasum on CPU without MPI,
SyncBatchNorm on CPU with ``comm_scope='local'``, every dtype torch has in allreduce, and
``torch.compile`` support: the collectives compile without graph breaks and
``allreduce_gradients`` reduces gradients in one fused call inside compiled code (see
:mod:`accord.torch.compiled`).
"""
from __future__ import annotations

from accord.comm.ops import ReduceOp
from accord.distributed.autoload import register as _register_process_group_backend
from accord.errors import CollectiveError as HorovodInternalError
from accord.torch import elastic  # noqa: E402  (hvd.elastic.run, TorchState, ElasticSampler)
from accord.torch.async_ops import (
                                    Adasum,
                                    Average,
                                    Max,
                                    Min,
                                    Product,
                                    Sum,
                                    allgather_async,
                                    allreduce_async,
                                    allreduce_async_,
                                    alltoall_async,
                                    barrier,
                                    broadcast_async,
                                    broadcast_async_,
                                    grouped_allgather_async,
                                    grouped_allreduce_async,
                                    grouped_allreduce_async_,
                                    grouped_reducescatter_async,
                                    join,
                                    reducescatter_async,
                                    sparse_allreduce_async,
)
from accord.torch.basics import (
                                    ccl_built,
                                    cross_rank,
                                    cross_size,
                                    cuda_built,
                                    ddl_built,
                                    gloo_built,
                                    gloo_enabled,
                                    init,
                                    is_homogeneous,
                                    is_initialized,
                                    local_rank,
                                    local_size,
                                    mpi_built,
                                    mpi_enabled,
                                    mpi_threads_supported,
                                    nccl_built,
                                    rank,
                                    rocm_built,
                                    shutdown,
                                    size,
                                    start_timeline,
                                    stop_timeline,
)

# The synchronous collectives come from ``compiled``: eager calls go straight to mpi_ops, and
# under torch.compile they become accord's custom ops (no graph break).
from accord.torch.compiled import (
                                    allgather,
                                    allreduce,
                                    allreduce_,
                                    allreduce_gradients,
                                    alltoall,
                                    broadcast,
                                    broadcast_,
                                    grouped_allreduce,
                                    grouped_allreduce_,
                                    reducescatter,
)
from accord.torch.compression import Compression, Compressor
from accord.torch.functions import allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters
from accord.torch.gateway import poll, synchronize
from accord.torch.mpi_ops import grouped_allgather, grouped_reducescatter
from accord.torch.optimizer import DistributedOptimizer
from accord.torch.process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from accord.torch.sync_batch_norm import SyncBatchNorm, convert_sync_batchnorm

__all__ = [
    "Adasum", "Average", "Compression", "Compressor", "DistributedOptimizer",
    "HorovodInternalError", "Max", "Min", "ProcessSet", "Product", "ReduceOp", "Sum",
    "SyncBatchNorm", "add_process_set", "allgather", "allgather_async", "allgather_object",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_gradients", "allreduce_async_", "alltoall",
    "alltoall_async", "barrier", "broadcast", "broadcast_", "broadcast_async",
    "broadcast_async_", "broadcast_object", "broadcast_optimizer_state", "broadcast_parameters",
    "ccl_built", "convert_sync_batchnorm", "cross_rank", "cross_size", "cuda_built",
    "ddl_built", "elastic", "global_process_set", "gloo_built", "gloo_enabled", "grouped_allgather",
    "grouped_allgather_async", "grouped_allreduce", "grouped_allreduce_",
    "grouped_allreduce_async", "grouped_allreduce_async_", "grouped_reducescatter",
    "grouped_reducescatter_async", "init", "is_homogeneous", "is_initialized", "join",
    "local_rank", "local_size", "mpi_built", "mpi_enabled", "mpi_threads_supported",
    "nccl_built", "poll", "rank", "reducescatter", "reducescatter_async", "remove_process_set",
    "rocm_built", "shutdown", "size", "sparse_allreduce_async", "start_timeline",
    "stop_timeline", "synchronize",
]

# The modules other accord packages may import: none, they use the package itself
# (tests/unit/test_import_graph.py checks every import that crosses a package boundary).
PUBLIC_MODULES: tuple[str, ...] = ()

# `import accord.torch as hvd` is enough for dist.init_process_group("accord") too.
_register_process_group_backend()
