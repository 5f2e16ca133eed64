"""The frontend-neutral session: init / shutdown, process sets, and submitting collectives.

``accord.torch`` (Horovod's API) and ``accord.kvstore`` wrap these functions. ``init()`` meets
the other ranks (:func:`accord.runtime.bootstrap.bootstrap`), creates one communicator per
device kind for every process set (Gloo for CPU tensors, NCCL for CUDA ones, or what
ACCORD_CPU_BACKEND / ACCORD_GPU_BACKEND name; the CPU default ``auto`` means shared memory when
every rank runs on one host) and starts the engine; ``shutdown()`` stops the
engine on every rank and leaves the job, after which ``init()`` works again.

Process sets, as in Horovod, are collective: every rank calls :func:`add_process_set` and
:func:`remove_process_set` with the same arguments in the same order, so ids agree.
"""
from __future__ import annotations

import atexit
import gc
import itertools
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from accord.comm.ops import ReduceOp
from accord.engine.compression import Compressor, NoneCompressor
from accord.engine.engine import Engine
from accord.engine.request import Handle, Op, build_request
from accord.engine.sets import ProcessSetRegistry
from accord.engine.settings import EngineSettings
from accord.errors import ConfigError, with_hint
from accord.runtime.groups import GLOBAL_ID, ProcessSetTable
from accord.runtime.topology import Topology


log = logging.getLogger("accord.engine")


@dataclass
class _Session:
    runtime: Any
    engine: Engine
    table: ProcessSetTable
    registry: ProcessSetRegistry
    backends: dict[str, Any]  # device type -> Backend
    unnamed: dict[str, itertools.count] = field(default_factory=dict)
    wire_buffers: dict[str, torch.Tensor] = field(default_factory=dict)  # see build_request


_session: _Session | None = None
_lock = threading.RLock()


def _devices() -> list[str]:
    return ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]


def init(process_sets: Sequence[Sequence[int]] | None = None,
         settings: EngineSettings | None = None) -> list[int]:
    """Join the job and start the engine; a no-op if already initialized.

    Args:
        process_sets: rank lists to register now (ids 1, 2, ... in this order).
        settings: engine settings (default: read from accord.config).
    Returns:
        The ids of ``process_sets``.
    Raises:
        RendezvousError: the ranks could not meet. BackendError: a backend is unavailable.
    """
    global _session
    with _lock:
        if _session is not None:
            return [_session.table.find(sorted(r)) for r in process_sets or []]
        from accord.comm import backend_name_for
        from accord.comm.backend import get_backend
        from accord.runtime.bootstrap import bootstrap

        runtime = bootstrap()
        try:
            size = runtime.topology.size
            single_host = size > 1 and len(set(runtime.topology.hostnames)) == 1
            backends = {d: get_backend(backend_name_for(d, single_host)) for d in _devices()}
            _check_devices(backends)
            registry = ProcessSetRegistry()
            comms = {d: b.create(list(range(size))) for d, b in backends.items()}
            registry.add(GLOBAL_ID, range(size), comms)
            settings = settings or EngineSettings.from_config(cpu_backend=backends["cpu"].name)
            _check_settings_agree(settings, comms["cpu"])
            if (settings.hierarchical_allreduce or settings.hierarchical_auto) and size > 1:
                registry.set_communicator(GLOBAL_ID, "cpu", _hierarchical(runtime.topology, comms["cpu"], settings))
            # The engine negotiates on the global CPU communicator: its own process group, not
            # the default one, so collectives a frontend runs directly never interleave with it.
            engine = Engine(runtime.topology.rank, size, comms["cpu"], registry, settings)
            session = _Session(runtime, engine, ProcessSetTable(size), registry, backends)
            ids = [_add(session, ranks) for ranks in process_sets or []]
            engine.start()
        except BaseException:
            runtime.close()
            raise
        _session = session
        # atexit runs last-registered first: registering after bootstrap() makes the engine
        # stop before the runtime destroys its process groups. The other order aborts the
        # process ("terminate called without an active exception") when a script exits
        # without calling shutdown(), as Horovod scripts often do.
        atexit.register(shutdown)
        return ids


def _check_devices(backends: dict[str, Any]) -> None:
    """Refuse a backend named for tensors it cannot move (e.g. ACCORD_CPU_BACKEND=nccl)."""
    for device, backend in backends.items():
        kinds = getattr(backend, "device_types", None)
        if kinds is not None and device not in kinds:
            variable = "ACCORD_CPU_BACKEND" if device == "cpu" else "ACCORD_GPU_BACKEND"
            raise ConfigError(with_hint(
                f"{variable} names backend {backend.name!r}, which moves {', '.join(sorted(kinds))} "
                f"tensors, not {device} ones",
                "use gloo, shm or mpi for CPU tensors and nccl for CUDA tensors"))


