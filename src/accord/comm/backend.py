"""The Backend and Communicator interfaces, and the backend registry.

A *backend* (gloo, nccl, mpi, a vendor library) turns a list of global ranks into a
:class:`Communicator`: an object that runs collectives among exactly those ranks. The engine
and the frontends only ever talk to communicators, so a new library plugs in by subclassing
:class:`Backend` and registering a factory: ``register_backend("cncl", CnclBackend)``. Both are
abstract base classes: a class that lacks one of their methods cannot be instantiated, so a
backend missing a method fails when it is built, not when that method is first called.

Conventions every communicator follows (tests hold each backend to them):
- Tensors are torch tensors on a device the backend supports; reductions run in place.
- ``root`` arguments are ranks *within the communicator* (0 .. size-1).
- Every op in :class:`~accord.comm.ops.ReduceOp` except ADASUM works on every backend;
  what a library lacks is emulated (e.g. AVERAGE = SUM then divide, PRODUCT via gather).
- Collectives are blocking from the caller's point of view.
- ``allgather`` and ``reduce_scatter`` write into a caller-given ``out`` when one is passed (a
  library that cannot write there copies into it), so a caller that keeps its result buffers
  needs no fresh result tensor per call.
"""
from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from typing import Callable, Protocol, Sequence, runtime_checkable

from accord.comm.groups import GroupContext
from accord.comm.ops import ReduceOp
from accord.errors import BackendError, with_hint
from accord.registry import Registry


class Communicator(ABC):
    """Collectives among one fixed, ordered set of global ranks."""

    ranks: tuple[int, ...]  # global ranks, in communicator-rank order
    rank: int  # this process's index in ``ranks``
    size: int

    @abstractmethod
    def allreduce(self, tensor, op: ReduceOp) -> None:
        """Reduce ``tensor`` across ranks in place."""

    @abstractmethod
    def broadcast(self, tensor, root: int) -> None:
        """Overwrite ``tensor`` with root's, in place."""

    @abstractmethod
    def allgather(self, tensor, out=None):
        """Concatenate every rank's tensor along dim 0; first dims may differ.

        ``out`` (optional): a contiguous tensor of the input's dtype and device, shaped [total
        rows, *trailing dims], that receives the result and is returned; without it the result
        is a new tensor. An unusable ``out`` raises ValueError on every rank.
        """

    @abstractmethod
    def gather(self, tensor, root: int):
        """Like allgather, but only ``root`` gets the result (others get None)."""

    @abstractmethod
    def scatter(self, chunks, root: int):
        """Root passes one tensor per rank (dim 0 may differ, the rest must match); each rank gets its own.

        Non-root ranks pass None: root announces dtype and shapes.
        """

    @abstractmethod
    def reduce(self, tensor, op: ReduceOp, root: int) -> None:
        """Reduce into root's ``tensor`` in place; other ranks' tensors are left unspecified."""

    @abstractmethod
    def reduce_scatter(self, tensor, op: ReduceOp, out=None):
        """Reduce, then split dim 0 across ranks (lower ranks get the extra rows).

        ``out`` (optional): a contiguous tensor of the input's dtype and device, shaped like this
        rank's rows, that receives them and is returned (may not overlap the input); without it
        the result is a new tensor. An unusable ``out`` raises ValueError before any data moves
        on the ranks that passed it, so every rank must pass one alike (the engine checks this
        across ranks before it calls).
        """

    @abstractmethod
    def alltoall(self, tensor, splits: Sequence[int] | None):
        """Send ``splits[i]`` rows to rank i (even split when None); return (output, received_splits).

        ``received_splits`` is a CPU int64 tensor: rows received from each rank, in rank order.
        Splits are not checked before this call: bad ones on any rank (wrong count, a negative
        entry, a sum other than dim 0, or no splits and dim 0 not divisible) must raise the
        same InvalidArgumentError on every rank, as :func:`accord.comm.agreement.check_headers`
        does.
        """

    @abstractmethod
    def barrier(self) -> None:
        """Return once every rank has entered."""


