"""Horovod's basics for accord.torch: ``init``/``shutdown``, the who-am-I queries, build flags and
the timeline, all from :mod:`accord.frontend` (shared with accord.mxnet).

What is torch's own is a pair of hooks around the shared ``init``/``shutdown``: every start and
stop forgets :mod:`accord.torch.gateway`'s integer handles (Horovod's ``_handle_map = {}``), and
a worker added to a running elastic job waits for its place before the engine starts. The
queries raise Horovod's ``ValueError('Horovod has not been initialized; use hvd.init().')``
before ``init()``.
"""
from __future__ import annotations

from accord.frontend import lifecycle
from accord.frontend.backend_flags import gloo_enabled, mpi_enabled, mpi_threads_supported
from accord.frontend.build_flags import ccl_built, cuda_built, ddl_built, gloo_built, mpi_built, nccl_built, rocm_built
from accord.frontend.lifecycle import init, shutdown
from accord.frontend.queries import (
    NOT_INITIALIZED,
    cross_rank,
    cross_size,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    rank,
    size,
)
from accord.frontend.timeline_control import start_timeline, stop_timeline
from accord.runtime import admission
from accord.torch import gateway

__all__ = ["NOT_INITIALIZED", "init", "shutdown", "is_initialized", "size", "rank", "local_size",
           "local_rank", "cross_size", "cross_rank", "is_homogeneous", "mpi_built", "mpi_enabled",
           "mpi_threads_supported", "gloo_built", "gloo_enabled", "nccl_built", "cuda_built",
           "rocm_built", "ddl_built", "ccl_built", "start_timeline", "stop_timeline"]


def _before_start() -> None:
    gateway.reset()
    admission.join_if_new()  # a worker added to a running elastic job: wait for its place


lifecycle.add_hooks(before_start=_before_start, after_shutdown=gateway.reset)