def _hierarchical(topology: Topology, flat: Any, settings: EngineSettings) -> Any:
    """The global CPU communicator under ACCORD_HIERARCHICAL_ALLREDUCE (forced, or chosen
    automatically when unset): allreduce within each host (the one-host CPU backend, shm by
    default), then across hosts (the multi-host one, gloo by default). ``flat`` when the layout
    does not allow it (logged once, on rank 0, when forced) or, automatically, does not gain."""
    from accord.comm import backend_name_for
    from accord.comm.backend import get_backend
    from accord.comm.hierarchical import HierarchicalCommunicator, auto_hierarchy, hierarchy_problem
    from accord.runtime.groups import cross_sets, local_sets

    hosts = local_sets(topology)
    auto = not settings.hierarchical_allreduce
    problem = auto_hierarchy(hosts, flat.backend_name) if auto else hierarchy_problem(hosts)
    if problem is not None:
        if topology.rank == 0 and not auto:
            log.warning("ACCORD_HIERARCHICAL_ALLREDUCE is set, but allreduce stays flat: %s", problem)
        return flat
    # create() is collective over every rank: all ranks create every host's and every local
    # rank's communicator, in the same order, and keep the one they belong to.
    local_backend = get_backend(backend_name_for("cpu", single_host=True))
    local = [c for c in (local_backend.create(r) for r in hosts) if c is not None]
    cross_backend = get_backend(backend_name_for("cpu", single_host=False))
    cross = [c for c in (cross_backend.create(r) for r in cross_sets(topology)) if c is not None]
    if auto and topology.rank == 0:
        log.info("allreduce may be hierarchical (%d hosts x %d ranks, from %d bytes, if faster on "
                 "the first ones); HOROVOD_HIERARCHICAL_ALLREDUCE=0|1 decides instead", len(hosts),
                 len(hosts[0]), settings.hierarchical_min_bytes)
    return HierarchicalCommunicator(flat, local[0], cross[0],
                                    min_bytes=settings.hierarchical_min_bytes if auto else 0, measure=auto)


def _check_settings_agree(settings: EngineSettings, comm: Any) -> None:
    """Every rank must fuse and time out stalls alike, or their collectives would not line up."""
    fields = ("fusion_threshold", "cache_capacity", "stall_check_disable", "stall_check_time",
              "stall_shutdown_time", "hierarchical_allreduce", "hierarchical_auto")
    mine = torch.tensor([float(getattr(settings, f)) for f in fields], dtype=torch.float64)
    table = comm.allgather(mine.unsqueeze(0)).tolist()
    for j, name in enumerate(fields):
        values = [row[j] for row in table]
        if len(set(values)) > 1:
            seen = ", ".join(f"rank {r} has {v:g}" for r, v in enumerate(values))
            raise ConfigError(with_hint(f"engine setting {name} differs between ranks: {seen}",
                                        "give every rank the same ACCORD_* engine variables "
                                        "(accordrun passes the launcher's environment to all)"))


def shutdown() -> None:
    """Stop the engine on every rank (pending requests fail with ShutdownError) and leave the
    job. Idempotent; ``init()`` may be called again afterwards."""
    global _session
    with _lock:
        session, _session = _session, None
    if session is not None:
        atexit.unregister(shutdown)
        try:
            session.engine.shutdown()
        finally:
            # Release the communicators' process groups now, while the interpreter is whole:
            # left to interpreter teardown, their C++ threads can abort the process at exit.
            session.registry.clear()
            session.backends.clear()
            session.runtime.close()
            del session
            gc.collect()


def is_initialized() -> bool:
    """True between ``init()`` and ``shutdown()``."""
    return _session is not None


def _current() -> _Session:
    session = _session
    if session is None:
        raise ValueError(with_hint("accord has not been initialized", "call init() first (hvd.init())"))
    return session


def topology() -> Topology:
    """This rank's place in the job (rank, size, local and cross coordinates)."""
    return _current().runtime.topology


def runtime() -> Any:
    """The :class:`accord.runtime.bootstrap.Runtime` of this session (store, secret, ...)."""
    return _current().runtime


def engine() -> Engine:
    """The running engine."""
    return _current().engine


def backend_name(device_type: str = "cpu") -> str:
    """The backend the engine uses for ``device_type`` tensors (``auto`` resolved at init).

    Raises:
        ValueError: not initialized. KeyError: no backend for that device type.
    """
    return str(_current().backends[device_type].name)


def _add(session: _Session, ranks: Sequence[int]) -> int:
    ranks = [int(r) for r in ranks]
    set_id = session.table.add(ranks)  # validates; equal on every rank
    comms = {d: b.create(ranks) for d, b in session.backends.items()}  # collective on all ranks
    session.registry.add(set_id, ranks, comms)
    return set_id


def add_process_set(ranks: Sequence[int]) -> int:
    """Register a process set on every rank (collective); return its id.

    Raises:
        ValueError: ranks invalid, or the same set is already registered.
    """
    with _lock:
        return _add(_current(), ranks)