@runtime_checkable
class ScatteredAllreduce(Protocol):
    """Optional capability: allreduce many tensors as one, with no fusion buffer in between.

    A communicator that can read its inputs and write its outputs piecewise (shm) offers this so
    the engine can skip packing a batch into one buffer and copying it back out.
    """

    def supports_allreduce_many(self, dtype, op: ReduceOp) -> bool:
        """Whether :meth:`allreduce_many` handles wire ``dtype`` with ``op``."""

    def allreduce_many(self, inputs, outputs, op: ReduceOp, wire_dtype=None) -> None:
        """Reduce the concatenation of ``inputs`` (contiguous) into ``outputs`` (same sizes; may
        be the inputs themselves), as one collective carried and summed in ``wire_dtype``
        (default: the inputs' dtype); floating inputs and outputs of another dtype are cast."""


@runtime_checkable
class VotedAllreduce(Protocol):
    """Optional capability: an allreduce that every rank can call off inside the op itself.

    The engine's planned cycles ask in their one data collective whether every member followed
    the plan (:mod:`accord.engine.cycle.plan`); a communicator that carries a per-rank vote
    beside the data (shm: in the op's descriptor) spares the staging copy that otherwise
    carries it as one extra element.
    """

    def allreduce_voted(self, inputs, outputs, op: ReduceOp, vote: int, wire_dtype=None) -> bool:
        """As ``allreduce_many``, unless some rank's ``vote`` is non-zero: then no output is
        written anywhere and every rank returns False."""


class Backend(ABC):
    """A communication library.

    Subclasses set ``name`` and ``device_types`` (class or instance attributes) and implement
    ``create``, which only the members of the new communicator call, together (see
    :mod:`accord.comm.groups`: the context gives them a store of their own, private library
    groups and small exchanges).
    """

    name: str
    device_types: frozenset[str]  # e.g. {"cpu"} or {"cuda"}

    @abstractmethod
    def create(self, context: GroupContext) -> Communicator:
        """Make this rank's communicator over ``context.members`` (collective over the members)."""


BackendFactory = Callable[[], Backend]

_REGISTRY: Registry[BackendFactory] = Registry(
    "communication backend", "accord.comm.register_backend(name, factory)", BackendError)


def register_backend(name: str, factory: BackendFactory, *, override: bool = False) -> None:
    """Make ``name`` selectable (ACCORD_CPU_BACKEND / ACCORD_GPU_BACKEND, or explicitly).

    ``factory()`` returns a :class:`Backend` instance (a Backend subclass is itself a factory).

    Raises:
        ConfigError: ``name`` is already registered to another factory and ``override`` is False.
        TypeError: ``factory`` is a Backend class that leaves abstract methods unimplemented.
    """
    if isinstance(factory, type) and inspect.isabstract(factory):
        missing = ", ".join(sorted(factory.__abstractmethods__))
        raise TypeError(with_hint(f"backend class {factory.__qualname__} does not implement {missing}",
                                  f"define {missing} in {factory.__qualname__} (see accord.comm.Backend)"))
    _REGISTRY.add(name, factory, override=override)


def known_backends() -> list[str]:
    """Names of every registered backend."""
    return _REGISTRY.names()


def get_backend(name: str) -> Backend:
    """Instantiate a registered backend by name.

    Raises:
        BackendError: ``name`` is unknown (the message lists the known ones), or its factory
            did not build a complete :class:`Backend`.
        TypeError: the backend class lacks a method of :class:`Backend` (raised when it is built).
    """
    # Horovod's HOROVOD_CPU_OPERATIONS takes MPI or GLOO in capitals too.
    key = name if name in _REGISTRY else name.lower()
    if key not in _REGISTRY:
        raise _REGISTRY.unknown(name)
    backend = _REGISTRY[key]()
    missing = [a for a in ("name", "device_types") if not hasattr(backend, a)]
    if not isinstance(backend, Backend) or missing:
        raise BackendError(with_hint(
            f"backend {name!r} was built as a {type(backend).__qualname__}, which is not a complete "
            f"accord.comm.Backend" + (f" (missing: {', '.join(missing)})" if missing else ""),
            "subclass accord.comm.Backend, set name and device_types, and implement create(context)"))
    return backend
