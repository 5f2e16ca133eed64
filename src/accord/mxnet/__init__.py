"""accord.mxnet: Horovod's (and Perseus's) MXNet API on accord's engine, and an MXNet KVStore.

Horovod and Perseus MXNet scripts run with one changed line::

    import accord.mxnet as hvd   # was: import horovod.mxnet as hvd / import perseus.mxnet as hvd

    hvd.init()
    net = get_model(); net.initialize(ctx=ctx)
    params = net.collect_params()
    hvd.broadcast_parameters(params, root_rank=0)
    trainer = hvd.DistributedTrainer(params, "sgd", {"learning_rate": 0.1 * hvd.size()})

Importing it also registers the KVStore types ``'accord'`` and ``'dist_sync_perseus'``
(``gluon.Trainer(params, 'sgd', kvstore='accord')``, ``mx.kv.create('accord')``,
``hvd.create('dist_sync_perseus')``), see :mod:`accord.mxnet.kvstore`, and provides Gluon's
:class:`SyncBatchNorm` with Perseus's ``comm_scope``.

It needs MXNet 1.9.1 (``pip install 'accord[mxnet]'``); without it the import fails with an
ImportError that says so.
"""
from __future__ import annotations

from accord.mxnet.bridge import require_mxnet

require_mxnet()

from accord.errors import CollectiveError as HorovodInternalError  # noqa: E402
from accord.frontend.backend_flags import gloo_enabled, mpi_enabled, mpi_threads_supported  # noqa: E402
from accord.frontend.build_flags import ccl_built, cuda_built, ddl_built, gloo_built, mpi_built, nccl_built, rocm_built  # noqa: E402
from accord.frontend.lifecycle import init, shutdown  # noqa: E402
from accord.frontend.process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set  # noqa: E402
from accord.frontend.queries import (  # noqa: E402
                                     cross_rank,
                                     cross_size,
                                     is_homogeneous,
                                     is_initialized,
                                     local_rank,
                                     local_size,
                                     rank,
                                     size,
)
from accord.frontend.timeline_control import start_timeline, stop_timeline  # noqa: E402
from accord.mxnet.compression import Compression, Compressor  # noqa: E402
from accord.mxnet.functions import allgather_object, broadcast_object, broadcast_parameters  # noqa: E402
from accord.mxnet.kvstore import AccordKVStore, create  # noqa: E402
from accord.mxnet.mpi_ops import (  # noqa: E402
                                     Adasum,
                                     Average,
                                     Max,
                                     Min,
                                     Product,
                                     Sum,
                                     allgather,
                                     allreduce,
                                     allreduce_,
                                     alltoall,
                                     broadcast,
                                     broadcast_,
                                     grouped_allgather,
                                     grouped_allreduce,
                                     grouped_allreduce_,
                                     grouped_reducescatter,
                                     reducescatter,
)
from accord.mxnet.optimizer import DistributedOptimizer  # noqa: E402
from accord.mxnet.sync_batch_norm import PerseusSyncBatchNorm, SyncBatchNorm  # noqa: E402
from accord.mxnet.trainer import DistributedTrainer  # noqa: E402

__all__ = [
    "AccordKVStore", "Adasum", "Average", "Compression", "Compressor", "DistributedOptimizer",
    "DistributedTrainer", "HorovodInternalError", "Max", "Min", "PerseusSyncBatchNorm",
    "ProcessSet", "Product", "Sum", "SyncBatchNorm", "add_process_set", "allgather",
    "allgather_object", "allreduce", "allreduce_", "alltoall", "broadcast", "broadcast_",
    "broadcast_object", "broadcast_parameters", "ccl_built", "create", "cross_rank", "cross_size",
    "cuda_built", "ddl_built", "global_process_set", "gloo_built", "gloo_enabled",
    "grouped_allgather", "grouped_allreduce", "grouped_allreduce_", "grouped_reducescatter", "init",
    "is_homogeneous", "is_initialized", "local_rank", "local_size", "mpi_built", "mpi_enabled",
    "mpi_threads_supported", "nccl_built", "rank", "reducescatter", "remove_process_set",
    "rocm_built", "shutdown", "size", "start_timeline", "stop_timeline",
]

# The modules other accord packages may import: none, they use the package itself
# (tests/unit/test_import_graph.py checks every import that crosses a package boundary).
PUBLIC_MODULES: tuple[str, ...] = ()
