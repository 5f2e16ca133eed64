"""The ``mpi`` backend: collectives through mpi4py on CPU tensors.

Tensors reach MPI as numpy views (``tensor.numpy()``, no copy). Data movement (broadcast,
allgather, gather, scatter, alltoall) sends raw bytes, so every dtype moves, bfloat16 included.
Reductions run natively on float32/64, every signed and unsigned integer width and complex
SUM/PRODUCT (MPI multiplies complex numbers properly); float16 and bfloat16, which MPI lacks,
are reduced in float32 (see :mod:`accord.comm.dtypes`), and so are the few pairs some MPI
builds get wrong (``_MISREDUCED``).

Global ranks are MPI_COMM_WORLD ranks, so run the job under ``mpirun`` (or accordrun with
MPI). mpi4py is imported on first use, so ``import accord.comm`` works without it. MPI counts
are C ints: one rank's part of a collective must stay under 2 GiB. MPI has no per-operation
timeout (ACCORD_COLLECTIVE_TIMEOUT does not apply): when a rank dies, mpirun ends the job.
"""
from __future__ import annotations

import itertools
import zlib
from typing import Any, Sequence

import torch

from accord.comm import memory
from accord.comm.backend import Backend
from accord.comm.base_communicator import BaseCommunicator, overlaps
from accord.comm.dtypes import LIBRARY_OPS, is_integer
from accord.comm.groups import GroupContext
from accord.comm.ops import BITWISE_OPS, ReduceOp
from accord.errors import BackendError, with_hint
from accord.mpi_init import initialized_mpi

_INT_MAX = 2**31 - 1
_NATIVE_REAL = (torch.float32, torch.float64, torch.int8, torch.int16, torch.int32, torch.int64,
                torch.uint8) + tuple(getattr(torch, n) for n in ("uint16", "uint32", "uint64") if hasattr(torch, n))
_NATIVE_COMPLEX = (torch.complex64, torch.complex128)
# Pairs some MPI builds get wrong, measured on Debian's Open MPI 4.1.4: its AVX op component
# saturates 8- and 16-bit SUM instead of wrapping, and uint64 MIN/MAX compare as signed. They
# take the emulated path (widened to int32, or int64 with the sign bit flipped) on every build.
_MISREDUCED = {(dt, ReduceOp.SUM) for dt in (torch.int8, torch.uint8, torch.int16, getattr(torch, "uint16", None))}
_MISREDUCED |= {(getattr(torch, "uint64", None), op) for op in (ReduceOp.MIN, ReduceOp.MAX)}


def load_mpi() -> Any:
    """mpi4py's MPI module, with MPI initialized (:mod:`accord.mpi_init`).

    Raises:
        BackendError: mpi4py or an MPI library is not installed, or MPI was already finalized.
    """
    try:
        return initialized_mpi()
    except ImportError as exc:
        raise BackendError(with_hint(
            f"the mpi backend needs mpi4py, which could not be imported: {exc}",
            "pip install 'accord[mpi]' (needs an MPI library, e.g. apt-get install openmpi-bin "
            "libopenmpi-dev), or choose ACCORD_CPU_BACKEND=gloo")) from None


def _np(tensor: torch.Tensor) -> Any:
    if tensor.device.type != "cpu":
        raise BackendError(with_hint(
            f"the mpi backend handles CPU tensors only, got a tensor on {tensor.device}",
            "move the tensor to the CPU, or use the nccl backend for CUDA tensors"))
    return tensor.detach().reshape(-1).numpy()


def _displacements(counts: Sequence[int]) -> list[int]:
    if max(counts, default=0) > _INT_MAX or sum(counts) > _INT_MAX:
        raise BackendError(with_hint(
            f"an MPI collective of {sum(counts)} bytes (per-rank parts {list(counts)}) exceeds MPI's "
            "2**31-1 count limit", "split the tensor into smaller pieces or use the gloo backend"))
    return [0, *itertools.accumulate(counts)][:-1]


