"""The Communicator semantics every backend shares, built on a handful of library primitives.

A backend subclasses :class:`BaseCommunicator` and implements the ``_primitives`` below (native
reductions on contiguous tensors, and byte movement with per-rank counts). This class supplies
the rest, identically for every backend: the dtype/op emulation of :mod:`accord.comm.dtypes`,
non-contiguous inputs, ragged first dimensions (sizes are exchanged first), uneven
reduce-scatter, alltoall splits, and argument checks that every rank agrees on (the checks
themselves live in :mod:`accord.comm.agreement`), so a bad argument on one rank raises on all of
them instead of leaving the others waiting.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import torch

from accord.comm import dtypes
from accord.comm.agreement import (
    alltoall_splits,
    check_headers,
    check_root,
    header,
    normalize_ranks,
    output_problem,
    scatter_problem,
)
from accord.comm.backend import Communicator
from accord.comm.ops import ReduceOp
from accord.errors import AccordError, CollectiveError, InvalidArgumentError, RankFailedError, with_hint

# normalize_ranks and output_problem: re-exported
__all__ = ["BaseCommunicator", "normalize_ranks", "output_problem", "overlap_rows", "overlaps", "split_rows"]

_PEER_LOST = ("timed out", "timeout", "connection closed", "connection reset", "broken pipe",
              "closed by peer", "connection refused", "peer")


def split_rows(rows: int, size: int) -> list[int]:
    """Rows each rank gets when ``rows`` are split ``size`` ways (lower ranks get the extra)."""
    base, extra = divmod(rows, size)
    return [base + (1 if i < extra else 0) for i in range(size)]


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of a contiguous tensor (data movement is dtype-agnostic)."""
    if tensor.numel() == 0:
        # Empty numpy-born tensors can have stride 0, which view() rejects; nothing to move anyway.
        return torch.empty(0, dtype=torch.uint8, device=tensor.device)
    flat = tensor.reshape(-1)
    if flat.stride(0) != 1:
        # A one-element view of a strided tensor counts as contiguous and keeps its stride,
        # which a dtype view refuses; its one element is contiguous in memory all the same.
        flat = flat.as_strided((1,), (1,))
    return flat.view(torch.uint8)


def _collective(fn: Callable) -> Callable:
    """Run a public collective without autograd, turning library failures into accord errors."""
    name = fn.__name__.replace("_general", "").lstrip("_")

    @functools.wraps(fn)
    def wrapper(self: "BaseCommunicator", *args: Any, **kwargs: Any) -> Any:
        try:
            with torch.no_grad():
                return fn(self, *args, **kwargs)
        except (AccordError, NotImplementedError):
            raise
        except RuntimeError as exc:  # torch.distributed and mpi4py errors are RuntimeErrors
            raise self._failure(name, exc) from exc

    return wrapper


def check_writable(tensor: torch.Tensor) -> None:
    """Refuse an in-place result into a tensor whose elements overlap (an expanded view).

    Raises:
        ValueError: some dimension of size > 1 has stride 0.
    """
    if any(st == 0 and sz > 1 for st, sz in zip(tensor.stride(), tensor.size())):
        raise ValueError(with_hint(
            f"cannot write the result into a tensor whose elements overlap in memory "
            f"(shape {list(tensor.shape)}, strides {list(tensor.stride())})",
            "pass tensor.contiguous() (or tensor.clone()) instead of an expanded view"))