def remove_process_set(set_id: int) -> None:
    """Unregister a process set on every rank (collective).

    Raises:
        ValueError: id 0, an unknown id, or this rank still has requests in flight on it.
    """
    with _lock:
        session = _current()
        ranks = session.table.get(set_id)  # ValueError for unknown ids
        busy = session.engine.inflight_names(set_id)
        if busy:
            raise ValueError(with_hint(
                f"process set {set_id} {list(ranks)} still has requests in flight: {busy[:5]}",
                "synchronize their handles before removing the process set"))
        session.table.remove(set_id)
        # Release the set's groups now (NCCL communicators hold GPU memory; a job that adds and
        # removes sets would leak it). A barrier first: this rank has nothing in flight on the
        # set, but a peer may still be finishing its part of the last collective.
        for comm in session.registry.remove(set_id):
            comm.barrier()
            close = getattr(comm, "close", None)
            if close is not None:
                close()


def process_sets() -> dict[int, tuple[int, ...]]:
    """Every registered process set: id -> global ranks (0 = every rank)."""
    table = _current().table
    return {i: table.get(i) for i in table.ids()}


def submit(op: Op | str, tensor: torch.Tensor | None, name: str | None = None, *,
           in_place: bool = False, compression: type[Compressor] | Compressor = NoneCompressor,
           reduce_op: ReduceOp = ReduceOp.SUM, root_rank: int = -1, prescale_factor: float = 1.0,
           postscale_factor: float = 1.0, process_set_id: int = GLOBAL_ID,
           splits: Sequence[int] | None = None) -> Handle:
    """Submit one collective to the engine and return its handle (see :func:`synchronize`).

    ``name`` matches the request across ranks; without one, ``"<op>.noname.<n>"`` is used, which
    only matches if every rank makes its unnamed calls in the same order (as in Horovod).
    ``root_rank`` is a global rank. ``splits`` gives rows per rank for alltoall / scatter.

    Results: allreduce, broadcast, allgather, reducescatter -> tensor; alltoall -> (tensor,
    received splits); reduce, gather -> tensor on the root, None elsewhere; scatter -> this
    rank's rows (non-root ranks pass any tensor with the root's dtype and shape after dim 0,
    e.g. ``torch.empty(0, *trailing)``); barrier -> None.
    """
    return submit_group(op, [tensor], name, in_place=in_place, compression=compression,
                        reduce_op=reduce_op, root_rank=root_rank, prescale_factor=prescale_factor,
                        postscale_factor=postscale_factor, process_set_id=process_set_id,
                        splits=splits, grouped=False)[0]


def submit_group(op: Op | str, tensors: Sequence[torch.Tensor | None], name: str | None = None, *,
                 in_place: bool = False, compression: type[Compressor] | Compressor = NoneCompressor,
                 reduce_op: ReduceOp = ReduceOp.SUM, root_rank: int = -1,
                 prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                 process_set_id: int = GLOBAL_ID, splits: Sequence[int] | None = None,
                 grouped: bool = True) -> list[Handle]:
    """Submit one collective per tensor as one group, all or none: if one request is refused
    (invalid, or its name in flight), none is queued. The requests are named
    ``<name>_<i>of<n>`` (``name`` defaulting to ``"<op>.noname.<n>"``); with ``grouped=False``
    and one tensor, ``name`` itself. Returns one handle per tensor, in order.
    """
    session = _current()
    op = Op(op)
    recurs = name is not None  # unnamed requests never recur: no wire buffer kept for them
    if name is None:
        counter = session.unnamed.setdefault(op.value, itertools.count())
        name = f"{op.value}.noname.{next(counter)}"
    names = [name] if not grouped else [f"{name}_{i + 1}of{len(tensors)}" for i in range(len(tensors))]
    requests = []
    for tensor, request_name in zip(tensors, names):
        wire_buffers = None
        if recurs and compression is not NoneCompressor and not session.engine.in_flight(request_name):
            # Named requests recur (gradients, every step): their compressed copies reuse one
            # buffer. A name in flight is refused by enqueue below: its buffer is still on the
            # wire and must not be overwritten first.
            wire_buffers = session.wire_buffers
        requests.append(build_request(
            op, tensor, request_name, in_place=in_place, compression=compression,
            reduce_op=reduce_op, root_rank=root_rank, prescale_factor=prescale_factor,
            postscale_factor=postscale_factor, process_set_id=process_set_id, splits=splits,
            wire_buffers=wire_buffers))
    return session.engine.enqueue_many(requests)


def poll(handle: Handle) -> bool:
    """True when the request behind ``handle`` has finished (if not, the engine starts the cycle
    it is gathering now: the caller is waiting)."""
    session = _session
    return handle.done() if session is None else session.engine.poll(handle)


def synchronize(handle: Handle) -> Any:
    """Wait for ``handle``; return its result or raise the error the engine reported."""
    session = _session
    if session is None:
        handle.wait()
        return handle.result()
    return session.engine.synchronize(handle)


def start_timeline(path: str, mark_cycles: bool = False) -> None:
    """Start writing a chrome://tracing timeline to ``path`` (on rank 0)."""
    _current().engine.start_timeline(path, mark_cycles)


def stop_timeline() -> None:
    """Finish the timeline file (valid JSON afterwards)."""
    _current().engine.stop_timeline()
