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
import threading
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import torch

from accord.comm.ops import ReduceOp
from accord.engine.compression import Compressor, NoneCompressor
from accord.engine.engine import Engine
from accord.engine.naming import RequestNamer
from accord.engine.request import Handle, Op, build_request
from accord.engine.sets import GLOBAL_ID, PRIVATE_IDS, ProcessSetRegistry
from accord.engine.settings import EngineSettings
from accord.engine.startup import GroupContexts, set_cpu_communicator, set_key
from accord.errors import with_hint
from accord.runtime.bootstrap import GivenGroup
from accord.runtime.topology import Topology


@dataclass
class _Session:
    runtime: Any
    engine: Engine
    sets: ProcessSetRegistry
    backends: dict[str, Any]  # device type -> Backend
    contexts: GroupContexts  # where the members of each new set's communicators meet
    adhoc: int = 0  # communicators built by build_communicator so far
    names: RequestNamer = field(default_factory=RequestNamer)
    wire_buffers: dict[str, torch.Tensor] = field(default_factory=dict)  # see build_request


_session: _Session | None = None
_lock = threading.RLock()


def init(process_sets: Sequence[Sequence[int]] | None = None,
         settings: EngineSettings | None = None, given: GivenGroup | None = None,
         overrides: Mapping[str, Any] | None = None) -> list[int]:
    """Join the job and start the engine; a no-op if already initialized.

    Args:
        process_sets: rank lists to register now (ids 1, 2, ... in this order).
        settings: engine settings (default: read from accord.config).
        given: the group torch.distributed formed (its store, this rank, the world size), when
            ``init_process_group("accord")`` starts accord (see :mod:`accord.runtime.bootstrap`).
        overrides: engine settings that win over accord.config's (when ``settings`` is None),
            e.g. the timeout ``init_process_group`` was given.
    Returns:
        The ids of ``process_sets``.
    Raises:
        RendezvousError: the ranks could not meet. BackendError: a backend is unavailable.
    """
    global _session
    with _lock:
        if _session is not None:
            return [_session.sets.find(sorted(r)) for r in process_sets or []]
        from accord.engine.startup import build_engine
        from accord.runtime.bootstrap import bootstrap

        runtime = bootstrap(given=given)
        try:
            backends, sets, engine, contexts = build_engine(runtime.topology, runtime.store, settings, overrides)
            session = _Session(runtime, engine, sets, backends, contexts)
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
            session.sets.close_all()
            session.sets.clear()
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


def communicator(set_id: int = GLOBAL_ID, device: str = "cpu") -> Any:
    """This rank's communicator for a process set on a device kind (None when not a member).

    Which communicator the engine chose (flat, hierarchical, shared memory, MPI) is visible here,
    for reports and tests.
    """
    return _current().sets.communicator(set_id, device)


def backend_name(device_type: str = "cpu") -> str:
    """The backend the engine uses for ``device_type`` tensors (``auto`` resolved at init).

    Raises:
        ValueError: not initialized. KeyError: no backend for that device type.
    """
    return str(_current().backends[device_type].name)


def _add(session: _Session, ranks: Sequence[int]) -> int:
    ranks = session.sets.check_new(int(r) for r in ranks)  # equal on every rank
    set_id = session.sets.next_id
    comms = _communicators(session, set_id, ranks)
    added = session.sets.add(ranks, comms)
    assert added == set_id
    session.engine.open_set(set_id)  # its members start the set's controller (once started)
    return set_id


def _communicators(session: _Session, set_id: int, ranks: Sequence[int],
                   timeout: float | None = None) -> dict[str, Any]:
    """The set's communicator per device kind, built by its members (None elsewhere)."""
    if session.runtime.topology.rank not in ranks:
        return {d: None for d in session.backends}
    comms = {}
    for d, b in session.backends.items():
        context = session.contexts.make(ranks, set_key(set_id, d), timeout)
        comms[d] = b.create(context)
        if d == "cpu":  # across hosts, host-first as the global set's (when that is on or automatic)
            comms[d] = set_cpu_communicator(session.runtime.topology, ranks, comms[d], session.engine.settings,
                                            context)
    return comms


def build_communicator(backend: Any, ranks: Sequence[int]) -> Any:
    """A communicator of ``backend`` over ``ranks`` outside any process set, for benchmarks and
    tests that drive a backend directly. Every rank calls it, in the same order (the order is the
    members' key); non-members get None. The caller closes it.
    """
    with _lock:
        session = _current()
        session.adhoc += 1
        members = tuple(sorted(int(r) for r in ranks))
        if session.runtime.topology.rank not in members:
            return None
        return backend.create(session.contexts.make(members, f"adhoc{session.adhoc}"))


def add_private_process_set(ranks: Sequence[int], name: str, timeout: float | None = None) -> int:
    """Register a process set that only its members create and know, as torch.distributed's
    ``new_group`` does (the accord process group's sub-groups); return its id.

    Args:
        ranks: the members' global ranks (this rank among them).
        name: a name the members share and no other private set of this job has (torch's group
            name).
        timeout: seconds a collective of the set may take (default ACCORD_COLLECTIVE_TIMEOUT).
    Raises:
        ValueError: ranks invalid, or this rank is not among them.
        BackendError: a member did not take part in time.
    """
    with _lock:
        session = _current()
        ranks = tuple(sorted(int(r) for r in ranks))
        me = session.runtime.topology.rank
        if me not in ranks:
            raise ValueError(with_hint(f"rank {me} registers private process set {name!r} over {list(ranks)}",
                                       "only the members of a private set register it"))
        set_id = _private_id(session, ranks, name, timeout)
        comms = _communicators(session, set_id, ranks, timeout)
        session.sets.add_private(set_id, ranks, comms)
        session.engine.open_set(set_id)
        return set_id