class MpiCommunicator(BaseCommunicator):
    """A communicator over one MPI communicator (a Split of MPI_COMM_WORLD)."""

    backend_name = "mpi"

    def __init__(self, comm: Any, ranks: tuple[int, ...], rank: int) -> None:
        MPI = load_mpi()
        self.comm = comm
        self.ranks = ranks
        self.rank = rank
        self.size = len(ranks)
        self.meta_device = torch.device("cpu")
        self._byte = MPI.BYTE
        self._in_place = MPI.IN_PLACE
        self._ops = {ReduceOp.SUM: MPI.SUM, ReduceOp.MIN: MPI.MIN, ReduceOp.MAX: MPI.MAX,
                     ReduceOp.PRODUCT: MPI.PROD, ReduceOp.BAND: MPI.BAND, ReduceOp.BOR: MPI.BOR,
                     ReduceOp.BXOR: MPI.BXOR}
        pairs = [(dt, op) for dt in _NATIVE_REAL for op in LIBRARY_OPS if (dt, op) not in _MISREDUCED]
        pairs += [(dt, op) for dt in _NATIVE_REAL if is_integer(dt) for op in BITWISE_OPS]
        pairs += [(dt, op) for dt in _NATIVE_COMPLEX for op in (ReduceOp.SUM, ReduceOp.PRODUCT)]
        self._set_native(pairs)

    def close(self) -> None:
        """Free the MPI communicator (collective: every member calls it)."""
        if self.comm is not None:
            self.comm.Free()
            self.comm = None

    def _allreduce_native(self, tensor: torch.Tensor, op: ReduceOp) -> None:
        self.comm.Allreduce(self._in_place, _np(tensor), op=self._ops[op])

    def _reduce_native(self, tensor: torch.Tensor, op: ReduceOp, root: int) -> None:
        if self.rank == root:
            self.comm.Reduce(self._in_place, _np(tensor), op=self._ops[op], root=root)
        else:
            self.comm.Reduce(_np(tensor), None, op=self._ops[op], root=root)

    def _reduce_scatter_native(self, tensor: torch.Tensor, op: ReduceOp, rows: list[int],
                               out: torch.Tensor | None = None) -> torch.Tensor:
        if out is not None and overlaps(out, tensor):
            # MPI forbids a receive buffer inside the send buffer (its MPI_IN_PLACE form has
            # another layout): the result goes through a buffer of its own.
            return out.copy_(self._reduce_scatter_native(tensor, op, rows))
        if out is None:
            out = memory.empty((rows[self.rank], *tensor.shape[1:]), dtype=tensor.dtype)
        if tensor.numel() == 0:
            return out
        per_row = tensor.numel() // tensor.shape[0]
        self.comm.Reduce_scatter(_np(tensor), _np(out), [r * per_row for r in rows], op=self._ops[op])
        return out

    def _broadcast_native(self, data: torch.Tensor, root: int) -> None:
        if data.numel():
            self.comm.Bcast([_np(data), self._byte], root=root)

    def _allgatherv(self, data: torch.Tensor, counts: list[int], out: torch.Tensor | None = None) -> torch.Tensor:
        if out is None:
            out = memory.empty(sum(counts), dtype=torch.uint8)
        elif overlaps(data, out):
            data = data.clone()  # (MPI forbids aliased buffers; this rank's part is small)
        displs = _displacements(counts)
        self.comm.Allgatherv([_np(data), self._byte], [_np(out), counts, displs, self._byte])
        return out

    def _gatherv(self, data: torch.Tensor, counts: list[int], root: int) -> torch.Tensor | None:
        displs = _displacements(counts)
        if self.rank != root:
            self.comm.Gatherv([_np(data), self._byte], None, root=root)
            return None
        out = memory.empty(sum(counts), dtype=torch.uint8)
        self.comm.Gatherv([_np(data), self._byte], [_np(out), counts, displs, self._byte], root=root)
        return out

    def _scatterv(self, data: torch.Tensor | None, counts: list[int], root: int) -> torch.Tensor:
        displs = _displacements(counts)
        out = memory.empty(counts[self.rank], dtype=torch.uint8)
        send = [_np(data), counts, displs, self._byte] if self.rank == root else None
        self.comm.Scatterv(send, [_np(out), self._byte], root=root)
        return out

    def _alltoallv(self, data: torch.Tensor, send: list[int], recv: list[int]) -> torch.Tensor:
        out = memory.empty(sum(recv), dtype=torch.uint8)
        self.comm.Alltoallv([_np(data), send, _displacements(send), self._byte],
                            [_np(out), recv, _displacements(recv), self._byte])
        return out

    def _barrier(self) -> None:
        self.comm.Barrier()


class MpiBackend(Backend):
    """A Backend whose communicators are splits of MPI_COMM_WORLD."""

    name = "mpi"
    device_types = frozenset({"cpu"})

    def create(self, context: GroupContext) -> MpiCommunicator:
        """Make this rank's communicator over ``context.members`` (collective over the members only:
        ``MPI_Comm_create_group``).

        Raises:
            BackendError: mpi4py is missing, or the job's ranks are not MPI_COMM_WORLD's.
        """
        MPI = load_mpi()
        world = MPI.COMM_WORLD
        members = list(context.members)
        if members[-1] >= world.Get_size() or world.Get_rank() != context.rank:
            raise BackendError(with_hint(
                f"the mpi backend needs every rank of the job in MPI_COMM_WORLD, which has "
                f"{world.Get_size()} rank(s) here (this is MPI rank {world.Get_rank()}, accord rank "
                f"{context.rank}); asked for ranks {members}",
                "start the job with mpirun (or srun with MPI) to use ACCORD_CPU_BACKEND=mpi; "
                "under accordrun, torchrun or accord.spawn use gloo or shm"))
        group = world.Get_group().Incl(members)
        # The tag tells apart sets their members create at the same time (any order of keys).
        comm = world.Create_group(group, tag=zlib.crc32(context.key.encode()) % 32767)
        group.Free()
        return MpiCommunicator(comm, context.members, context.index)
