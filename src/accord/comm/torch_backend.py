"""The ``gloo`` and ``nccl`` backends, over torch.distributed process groups.

Both need torch.distributed's default process group to exist already (accord's init, or
``init_process_group``). ``create(ranks)`` calls ``new_group``, which is collective over every
rank of the default group: all ranks call it, in the same order, with the same list.

Gloo lacks ragged allgather/gather/scatter, int16 and the unsigned types above uint8, integer
AVERAGE and complex PRODUCT; :class:`~accord.comm.base_communicator.BaseCommunicator` emulates
those on the primitives below (padding to the largest size, byte views, widening).
"""
from __future__ import annotations

from datetime import timedelta
from typing import Sequence

import torch
import torch.distributed as dist

from accord import group_teardown
from accord.comm import memory
from accord.comm.backend import Backend
from accord.comm.base_communicator import BaseCommunicator, normalize_ranks
from accord.comm.dtypes import LIBRARY_OPS
from accord.comm.ops import ReduceOp
from accord.comm.settings import CommSettings
from accord.errors import BackendError, with_hint

_OPS = {
    ReduceOp.SUM: dist.ReduceOp.SUM,
    ReduceOp.MIN: dist.ReduceOp.MIN,
    ReduceOp.MAX: dist.ReduceOp.MAX,
    ReduceOp.PRODUCT: dist.ReduceOp.PRODUCT,
}
# Types both Gloo and NCCL reduce with all four library ops (bool goes through uint8).
_NATIVE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64,
                  torch.int8, torch.uint8, torch.int32, torch.int64)
