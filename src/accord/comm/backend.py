"""The Backend protocol and registry.

A *backend* (gloo, nccl, mpi, a vendor library) turns a list of global ranks into a
:class:`Communicator`: an object that runs collectives among exactly those ranks. The engine
and the frontends only ever talk to communicators, so a new library plugs in by registering a
factory: ``register_backend("cncl", CnclBackend)``.

Conventions every communicator follows (tests hold each backend to them):
- Tensors are torch tensors on a device the backend supports; reductions run in place.
- ``root`` arguments are ranks *within the communicator* (0 .. size-1).
- Every op in :class:`~accord.comm.ops.ReduceOp` except ADASUM works on every backend;
  what a library lacks is emulated (e.g. AVERAGE = SUM then divide, PRODUCT via gather).
- Collectives are blocking from the caller's point of view.
"""
from __future__ import annotations

from typing import Callable, Protocol, Sequence, runtime_checkable

from accord.comm.ops import ReduceOp
from accord.errors import BackendError, with_hint


@runtime_checkable
class Communicator(Protocol):
    """Collectives among one fixed, ordered set of global ranks."""

    ranks: tuple[int, ...]  # global ranks, in communicator-rank order
    rank: int  # this process's index in ``ranks``
    size: int

    def allreduce(self, tensor, op: ReduceOp) -> None:
        """Reduce ``tensor`` across ranks in place."""

    def broadcast(self, tensor, root: int) -> None:
        """Overwrite ``tensor`` with root's, in place."""

    def allgather(self, tensor):
        """Concatenate every rank's tensor along dim 0; first dims may differ."""

    def gather(self, tensor, root: int):
        """Like allgather, but only ``root`` gets the result (others get None)."""

    def scatter(self, chunks, root: int):
        """Root passes one tensor per rank (dim 0 may differ, the rest must match); each rank gets its own.

        Non-root ranks pass None: root announces dtype and shapes.
        """

    def reduce(self, tensor, op: ReduceOp, root: int) -> None:
        """Reduce into root's ``tensor`` in place; other ranks' tensors are left unspecified."""

    def reduce_scatter(self, tensor, op: ReduceOp):
        """Reduce, then split dim 0 across ranks (lower ranks get the extra rows)."""

    def alltoall(self, tensor, splits: Sequence[int] | None):
        """Send ``splits[i]`` rows to rank i (even split when None); return (output, received_splits).

        ``received_splits`` is a CPU int64 tensor: rows received from each rank, in rank order.
        """

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


class Backend(Protocol):
    """A communication library. ``create`` is collective over every rank of the job."""

    name: str
    device_types: frozenset[str]  # e.g. {"cpu"} or {"cuda"}

    def create(self, ranks: Sequence[int]) -> Communicator | None:
        """Make a communicator over ``ranks`` (returns None on ranks outside it)."""


BackendFactory = Callable[[], Backend]

_REGISTRY: dict[str, BackendFactory] = {}


def register_backend(name: str, factory: BackendFactory) -> None:
    """Make ``name`` selectable (ACCORD_CPU_BACKEND / ACCORD_GPU_BACKEND, or explicitly)."""
    _REGISTRY[name] = factory


def known_backends() -> list[str]:
    """Names of every registered backend."""
    return sorted(_REGISTRY)


def get_backend(name: str) -> Backend:
    """Instantiate a registered backend by name.

    Raises:
        BackendError: ``name`` is unknown (the message lists the known ones).
    """
    # Horovod's HOROVOD_CPU_OPERATIONS takes MPI or GLOO in capitals too.
    factory = _REGISTRY.get(name) or _REGISTRY.get(name.lower())
    if factory is None:
        raise BackendError(
            with_hint(
                f"unknown communication backend {name!r}; known: {', '.join(known_backends()) or 'none'}",
                "pick one of the known names, or register yours with "
                "accord.comm.backend.register_backend(name, factory)",
            )
        )
    return factory()
