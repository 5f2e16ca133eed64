"""The communicator of the ``shm`` backend: collectives through one shared-memory segment.

The segment (see :mod:`accord.comm.shm.segment`) holds, per rank, an input slot of ``chunk``
bytes in each of two banks, plus a result area per bank. An op moves its data in chunks through
a pipeline of *phases* separated by barriers (:mod:`accord.comm.shm.sync`): chunk ``c`` is
copied in during phase ``start + c``, then read (reduced, copied out) during the next phase or
two. Data copied in during phase ``q`` lives in bank ``q % 2``: its input slots are written in
phase ``q`` and read in ``q + 1``; its result area is written in ``q + 1`` and read in
``q + 2``. So no area is rewritten while anyone may still read it, across ops too, with one
barrier per chunk and none at the end of an op.

- allreduce / reduce: every rank copies a chunk into its slot; then each receiving rank
  reduces all slots straight into its own tensor (torch ops on ``torch.frombuffer`` views: the
  reductions are vectorised). With more than ``direct_max_ranks`` ranks and large tensors, rank
  ``i`` instead reduces part ``i`` of the chunk into the result area and every rank copies the
  result out (less work per rank, one more phase). Two ranks reducing in place (a sum or product
  into the inputs themselves) add the peer's slot into their own tensor: the same bits, since
  the op commutes, with no scratch pass.
- reduce_scatter: each rank reduces only its own rows, straight into its output.
- broadcast / allgather / gather / scatter / alltoall: copies through the same slots.

Every op's first phase also publishes what it is (kind, dtype, op, bytes, root); after the
first barrier each rank compares them, so mismatched calls raise MismatchError on every rank
instead of corrupting data. The dtype/op emulation, ragged shapes and argument checks come
from :class:`~accord.comm.base_communicator.BaseCommunicator`, as for gloo and mpi.
The reduction stages (tensor pieces per chunk, rank-ordered combining) are in
:mod:`accord.comm.shm.reduce`.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Sequence

import torch

from accord.comm import dtypes, memory
from accord.comm.base_communicator import BaseCommunicator
from accord.comm.dtypes import LIBRARY_OPS, is_integer
from accord.comm.ops import BITWISE_OPS, ReduceOp
from accord.comm.shm import segment as shm_segment
from accord.comm.shm.reduce import chunk_pieces, combine, reduction_stages, small_stages
from accord.comm.shm.segment import Layout
from accord.comm.shm.sync import PeerLostError
from accord.errors import BackendError, MismatchError, with_hint

_KINDS = ("?", "allreduce", "reduce", "reduce_scatter", "broadcast", "allgather", "gather", "scatter",
          "alltoall", "barrier")
_KIND = {name: i for i, name in enumerate(_KINDS)}
_NATIVE_REAL = (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.uint8,
                torch.int16, torch.int32, torch.int64)
_NATIVE_COMPLEX = (torch.complex64, torch.complex128)  # torch has no complex min/max
_SMALL_KEEP = 16  # sizes of one-chunk reductions whose slot views are kept


def _chunks(nbytes: int, chunk: int) -> int:
    return max(1, -(-nbytes // chunk))  # every op has at least one phase (its descriptor check)


class ShmCommunicator(BaseCommunicator):
    """A communicator over one shared-memory segment (made by ``ShmBackend.create``)."""

    backend_name = "shm"

    def __init__(self, ranks: tuple[int, ...], rank: int, buffer: Any, layout: Layout, sync: Any,
                 direct_max_ranks: int, split_min_bytes: int, segment_path: str) -> None:
        self.ranks = ranks
        self.rank = rank
        self.size = len(ranks)
        self.meta_device = torch.device("cpu")
        self.segment_path = segment_path  # already unlinked; kept for diagnostics and tests
        self.chunk_bytes = layout.chunk
        self._buffer = buffer
        self._layout = layout
        self._barrier_impl = sync
        self._direct = self.size <= direct_max_ranks
        self._split_min_bytes = split_min_bytes
        self._mem = torch.frombuffer(buffer, dtype=torch.uint8)
        self._views: dict[torch.dtype, list[list[torch.Tensor]]] = {}
        self._scratches: dict[torch.dtype, torch.Tensor] = {}
        self._small: dict[tuple[torch.dtype, int], list[list[torch.Tensor]]] = {}  # see _small_views
        self._meta_at = [[layout.meta(b, r) for r in range(self.size)] for b in (0, 1)]
        self._phase = 0  # barriers passed: identical on every rank between ops
        self._broken = ""
        self._lock = threading.Lock()
        pairs = [(dt, op) for dt in _NATIVE_REAL for op in LIBRARY_OPS]
        pairs += [(dt, op) for dt in _NATIVE_COMPLEX for op in (ReduceOp.SUM, ReduceOp.PRODUCT)]
        pairs += [(dt, op) for dt in _NATIVE_REAL if is_integer(dt) for op in BITWISE_OPS]
        self._set_native(pairs)

    def close(self) -> None:
        """Unmap the segment. Peers still waiting on this rank raise instead of timing out."""
        with self._lock:
            if self._buffer is None:
                return
            self._barrier_impl.abort()
            self._barrier_impl.close()
            self._views.clear()
            self._small.clear()
            self._scratches.clear()
            self._mem = None
            buffer, self._buffer = self._buffer, None
            try:
                buffer.close()
            except BufferError:
                pass  # a view still lives (e.g. in a traceback): the mapping goes when it does

    # ---- the pipeline ----
    def _areas(self, dtype: torch.dtype) -> list[list[torch.Tensor]]:
        """``[bank][i]``: rank i's slot (i < size) or the result area (i == size), typed."""
        areas = self._views.get(dtype)
        if areas is None:
            lay = self._layout
            areas = [[self._mem[off:off + lay.chunk].view(dtype)
                      for off in [lay.slot(b, r) for r in range(self.size)] + [lay.result(b)]]
                     for b in (0, 1)]
            self._views[dtype] = areas
        return areas

    def _run(self, kind: str, code: int, nbytes: int, root: int, chunks: int,
             stages: Sequence[Callable[[int, int], None]], extra: int = 0, agree_chunks: bool = False,
             vote: bool = False) -> bool:
        """Run chunk c's stage k in phase start + c + k (bank (start + c) % 2), barriers between.

        ``agree_chunks``: every rank passes its own ``chunks`` (in ``extra``) and all run the
        largest, learnt after the first barrier. ``vote``: ``extra`` is this rank's vote; when
        any rank's is non-zero, every rank stops after the first barrier, before any stage that
        writes an output, and returns False (True when the op ran to its end).
        """
        with self._lock:
            if self._buffer is None:
                raise BackendError(with_hint(f"{kind} on a closed shm communicator (ranks {list(self.ranks)})",
                                             "create a new communicator; this one was closed"))
            if self._broken:
                raise PeerLostError(f"the shm communicator is unusable after an earlier failure: {self._broken}")
            start = self._phase
            bank = start & 1
            shm_segment.write_meta(self._buffer, self._meta_at[bank][self.rank], _KIND[kind], code, nbytes,
                                   root, extra)
            depth = len(stages)
            try:
                if chunks == 1 and depth == 2 and not agree_chunks:  # most small ops: straight through
                    stages[0](0, bank)
                    self._wait()
                    if any(self._check_meta(bank, vote)):
                        return False  # a rank voted against: nothing written, every rank stops here
                    stages[1](0, bank)
                    return True
                last = chunks + depth - 2
                p = 0
                while p <= last:
                    if p == 1:
                        extras = self._check_meta(bank, agree_chunks or vote)
                        if vote and any(extras):
                            return False
                        if agree_chunks:
                            chunks = max(extras)
                            last = chunks + depth - 2
                    for k in range(depth - 1, -1, -1):
                        c = p - k
                        if 0 <= c < chunks:
                            stages[k](c, (start + c) & 1)
                    if p < last:
                        self._wait()
                    p += 1
                return True
            except MismatchError:
                raise  # every rank saw the same descriptors and raises at the same phase: still in step
            except BaseException as exc:
                # This rank leaves the op midway: the others must not wait for it.
                self._broken = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                self._barrier_impl.abort()
                raise

    def _wait(self) -> None:
        self._barrier_impl.wait()
        self._phase += 1

    def _check_meta(self, bank: int, extras: bool = False) -> list[int]:
        """Compare every rank's descriptor of this op; returns their ``extra`` fields if asked."""
        buffer, width = self._buffer, shm_segment.META_COMPARED
        raw = [buffer[at:at + width] for at in self._meta_at[bank]]
        if raw.count(raw[0]) != len(raw):
            metas = [shm_segment.read_meta(buffer, at) for at in self._meta_at[bank]]
            seen = ", ".join(f"rank {self.ranks[i]} called {_describe(m)}" for i, m in enumerate(metas))
            raise MismatchError(with_hint(
                f"Mismatched collectives on the shm communicator over ranks {list(self.ranks)}: {seen}",
                "every rank must call the same collectives in the same order, with the same dtype, "
                "op, root and number of elements"))
        return [shm_segment.read_meta(buffer, at)[4] for at in self._meta_at[bank]] if extras else []

    # ---- reductions ----
    def supports_allreduce_many(self, dtype: torch.dtype, op: ReduceOp) -> bool:
        """Whether :meth:`allreduce_many` reduces ``dtype`` (the wire dtype) with ``op`` natively."""
        return self._native(dtype, op)

    # allreduce_many takes ``postscale`` (the engine reads this to hand over its scaling)
    allreduce_many_scales = True

    def allreduce_many(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor],
                       op: ReduceOp, wire_dtype: torch.dtype | None = None, postscale: float = 1.0) -> None:
        """Allreduce the concatenation of ``inputs`` into ``outputs`` as one op.

        Chunks are filled straight from the inputs and reduced straight into the outputs, so a
        batch of gradients needs no fusion buffer. ``wire_dtype`` (default: the inputs' dtype)
        is what the shared slots hold and what the sum is computed in: floating inputs of
        another dtype are cast on the way in, and the result is cast into the outputs on the
        way out, so compression costs no pass of its own. ``postscale``: the outputs (floating)
        are multiplied by it, each chunk right after it is reduced, while it is in cache, with
        the bits of ``torch._foreach_mul_(outputs, postscale)`` after the op. Every rank must
        pass the same total size and wire dtype.

        Raises:
            ValueError: empty lists, different lengths or sizes, mixed dtypes without a wire
                dtype, a cast of a non-floating tensor, non-contiguous tensors, a (dtype, op)
                pair that :meth:`supports_allreduce_many` refuses, or a postscale for outputs
                that are not floating.
        """
        wire = self._check_many("allreduce_many", inputs, outputs, op, wire_dtype)
        postscale = self._check_postscale("allreduce_many", outputs, postscale)
        try:
            with torch.no_grad():
                self._reduce_into(inputs, outputs, op, None, wire, postscale=postscale)
        except (BackendError, MismatchError, ValueError):
            raise
        except RuntimeError as exc:
            raise self._failure("allreduce", exc) from exc

    def allreduce_voted(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor], op: ReduceOp,
                        vote: int, wire_dtype: torch.dtype | None = None, postscale: float = 1.0) -> bool:
        """:meth:`allreduce_many`, unless some rank votes against: every rank passes ``vote``
        (0: go ahead), which travels in the op's descriptor, not in the data. When any rank's
        vote is non-zero, no output is written on any rank and every rank returns False (the
        inputs were only read); otherwise the op runs and every rank returns True.

        The engine's planned cycles use this to ask "did every member follow the plan?" inside
        the data collective itself, without a control element appended to a staging copy.
        ``postscale``: as for :meth:`allreduce_many`.

        Raises:
            ValueError: as :meth:`allreduce_many`.
        """
        wire = self._check_many("allreduce_voted", inputs, outputs, op, wire_dtype)
        postscale = self._check_postscale("allreduce_voted", outputs, postscale)
        try:
            if not torch.is_grad_enabled():  # the engine's case: no context manager to build
                return self._reduce_into(inputs, outputs, op, None, wire, vote=int(vote), postscale=postscale)
            with torch.no_grad():
                return self._reduce_into(inputs, outputs, op, None, wire, vote=int(vote), postscale=postscale)
        except (BackendError, MismatchError, ValueError):
            raise
        except RuntimeError as exc:
            raise self._failure("allreduce", exc) from exc

    def _check_many(self, what: str, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor],
                    op: ReduceOp, wire_dtype: torch.dtype | None) -> torch.dtype:
        """The wire dtype of a piecewise allreduce, after checking its arguments (see
        :meth:`allreduce_many`)."""
        if not inputs or len(inputs) != len(outputs):
            raise ValueError(f"{what} needs equally many inputs and outputs, got "
                             f"{len(inputs)} and {len(outputs)}")
        wire = wire_dtype or inputs[0].dtype
        for t, o in zip(inputs, outputs):
            if t.numel() != o.numel():
                raise ValueError(f"{what}: input and output sizes differ: {t.dtype}[{t.numel()}] "
                                 f"-> {o.dtype}[{o.numel()}]")
            for x in (t, o):
                if x.dtype != wire and not (x.is_floating_point() and wire.is_floating_point):
                    raise ValueError(f"{what}: a {x.dtype} tensor cannot travel as {wire}; "
                                     "only floating tensors are cast to another floating wire dtype")
            if not (t.is_contiguous() and o.is_contiguous()):
                raise ValueError(f"{what} needs contiguous inputs and outputs")
        if not self._native(wire, op):
            raise ValueError(f"{what}: the shm backend does not reduce {wire} with {op.name} natively")
        return wire

    @staticmethod
    def _check_postscale(what: str, outputs: Sequence[torch.Tensor], postscale: float) -> float:
        postscale = float(postscale)
        if postscale != 1.0 and not all(o.is_floating_point() or o.is_complex() for o in outputs):
            raise ValueError(with_hint(
                f"{what}: postscale {postscale} for outputs of dtype {sorted({str(o.dtype) for o in outputs})}",
                "scale integer results yourself (only floating outputs are scaled in the op)"))
        return postscale

    def _small_views(self, dtype: torch.dtype, n: int) -> list[list[torch.Tensor]]:
        """``[bank][i]``: the first ``n`` elements of rank i's slot, typed; kept for the few
        sizes a job repeats (slicing them anew costs a torch op per slot and call)."""
        key = (dtype, n)
        views = self._small.get(key)
        if views is None:
            if len(self._small) >= _SMALL_KEEP:
                self._small.clear()
            views = self._small[key] = [[slot[:n] for slot in bank[:self.size]] for bank in self._areas(dtype)]
        return views

    def _scratch(self, dtype: torch.dtype) -> torch.Tensor:
        """A private chunk-sized area of ``dtype`` (reductions of many pieces land here first)."""
        area = self._scratches.get(dtype)
        if area is None:
            area = self._scratches[dtype] = torch.empty(self._layout.chunk // dtype.itemsize, dtype=dtype)
        return area

    def _reduce_into(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor], op: ReduceOp,
                     root: int | None, wire: torch.dtype | None = None, vote: int | None = None,
                     postscale: float = 1.0) -> bool:
        # (a 1-D tensor is its own flat view: every torch op saved counts for small ops)
        ins = [t if t.dim() == 1 else t.view(-1) for t in inputs]
        outs = [t if t.dim() == 1 else t.view(-1) for t in outputs]
        wire = wire or ins[0].dtype
        itemsize = wire.itemsize
        per = self._layout.chunk // itemsize
        me, size = self.rank, self.size
        receives = root is None or me == root
        kind = "allreduce" if root is None else "reduce"
        if len(ins) == 1 and 0 < ins[0].numel() <= per and ins[0].dtype == wire == outs[0].dtype:
            # One tensor in one chunk (latency-bound ops): slot views of exactly its size, kept.
            n = ins[0].numel()
            stages = small_stages(ins[0], outs[0], self._small_views(wire, n), me, size, op, receives)
            ran = self._run(kind, _op_code(wire, op), n * itemsize, -1 if root is None else root, 1, stages,
                            extra=vote or 0, vote=vote is not None)
            if ran and postscale != 1.0 and receives:
                outs[0].mul_(postscale)
            return ran
        pieces, numel = chunk_pieces([t.numel() for t in ins], per)
        areas = self._areas(wire)

        direct = self._direct or numel * itemsize < self._split_min_bytes
        in_place = all(o is i and o.dtype == wire for o, i in zip(outputs, inputs))
        stages = reduction_stages(ins, outs, pieces, areas, me, size, per, op, receives, direct,
                                  self._scratch(wire), in_place, postscale)
        return self._run(kind, _op_code(wire, op), numel * itemsize, -1 if root is None else root,
                         _chunks(numel * itemsize, per * itemsize), stages, extra=vote or 0, vote=vote is not None)

    def _allreduce_native(self, tensor: torch.Tensor, op: ReduceOp) -> None:
        self._reduce_into([tensor], [tensor], op, None)

    def _reduce_native(self, tensor: torch.Tensor, op: ReduceOp, root: int) -> None:
        self._reduce_into([tensor], [tensor], op, root)

    def _reduce_scatter_native(self, tensor: torch.Tensor, op: ReduceOp, rows: list[int],
                               out: torch.Tensor | None = None) -> torch.Tensor:
        # ``out`` may be this rank's own rows of ``tensor`` (in place): chunk c is reduced into
        # them one phase after it was copied into the slot, and only chunks already copied in
        # are written, so nothing is read after it was overwritten.
        if out is None:
            out = memory.empty((rows[self.rank], *tensor.shape[1:]), dtype=tensor.dtype)
        flat, mine = tensor.reshape(-1), out.view(-1)
        numel, itemsize = flat.numel(), flat.element_size()
        row = numel // tensor.shape[0] if tensor.shape[0] else 0
        first = sum(rows[:self.rank]) * row
        last = first + rows[self.rank] * row
        per = self._layout.chunk // itemsize
        areas, me = self._areas(flat.dtype), self.rank

        def copy_in(c: int, b: int) -> None:
            lo = c * per
            hi = min(numel, lo + per)
            areas[b][me][:hi - lo].copy_(flat[lo:hi])

        def reduce_mine(c: int, b: int) -> None:
            lo = c * per
            x, y = max(lo, first), min(lo + per, last)
            if y > x:
                combine(mine[x - first:y - first], areas[b], x - lo, y - lo, op, self.size)

        self._run("reduce_scatter", _op_code(flat.dtype, op), numel * itemsize, -1,
                  _chunks(numel * itemsize, per * itemsize), [copy_in, reduce_mine])
        return out

    # ---- data movement (flat uint8 tensors) ----
    def _broadcast_native(self, data: torch.Tensor, root: int) -> None:
        total, per, me = data.numel(), self._layout.chunk, self.rank
        areas = self._areas(torch.uint8)

        def copy_in(c: int, b: int) -> None:
            if me == root:
                lo = c * per
                hi = min(total, lo + per)
                areas[b][root][:hi - lo].copy_(data[lo:hi])

        def copy_out(c: int, b: int) -> None:
            if me != root:
                lo = c * per
                hi = min(total, lo + per)
                data[lo:hi].copy_(areas[b][root][:hi - lo])

        self._run("broadcast", 0, total, root, _chunks(total, per), [copy_in, copy_out])

    def _gathered(self, kind: str, data: torch.Tensor, counts: list[int], root: int,
                  out: torch.Tensor | None = None) -> torch.Tensor | None:
        per, me, size = self._layout.chunk, self.rank, self.size
        areas = self._areas(torch.uint8)
        starts = [sum(counts[:i]) for i in range(size)]
        # ``data`` may be this rank's own part of ``out`` (in place): copying out writes only
        # the other ranks' parts and this rank's own bytes back over themselves.
        if out is None and (root < 0 or me == root):
            out = memory.empty(sum(counts), dtype=torch.uint8)

        def copy_in(c: int, b: int) -> None:
            lo = c * per
            hi = min(counts[me], lo + per)
            if hi > lo:
                areas[b][me][:hi - lo].copy_(data[lo:hi])

        def copy_out(c: int, b: int) -> None:
            if out is None:
                return
            lo = c * per
            for j in range(size):
                hi = min(counts[j], lo + per)
                if hi > lo:
                    out[starts[j] + lo:starts[j] + hi].copy_(areas[b][j][:hi - lo])

        self._run(kind, 0, sum(counts), root, _chunks(max(counts), per), [copy_in, copy_out])
        return out

    def _allgatherv(self, data: torch.Tensor, counts: list[int], out: torch.Tensor | None = None) -> torch.Tensor:
        return self._gathered("allgather", data, counts, -1, out)

    def _gatherv(self, data: torch.Tensor, counts: list[int], root: int) -> torch.Tensor | None:
        return self._gathered("gather", data, counts, root)

    def _scatterv(self, data: torch.Tensor | None, counts: list[int], root: int) -> torch.Tensor:
        per, me, size = self._layout.chunk, self.rank, self.size
        areas = self._areas(torch.uint8)
        starts = [sum(counts[:i]) for i in range(size)]
        out = memory.empty(counts[me], dtype=torch.uint8)

        def copy_in(c: int, b: int) -> None:
            if me != root:
                return
            lo = c * per
            for j in range(size):
                hi = min(counts[j], lo + per)
                if hi > lo:
                    areas[b][j][:hi - lo].copy_(data[starts[j] + lo:starts[j] + hi])

        def copy_out(c: int, b: int) -> None:
            lo = c * per
            hi = min(counts[me], lo + per)
            if hi > lo:
                out[lo:hi].copy_(areas[b][me][:hi - lo])

        self._run("scatter", 0, sum(counts), root, _chunks(max(counts), per), [copy_in, copy_out])
        return out

    def _alltoallv(self, data: torch.Tensor, send: list[int], recv: list[int]) -> torch.Tensor:
        me, size = self.rank, self.size
        sub = self._layout.chunk // size  # rank i's slot holds one piece for every receiver
        areas = self._areas(torch.uint8)
        send_at = [sum(send[:j]) for j in range(size)]
        recv_at = [sum(recv[:i]) for i in range(size)]
        out = memory.empty(sum(recv), dtype=torch.uint8)

        def copy_in(c: int, b: int) -> None:
            lo = c * sub
            for j in range(size):
                hi = min(send[j], lo + sub)
                if hi > lo:
                    areas[b][me][j * sub:j * sub + hi - lo].copy_(data[send_at[j] + lo:send_at[j] + hi])

        def copy_out(c: int, b: int) -> None:
            lo = c * sub
            for i in range(size):
                hi = min(recv[i], lo + sub)
                if hi > lo:
                    out[recv_at[i] + lo:recv_at[i] + hi].copy_(areas[b][i][me * sub:me * sub + hi - lo])

        mine = _chunks(max(send), sub)
        self._run("alltoall", 0, 0, -1, mine, [copy_in, copy_out], extra=mine, agree_chunks=True)
        return out

    def _barrier(self) -> None:
        def nothing(c: int, b: int) -> None:
            return None

        self._run("barrier", 0, 0, -1, 1, [nothing, nothing])


def _op_code(dtype: torch.dtype, op: ReduceOp) -> int:
    return dtypes.dtype_code(dtype) * 16 + int(op)


def _describe(meta: tuple[int, int, int, int, int]) -> str:
    kind, code, nbytes, root, _ = meta
    name = _KINDS[kind] if 0 <= kind < len(_KINDS) else f"op #{kind}"
    text = f"{name} ({nbytes} bytes"
    if name in ("allreduce", "reduce", "reduce_scatter") and 0 <= code // 16 < len(dtypes.DTYPES):
        text += f", {str(dtypes.dtype_from_code(code // 16)).replace('torch.', '')} {ReduceOp(code % 16).name}"
    if root >= 0:
        text += f", root {root}"
    return text + ")"