# Renamed in recent torch; keep working on torch >= 2.4.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class TorchCommunicator(BaseCommunicator):
    """A communicator over one torch.distributed process group."""

    def __init__(self, backend_name: str, group: dist.ProcessGroup, ranks: tuple[int, ...],
                 rank: int, meta_device: torch.device) -> None:
        self.backend_name = backend_name
        self.group = group
        self.ranks = ranks
        self.rank = rank
        self.size = len(ranks)
        self._meta_device = meta_device
        self._set_native([(dt, op) for dt in _NATIVE_DTYPES for op in LIBRARY_OPS])
        # Gloo's list reduce_scatter accepts uneven parts; NCCL's needs equal ones.
        self._uneven_reduce_scatter = backend_name == "gloo"

    @property
    def meta_device(self) -> torch.device:
        """Where small metadata tensors (sizes, headers) go: the CPU for Gloo; for NCCL the
        current CUDA device when the call is made (scripts pick their GPU after init, and the
        engine runs each CUDA collective under its tensors' device)."""
        if self._meta_device.type == "cuda":
            return torch.device("cuda", torch.cuda.current_device())
        return self._meta_device

    def close(self) -> None:
        """Release the process group (collective: every member calls it)."""
        if self.group is not None:
            group_teardown.destroy_process_group(self.group)
            self.group = None

    def _allreduce_native(self, tensor: torch.Tensor, op: ReduceOp) -> None:
        dist.all_reduce(tensor, op=_OPS[op], group=self.group)

    def _reduce_native(self, tensor: torch.Tensor, op: ReduceOp, root: int) -> None:
        dist.reduce(tensor, dst=self.ranks[root], op=_OPS[op], group=self.group)

    def _reduce_scatter_native(self, tensor: torch.Tensor, op: ReduceOp, rows: list[int]) -> torch.Tensor:
        out = memory.empty((rows[self.rank], *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
        if tensor.numel() == 0:
            return out
        if self.backend_name == "gloo" and op != ReduceOp.SUM:
            # Gloo's reduce-scatter of older torch sums whatever op it is given (torch 2.4: MIN,
            # MAX and PRODUCT came back summed); only its SUM is trusted, the rest go through
            # an allreduce.
            return super()._reduce_scatter_native(tensor, op, rows)
        if len(set(rows)) == 1:
            _reduce_scatter_single(out, tensor, op=_OPS[op], group=self.group)
        elif self._uneven_reduce_scatter:
            try:
                dist.reduce_scatter(out, list(tensor.split(rows)), op=_OPS[op], group=self.group)
            except RuntimeError as exc:
                # Gloo before torch 2.7 has only the equal-parts form; it refuses the list form
                # on every rank before sending anything, so all ranks switch here together.
                if "does not support reduce_scatter" not in str(exc):
                    raise
                self._uneven_reduce_scatter = False
                return self._reduce_scatter_padded(tensor, op, rows)
        elif self.backend_name == "gloo":
            return self._reduce_scatter_padded(tensor, op, rows)
        else:
            return super()._reduce_scatter_native(tensor, op, rows)
        return out

    def _reduce_scatter_padded(self, tensor: torch.Tensor, op: ReduceOp, rows: list[int]) -> torch.Tensor:
        """Uneven parts through the equal-parts form: every part padded to the longest."""
        longest = max(rows)
        padded = memory.empty((longest * self.size, *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
        for index, part in enumerate(tensor.split(rows)):
            padded[index * longest:index * longest + len(part)] = part
            padded[index * longest + len(part):(index + 1) * longest] = 0
        mine = memory.empty((longest, *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
        _reduce_scatter_single(mine, padded, op=_OPS[op], group=self.group)
        return mine[:rows[self.rank]].clone() if rows[self.rank] < longest else mine

    def _broadcast_native(self, data: torch.Tensor, root: int) -> None:
        if data.numel():
            dist.broadcast(data, src=self.ranks[root], group=self.group)

    def _allgatherv(self, data: torch.Tensor, counts: list[int]) -> torch.Tensor:
        width = max(counts)
        if width == 0:
            return data.new_empty(0)
        out = memory.empty(width * self.size, dtype=data.dtype, device=data.device)
        _all_gather_single(out, _padded(data, width), group=self.group)
        if all(c == width for c in counts):
            return out
        return torch.cat([out[i * width:i * width + c] for i, c in enumerate(counts)])

    def _gatherv(self, data: torch.Tensor, counts: list[int], root: int) -> torch.Tensor | None:
        width = max(counts)
        is_root = self.rank == root
        if width == 0:
            return data.new_empty(0) if is_root else None
        table = data.new_empty((self.size, width)) if is_root else None
        dist.gather(_padded(data, width), list(table.unbind(0)) if is_root else None,
                    dst=self.ranks[root], group=self.group)
        if not is_root:
            return None
        return torch.cat([table[i, :c] for i, c in enumerate(counts)])

    def _scatterv(self, data: torch.Tensor | None, counts: list[int], root: int) -> torch.Tensor:
        width = max(counts)
        out = memory.empty(width, dtype=torch.uint8, device=self.meta_device if data is None else data.device)
        if width == 0:
            return out
        parts = None
        if self.rank == root:
            table = data.new_zeros((self.size, width))
            offset = 0
            for i, count in enumerate(counts):
                table[i, :count] = data[offset:offset + count]
                offset += count
            parts = list(table.unbind(0))
        dist.scatter(out, parts, src=self.ranks[root], group=self.group)
        return out[: counts[self.rank]]

    def _alltoallv(self, data: torch.Tensor, send: list[int], recv: list[int]) -> torch.Tensor:
        out = memory.empty(sum(recv), dtype=data.dtype, device=data.device)
        # Always called (even with nothing to move here): Gloo waits on every peer's message.
        dist.all_to_all_single(out, data, output_split_sizes=recv, input_split_sizes=send, group=self.group)
        return out

    def _barrier(self) -> None:
        if self.backend_name == "nccl":
            dist.barrier(group=self.group, device_ids=[self.meta_device.index])
        else:
            dist.barrier(group=self.group)


def _padded(data: torch.Tensor, width: int) -> torch.Tensor:
    if data.numel() == width:
        return data
    out = data.new_zeros(width)
    out[: data.numel()] = data
    return out


class TorchBackend(Backend):
    """A Backend whose communicators are torch.distributed groups of one library (gloo or nccl)."""

    def __init__(self, name: str) -> None:
        if name not in ("gloo", "nccl"):
            raise BackendError(with_hint(f"torch backend {name!r} is not supported here",
                                         "use 'gloo' for CPU tensors or 'nccl' for CUDA tensors"))
        self.name = name
        self.device_types = frozenset({"cpu"} if name == "gloo" else {"cuda"})

    def create(self, ranks: Sequence[int]) -> TorchCommunicator | None:
        """Make a communicator over ``ranks`` (collective over every rank; None on non-members).

        Raises:
            BackendError: torch.distributed is not initialized, or the library is not built in.
            ValueError: ``ranks`` is empty, has duplicates or ranks outside the job.
        """
        if not dist.is_available() or not dist.is_initialized():
            raise BackendError(with_hint(
                f"the {self.name} backend needs torch.distributed's default process group, which is not initialized",
                "call accord's init (hvd.init()) or torch.distributed.init_process_group() first"))
        available = dist.is_gloo_available() if self.name == "gloo" else dist.is_nccl_available()
        if not available:
            raise BackendError(with_hint(
                f"this torch build ({torch.__version__}) has no {self.name} support",
                "install a torch build with it, or choose another backend "
                "(ACCORD_CPU_BACKEND / ACCORD_GPU_BACKEND)"))
        members = normalize_ranks(ranks, dist.get_world_size())
        timeout = timedelta(seconds=CommSettings.from_config().collective_timeout)
        group = dist.new_group(list(members), timeout=timeout, backend=self.name)
        me = dist.get_rank()
        if me not in members:
            return None
        if self.name == "nccl":
            meta = torch.device("cuda", torch.cuda.current_device())
        else:
            meta = torch.device("cpu")
        return TorchCommunicator(self.name, group, members, members.index(me), meta)