class BaseCommunicator(Communicator):
    """Collectives among ``ranks``; see :class:`accord.comm.backend.Communicator` for the contract.

    Subclasses set ``ranks``, ``rank``, ``size``, ``backend_name``, ``meta_device`` and call
    :meth:`_set_native` with the (dtype, library op) pairs their library reduces.
    """

    ranks: tuple[int, ...]
    rank: int
    size: int
    backend_name: str = "?"
    meta_device: torch.device = torch.device("cpu")
    _fast: frozenset = frozenset()

    def _set_native(self, pairs: Sequence[tuple[torch.dtype, ReduceOp]]) -> None:
        self._fast = frozenset(pairs)

    def _native(self, dtype: torch.dtype, op: ReduceOp) -> bool:
        return (dtype, op) in self._fast

    # ---- primitives a backend implements (tensors are contiguous) ----
    def _allreduce_native(self, tensor: torch.Tensor, op: ReduceOp) -> None:
        raise NotImplementedError

    def _reduce_native(self, tensor: torch.Tensor, op: ReduceOp, root: int) -> None:
        raise NotImplementedError

    def _reduce_scatter_native(self, tensor: torch.Tensor, op: ReduceOp, rows: list[int],
                               out: torch.Tensor | None = None) -> torch.Tensor:
        """Default: allreduce a copy, keep my rows (written into ``out`` when given: contiguous,
        the input's dtype, this rank's rows). Backends with a real reduce-scatter override."""
        work = tensor.clone()
        self._allreduce_native(work, op)
        start = sum(rows[: self.rank])
        mine = work[start:start + rows[self.rank]]
        return mine.clone() if out is None else out.copy_(mine)

    def _broadcast_native(self, data: torch.Tensor, root: int) -> None:
        raise NotImplementedError

    def _allgatherv(self, data: torch.Tensor, counts: list[int], out: torch.Tensor | None = None) -> torch.Tensor:
        """Every rank's bytes (``counts[i]`` from rank i) back to back, into ``out`` (a flat uint8
        tensor of ``sum(counts)`` bytes) when given."""
        raise NotImplementedError

    def _gatherv(self, data: torch.Tensor, counts: list[int], root: int) -> torch.Tensor | None:
        raise NotImplementedError

    def _scatterv(self, data: torch.Tensor | None, counts: list[int], root: int) -> torch.Tensor:
        raise NotImplementedError

    def _alltoallv(self, data: torch.Tensor, send: list[int], recv: list[int]) -> torch.Tensor:
        raise NotImplementedError

    def _barrier(self) -> None:
        raise NotImplementedError

    # ---- the protocol ----
    def allreduce(self, tensor: torch.Tensor, op: ReduceOp) -> None:
        """Reduce ``tensor`` across ranks in place."""
        if (tensor.dtype, op) in self._fast and tensor.is_contiguous() and not tensor.requires_grad:
            # The fast path: straight to the library, no copy, no conversion, no autograd guard
            # (MPI's small allreduce takes ~1 us, so microseconds here count).
            try:
                self._allreduce_native(tensor, op)
            except (AccordError, NotImplementedError):
                raise
            except RuntimeError as exc:
                raise self._failure("allreduce", exc) from exc
            return
        self._allreduce_general(tensor, op)

    @_collective
    def _allreduce_general(self, tensor: torch.Tensor, op: ReduceOp) -> None:
        self._reduce(tensor, op, None)

    @_collective
    def reduce(self, tensor: torch.Tensor, op: ReduceOp, root: int) -> None:
        """Reduce into root's ``tensor`` in place; other ranks' tensors are left unspecified."""
        check_root(root, self.size, self.ranks)
        if (tensor.dtype, op) in self._fast and tensor.is_contiguous():
            self._reduce_native(tensor, op, root)
            return
        self._reduce(tensor, op, root)

    def _reduce(self, tensor: torch.Tensor, op: ReduceOp, root: int | None) -> None:
        plan = dtypes.plan_reduction(tensor.dtype, op, self._native)
        work = self._contiguous(tensor, writable=True)
        receives = root is None or self.rank == root
        if plan.gather:
            stacked = self._gather_equal(work, root)
            if receives:
                _write_back(tensor, dtypes.fold(stacked, plan.op))
            return
        wire = dtypes.encode(work, plan)
        if root is None:
            self._allreduce_native(wire, plan.op)
        else:
            self._reduce_native(wire, plan.op, root)
        if receives:
            if plan.average:
                dtypes.divide_(wire, self.size)
            _write_back(tensor, dtypes.decode(wire, plan, tensor.dtype))

    @_collective
    def reduce_scatter(self, tensor: torch.Tensor, op: ReduceOp, out: torch.Tensor | None = None) -> torch.Tensor:
        """Reduce, then split dim 0 across ranks (lower ranks get the extra rows); into ``out``
        when given (see :meth:`accord.comm.backend.Communicator.reduce_scatter`).

        Raises:
            ValueError: a scalar ``tensor``, or an ``out`` of another dtype, device or shape than
                this rank's rows, not contiguous, or overlapping ``tensor``.
        """
        if tensor.dim() == 0:
            raise ValueError(with_hint("reduce_scatter needs a tensor with at least one dimension, got a scalar",
                                       "reshape it to [1] (or use allreduce)"))
        rows = split_rows(tensor.shape[0], self.size)
        work = self._contiguous(tensor, writable=False)
        if out is not None:
            problem = output_problem("reduce_scatter", out, work.dtype, work.device, (rows[self.rank], *work.shape[1:]))
            at = -1 if problem else overlap_rows(out, work)
            if at not in (-1, sum(rows[:self.rank])):
                problem = with_hint(
                    f"reduce_scatter: the output overlaps the input other than as this rank's own rows "
                    f"(rows {sum(rows[:self.rank])}..{sum(rows[:self.rank + 1])} of the input)",
                    "pass an output of its own, or exactly this rank's rows of the input (in place)")
            if problem:
                raise ValueError(problem)
        plan = dtypes.plan_reduction(tensor.dtype, op, self._native)
        if plan.gather:
            start = sum(rows[: self.rank])
            return _into(out, dtypes.fold(self._gather_equal(work, None)[:, start:start + rows[self.rank]], plan.op))
        # The library writes straight into ``out`` when the wire is a view of the caller's dtype.
        wire_out = None if out is None else dtypes.encode_view(out, plan)
        result = self._reduce_scatter_native(dtypes.encode(work, plan), plan.op, rows, wire_out)
        if plan.average:
            dtypes.divide_(result, self.size)
        return _into(out, dtypes.decode(result, plan, tensor.dtype))

    @_collective
    def broadcast(self, tensor: torch.Tensor, root: int) -> None:
        """Overwrite ``tensor`` with root's, in place."""
        check_root(root, self.size, self.ranks)
        work = self._contiguous(tensor, writable=True)
        self._broadcast_native(_as_bytes(work), root)
        if work is not tensor:
            tensor.copy_(work)

    @_collective
    def allgather(self, tensor: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Concatenate every rank's tensor along dim 0 (first dims may differ); into ``out``
        when given (see :meth:`accord.comm.backend.Communicator.allgather`).

        Raises:
            InvalidArgumentError: some rank's ``out`` has another dtype, device or shape than
                the result, is not contiguous or overlaps its input (raised on every rank).
            MismatchError: ranks differ in dtype or dims after dim 0.
        """
        work = self._contiguous(tensor, writable=False)
        work = work.reshape(1) if work.dim() == 0 else work
        problem, at = "", -1
        if out is not None:
            problem = output_problem("allgather", out, work.dtype, work.device, None, work.shape[1:])
            at = -1 if problem else overlap_rows(work, out)
            if at is None:
                problem = with_hint("allgather: the input overlaps the output other than as a block of whole "
                                    "rows", "pass an output of its own, or the input as this rank's rows of it")
        rows = self._agree_rows("allgather", work, problem, -1 if out is None or problem else out.shape[0],
                                -1 if at is None else at)
        row_bytes = _row_bytes(work)
        data = self._allgatherv(_as_bytes(work), [r * row_bytes for r in rows],
                                None if out is None else _as_bytes(out))
        return out if out is not None else data.view(work.dtype).reshape(sum(rows), *work.shape[1:])

    @_collective
    def gather(self, tensor: torch.Tensor, root: int) -> torch.Tensor | None:
        """Like allgather, but only ``root`` gets the result (others get None)."""
        check_root(root, self.size, self.ranks)
        work = self._contiguous(tensor, writable=False)
        work = work.reshape(1) if work.dim() == 0 else work
        rows = self._agree_rows("gather", work)
        row_bytes = _row_bytes(work)
        data = self._gatherv(_as_bytes(work), [r * row_bytes for r in rows], root)
        if data is None:
            return None
        return data.view(work.dtype).reshape(sum(rows), *work.shape[1:])

    @_collective
    def scatter(self, chunks: Sequence[torch.Tensor] | None, root: int) -> torch.Tensor:
        """Root passes one tensor per rank (dim 0 may differ); each rank gets its own.

        Non-root ranks may pass None. Root announces dtype and shapes first, so non-roots need
        no template; a bad ``chunks`` on root raises ValueError on every rank.
        """
        check_root(root, self.size, self.ranks)
        problem = ""
        if self.rank == root:
            problem = scatter_problem(chunks, self.size)
            first = chunks[0] if not problem else None
            head = [0 if problem else 1, dtypes.dtype_code(first.dtype) if first is not None else 0,
                    first.dim() if first is not None else 0]
        else:
            head = [0, 0, 0]
        head = self._broadcast_ints(head, root)
        if not head[0]:
            raise ValueError(with_hint(
                f"scatter: root (rank {self.ranks[root]}) passed invalid chunks" + (f": {problem}" if problem else ""),
                f"on the root pass a list of {self.size} tensors of one dtype whose shapes differ only in dim 0"))
        dtype, ndim = dtypes.dtype_from_code(head[1]), head[2]
        if self.rank == root:
            layout = list(chunks[0].shape[1:]) + [c.shape[0] for c in chunks]
        else:
            layout = [0] * (ndim - 1 + self.size)
        layout = self._broadcast_ints(layout, root)
        trailing, rows = layout[: ndim - 1], layout[ndim - 1:]
        row_bytes = _numel(trailing) * _itemsize(dtype)
        data = None
        if self.rank == root:
            data = torch.cat([_as_bytes(c.contiguous()) for c in chunks])
        out = self._scatterv(data, [r * row_bytes for r in rows], root)
        return out.view(dtype).reshape(rows[self.rank], *trailing)

    @_collective
    def alltoall(self, tensor: torch.Tensor,
                 splits: Sequence[int] | torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Send ``splits[i]`` rows to rank i (even split when None).

        Returns ``(output, received_splits)``: the received rows concatenated in rank order, and
        a CPU int64 tensor with the number of rows received from each rank.
        """
        work = self._contiguous(tensor, writable=False)
        problem, sizes = alltoall_splits(work, splits, self.size)
        headers = self._exchange(header(not problem, work, *sizes))
        check_headers("alltoall", work, headers, problem, self.ranks, self.rank, self._exchange)
        received = [h[4 + self.rank] for h in headers]
        row_bytes = _row_bytes(work)
        # Skip the library call only when no rank moves anything (the same answer on every
        # rank): a rank with nothing to send or receive must still take part, or its peers wait.
        if row_bytes == 0 or not any(any(h[4:4 + self.size]) for h in headers):
            data = torch.empty(0, dtype=torch.uint8, device=work.device)
        else:
            data = self._alltoallv(_as_bytes(work), [s * row_bytes for s in sizes],
                                   [r * row_bytes for r in received])
        out = data.view(work.dtype).reshape(sum(received), *work.shape[1:])
        return out, torch.tensor(received, dtype=torch.int64)

    @_collective
    def barrier(self) -> None:
        """Return once every rank has entered."""
        self._barrier()

    # ---- helpers ----
    def _contiguous(self, tensor: torch.Tensor, writable: bool) -> torch.Tensor:
        if tensor.is_contiguous():
            return tensor
        if writable:
            check_writable(tensor)
        return tensor.contiguous()

    def _exchange(self, values: list[int]) -> list[list[int]]:
        """Allgather one list of ints (same length on every rank)."""
        mine = torch.tensor(values, dtype=torch.int64, device=self.meta_device)
        data = self._allgatherv(mine.view(torch.uint8), [8 * len(values)] * self.size)
        return data.view(torch.int64).reshape(self.size, len(values)).tolist()

    def _broadcast_ints(self, values: list[int], root: int) -> list[int]:
        data = torch.tensor(values, dtype=torch.int64, device=self.meta_device)
        if data.numel():
            self._broadcast_native(data.view(torch.uint8), root)
        return data.tolist()

    def _gather_equal(self, work: torch.Tensor, root: int | None) -> torch.Tensor | None:
        """Every rank's same-shaped tensor stacked along a new dim 0 (on root only if ``root``)."""
        data = _as_bytes(work)
        counts = [data.numel()] * self.size
        got = self._allgatherv(data, counts) if root is None else self._gatherv(data, counts, root)
        return None if got is None else got.view(work.dtype).reshape(self.size, *work.shape)

    def _agree_rows(self, kind: str, work: torch.Tensor, problem: str = "", out_rows: int = -1,
                    at: int = -1) -> list[int]:
        """Every rank's dim 0, after checking that dtypes and trailing shapes agree, that no
        rank flagged a ``problem`` with its output, that every output given (``out_rows`` rows,
        -1 for none) has the total rows, and that an input inside its output (at row ``at``,
        -1 when not) is that rank's own rows of it: every rank raises alike."""
        headers = self._exchange(header(not problem, work, work.shape[0], out_rows, at))
        check_headers(kind, work, headers, problem, self.ranks, self.rank, self._exchange)
        rows = [h[4] for h in headers]
        total = sum(rows)
        wrong = [(self.ranks[i], h[5]) for i, h in enumerate(headers) if h[5] >= 0 and h[5] != total]
        if wrong:
            seen = ", ".join(f"rank {r}: {n}" for r, n in wrong)
            raise InvalidArgumentError(with_hint(
                f"{kind}: the output has the wrong number of rows ({seen}); the result has {total} "
                f"(rows per rank {rows}, dims after dim 0 {list(work.shape[1:])})",
                f"pass an output of shape [{total}, *the input's dims after dim 0] on every rank, "
                "or none"))
        misplaced = [(self.ranks[i], h[6], sum(rows[:i])) for i, h in enumerate(headers)
                     if h[6] >= 0 and h[6] != sum(rows[:i])]
        if misplaced:
            seen = ", ".join(f"rank {r} at row {got}, its rows start at {start}" for r, got, start in misplaced)
            raise InvalidArgumentError(with_hint(
                f"{kind}: the input lies inside the output at the wrong place ({seen})",
                "pass an output of its own, or the input as exactly this rank's rows of the output"))
        return rows

    def _failure(self, name: str, exc: BaseException) -> CollectiveError:
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        where = (f"{name} failed on rank {self.ranks[self.rank]} ({self.backend_name} communicator over "
                 f"ranks {list(self.ranks)}): {text}")
        if any(word in text.lower() for word in _PEER_LOST):
            return RankFailedError(with_hint(
                where, "another rank exited or stopped answering; check its log. The wait limit is "
                       "ACCORD_COLLECTIVE_TIMEOUT (seconds)"))
        return CollectiveError(with_hint(where, "check that every rank called the same collectives in "
                                                "the same order with matching tensors"))


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors' memory spans (first to last byte) intersect."""
    if a.numel() == 0 or b.numel() == 0 or a.device != b.device:
        return False
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + b.numel() * b.element_size() and b0 < a0 + a.numel() * a.element_size()


def overlap_rows(inner: torch.Tensor, outer: torch.Tensor) -> int | None:
    """-1 when the contiguous ``inner`` and ``outer`` do not overlap; the row of ``outer`` at
    which ``inner`` starts when it is a block of whole rows inside it (the in-place forms of
    allgather and reduce-scatter); None for any other overlap."""
    if not overlaps(inner, outer):
        return -1
    row = _row_bytes(outer) if outer.dim() else outer.element_size()
    offset = inner.data_ptr() - outer.data_ptr()
    if (row == 0 or offset < 0 or offset % row or inner.dtype != outer.dtype
            or offset + inner.nbytes > outer.nbytes or inner.nbytes % row):
        return None
    return offset // row


def _into(out: torch.Tensor | None, result: torch.Tensor) -> torch.Tensor:
    """``result``, in ``out`` when one is given (copied unless it is there already)."""
    if out is None:
        return result
    if result.data_ptr() != out.data_ptr() or result.dtype != out.dtype:
        out.copy_(result.reshape(out.shape))
    return out


def _write_back(dst: torch.Tensor, result: torch.Tensor) -> None:
    if result.data_ptr() != dst.data_ptr() or not dst.is_contiguous() or result.dtype != dst.dtype:
        dst.copy_(result.reshape(dst.shape))


def _numel(shape: Sequence[int]) -> int:
    count = 1
    for dim in shape:
        count *= int(dim)
    return count


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


def _row_bytes(work: torch.Tensor) -> int:
    return _numel(work.shape[1:]) * work.element_size()