def _private_id(session: _Session, ranks: tuple[int, ...], name: str, timeout: float | None) -> int:
    """An id for a private set that its members agree on: the first member draws it from a
    counter of the job's store and publishes it under the set's name."""
    context = session.contexts.make(ranks, f"private/{name}", timeout)
    drawn = None
    if context.index == 0:
        drawn = str(PRIVATE_IDS + int(session.runtime.store.add("accord/private-sets", 1))).encode()
    return int(context.broadcast_bytes("id", drawn, 0))


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
        ranks = session.sets.get(set_id)  # ValueError for unknown ids
        if set_id == GLOBAL_ID:
            session.sets.remove(set_id)  # raises: the global set stays
        busy = session.engine.inflight_names(set_id)
        if busy:
            raise ValueError(with_hint(
                f"process set {set_id} {list(ranks)} still has requests in flight: {busy[:5]}",
                "synchronize their handles before removing the process set"))
        # Stop the set's controller first (negotiated with the set's members), so that no
        # thread uses the communicators below any more.
        session.engine.close_set(set_id)
        # Release the set's groups now (NCCL communicators hold GPU memory; a job that adds and
        # removes sets would leak it). A barrier first: this rank has nothing in flight on the
        # set, but a peer may still be finishing its part of the last collective.
        for comm in session.sets.remove(set_id):
            comm.barrier()
            close = getattr(comm, "close", None)
            if close is not None:
                close()


def process_sets() -> dict[int, tuple[int, ...]]:
    """Every registered process set: id -> global ranks (0 = every rank)."""
    return _current().sets.snapshot()


def process_set_members(set_id: int) -> tuple[int, ...]:
    """Global ranks of a registered set. Raises ValueError (with a HINT) for an unknown id."""
    return _current().sets.get(set_id)


def find_process_set(ranks: Sequence[int]) -> int | None:
    """Id of the registered set with exactly ``ranks`` (in any order), or None."""
    return _current().sets.find(sorted(ranks))


def submit(op: Op | str, tensor: torch.Tensor | None, name: str | None = None, *,
           in_place: bool = False, compression: type[Compressor] | Compressor = NoneCompressor,
           reduce_op: ReduceOp = ReduceOp.SUM, root_rank: int = -1, prescale_factor: float = 1.0,
           postscale_factor: float = 1.0, process_set_id: int = GLOBAL_ID,
           splits: Sequence[int] | None = None, output: torch.Tensor | None = None) -> Handle:
    """Submit one collective to the engine and return its handle (see :func:`synchronize`).

    ``name`` matches the request across ranks; without one, ``"<op>.noname.<n>"`` is used, which
    only matches if every rank makes its unnamed calls in the same order (as in Horovod); names
    in a non-global set get ``@ps<id>`` (:mod:`accord.engine.naming`).
    ``root_rank`` is a global rank. ``splits`` gives rows per rank for alltoall / scatter.
    ``output`` (allgather, reducescatter): the tensor the result is written into and returned
    as (see :func:`~accord.engine.request.build_request`; the frontends check it first).

    Results: allreduce, broadcast, allgather, reducescatter -> tensor; alltoall -> (tensor,
    received splits); reduce, gather -> tensor on the root, None elsewhere; scatter -> this
    rank's rows (non-root ranks pass any tensor with the root's dtype and shape after dim 0,
    e.g. ``torch.empty(0, *trailing)``); barrier -> None.
    """
    return submit_group(op, [tensor], name, in_place=in_place, compression=compression,
                        reduce_op=reduce_op, root_rank=root_rank, prescale_factor=prescale_factor,
                        postscale_factor=postscale_factor, process_set_id=process_set_id,
                        splits=splits, grouped=False, outputs=None if output is None else [output])[0]


def submit_group(op: Op | str, tensors: Sequence[torch.Tensor | None], name: str | None = None, *,
                 in_place: bool = False, compression: type[Compressor] | Compressor = NoneCompressor,
                 reduce_op: ReduceOp = ReduceOp.SUM, root_rank: int = -1,
                 prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                 process_set_id: int = GLOBAL_ID, splits: Sequence[int] | None = None,
                 grouped: bool = True, waited: bool = False,
                 problems: Sequence[str] | None = None,
                 outputs: Sequence[torch.Tensor | None] | None = None) -> list[Handle]:
    """Submit one collective per tensor as one group, all or none: if one request is refused
    (invalid, or its name in flight), none is queued. The requests are named
    ``<name>_<i>of<n>`` (``name`` defaulting to ``"<op>.noname.<n>"``, see
    :mod:`accord.engine.naming`); with ``grouped=False`` and one tensor, as :func:`submit`
    names it. ``waited``: the caller synchronizes the handles at once (a synchronous call).
    ``problems``: per tensor, what the frontend refuses in this rank's arguments ("" where
    nothing): those requests are queued all the same and fail on every rank of the set
    (:attr:`~accord.engine.request.Request.problem`). ``outputs`` (allgather, reducescatter):
    per tensor, the tensor its result is written into (None: a new one; see
    :func:`~accord.engine.request.build_request`). Returns one handle per tensor, in order.
    """
    session = _current()
    op = Op(op)
    recurs = name is not None  # unnamed requests never recur: no wire buffer kept for them
    group = None
    if grouped:
        key, names = session.names.keyed_group(op.value, name, len(tensors), process_set_id)
        group = (key, len(tensors))
    else:
        names = [session.names.name(op.value, name, process_set_id)]
    requests = []
    for i, (tensor, request_name) in enumerate(zip(tensors, names)):
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
            wire_buffers=wire_buffers, group=group, problem=problems[i] if problems else "",
            output=outputs[i] if outputs else None))
    return session.engine.enqueue_many(requests, waited)


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
