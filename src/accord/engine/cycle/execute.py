"""Running ready requests on their communicators: fused allreduces and one-by-one ops.

Called only from the engine thread, with requests already agreed by every rank and in the same
order everywhere. Errors that every rank hits identically (a dtype the backend cannot reduce)
fail just those requests; anything else from a collective means the communicator is unusable
and is raised as :class:`CommunicationFailure` for the engine to stop on.
"""
from __future__ import annotations

import contextlib
import inspect
import time
from typing import Any, Callable, Sequence

import torch

from accord.comm import memory
from accord.comm.backend import Communicator
from accord.comm.base_communicator import split_rows
from accord.comm.dtypes import scale_
from accord.comm.ops import ReduceOp
from accord.engine.compression import decompress_into
from accord.engine.cycle.failure import CommunicationFailure
from accord.engine.cycle.fusion import FusionBuffers, StagingBuffers, adjacent_span, copy_out, pack, plan_work, unpack
from accord.engine.cycle.timeline import Timeline
from accord.engine.request import Op, Request
from accord.engine.sets import ProcessSetRegistry
from accord.errors import AccordError, BackendError, CollectiveError, MismatchError, with_hint

Outcome = tuple[Request, Any, "BaseException | None"]
Complete = Callable[[Sequence[Outcome]], None]


def wire_reduction(op: ReduceOp, dtype: torch.dtype, postscale: float, n: int) -> tuple[ReduceOp, float]:
    """(op to send, postscale to apply): floating AVERAGE becomes SUM with 1/n folded in."""
    if op == ReduceOp.AVERAGE and (dtype.is_floating_point or dtype.is_complex):
        return ReduceOp.SUM, postscale / n
    return op, postscale


def _comm_call(fn: Callable[..., Any], *args: Any) -> Any:
    """Call a collective. Argument problems (raised identically on every rank before any data
    moves) fail only the request; anything the library raised mid-collective (a peer died,
    a timeout: RankFailedError and other CollectiveErrors, raw RuntimeErrors) leaves the
    communicator unusable and becomes CommunicationFailure."""
    try:
        return fn(*args)
    except (ValueError, TypeError, MismatchError, BackendError):
        raise
    except Exception as exc:
        raise CommunicationFailure([], exc) from exc


def _scattered_ok(comm: Any, batch: Sequence[Request], wire: torch.dtype, op: ReduceOp, pre: float,
                  post: float) -> bool:
    """Whether ``comm`` can reduce ``batch`` in place of a fusion buffer (see ScatteredAllreduce)."""
    supports = getattr(comm, "supports_allreduce_many", None)
    first = batch[0].tensor
    if supports is None or first.device.type != "cpu" or not supports(wire, op):
        return False
    if (pre != 1.0 or post != 1.0) and not first.is_floating_point():
        return False  # integer scaling truncates through float64: leave it to scale_
    if pre != 1.0 and not all(r.owned for r in batch):
        return False
    return all(r.tensor.is_contiguous() and not r.tensor.requires_grad for r in batch)


def _wait_for_gpu(item: Sequence[Request]) -> None:
    """Let a CUDA item's results be complete before its handles are: every path (fused copies
    out, tuples, in place) ends on this thread's stream, which is synchronized once here."""
    first = item[0].tensor
    if first is not None and first.is_cuda:
        torch.cuda.current_stream(first.device).synchronize()


def _as_reduced(r: Request) -> bool:
    """Whether ``r``'s result is its reduced wire data as is (a passthrough compression, no
    context to decompress with): copied out, never converted."""
    return r.ctx is None and r.compression.passthrough


def _plain_lone(item: Sequence[Request]) -> torch.Tensor | None:
    """The tensor of a one-request item whose result needs no conversion (see
    :func:`_as_reduced`, no deferred cast, an in-place output of its own dtype), else None."""
    if len(item) != 1:
        return None
    r = item[0]
    t = r.tensor
    if (not _as_reduced(r) or r.wire_dtype is not None or not t.is_contiguous()
            or (r.output is not None and r.output.dtype != t.dtype)):
        return None
    return t


def _direct_output(r: Request) -> torch.Tensor | None:
    """The caller's output of an allgather or reducescatter when the communicator can write the
    result straight into it (the wire carries the caller's data as is), else None (the result
    is then converted or copied into it, see :meth:`Executor._finish`)."""
    out = r.output
    if out is None or not _as_reduced(r) or out.dtype != r.tensor.dtype:
        return None
    return out


_TAKES_OUT: dict[tuple[type, str], bool] = {}


def _with_output(comm: Any, method: str, out: torch.Tensor | None, *args: Any) -> Any:
    """``comm.<method>(*args, out)``; a communicator of a library that takes no ``out`` (an
    older plug-in) is called without it, and its result is copied in by the caller."""
    fn = getattr(comm, method)
    if out is None:
        return _comm_call(fn, *args)
    key = (type(comm), method)
    takes = _TAKES_OUT.get(key)
    if takes is None:
        try:
            takes = "out" in inspect.signature(fn).parameters
        except (TypeError, ValueError):
            takes = False
        _TAKES_OUT[key] = takes
    return _comm_call(fn, *args, out) if takes else _comm_call(fn, *args)


def _wire_dtype(batch: Sequence[Request]) -> torch.dtype:
    """What the batch's data travels as (fusion keys make it the same for every member)."""
    first = batch[0]
    return first.wire_dtype or first.tensor.dtype


class Executor:
    """Executes work items; reports each item's outcomes at once through ``complete``."""

    def __init__(self, sets: ProcessSetRegistry, fusion_threshold: int, complete: Complete) -> None:
        self.sets = sets
        self.fusion_threshold = fusion_threshold
        self.complete = complete
        self.buffers = FusionBuffers()
        self.staging = StagingBuffers()
        self.timeline: Timeline | None = None
        self.collectives = 0  # data-plane collectives issued (tests and benchmarks read it)

    def run(self, ready: Sequence[Request], control: float | None = None) -> bool:
        """Execute ``ready`` (this rank's requests, in agreed order).

        ``control`` (a planned cycle, see :mod:`accord.engine.cycle.plan`): the first work item, a
        floating SUM/AVERAGE allreduce, carries one extra element summing every rank's
        ``control``; when that sum is not 0 some rank did not follow the plan, nothing is
        completed and False is returned (the same on every rank).
        """
        for index, item in enumerate(plan_work(ready, self.fusion_threshold)):
            first = item[0]
            # The current CUDA device is per thread and this thread never chose one: run a CUDA
            # item under its tensors' device, so metadata and buffers land there, not on cuda:0.
            device = torch.cuda.device(first.tensor.device) if first.tensor is not None and \
                first.tensor.is_cuda else contextlib.nullcontext()
            if index == 0 and control is not None:
                self._wait_for_data(item)
                with device:
                    if not self._controlled(item, control):
                        return False
                continue
            try:
                comm = self.sets.communicator(first.process_set_id, first.signature.device or "cpu")
                if comm is None:
                    raise CollectiveError(f"rank is not in process set {first.process_set_id}")
                self._wait_for_data(item)
                with device:
                    if first.op is Op.ALLREDUCE:
                        outcomes = self._allreduce(item, comm)
                    else:
                        outcomes = [(first, self._one(first, comm), None)]
                    _wait_for_gpu(item)
            except CommunicationFailure as failure:
                failure.requests = list(item)
                raise
            except (ValueError, TypeError, AccordError) as exc:
                outcomes = [(r, None, exc) for r in item]
            # One completion per item, not per request: waking the caller's thread 160 times
            # would make both threads fight over the GIL while outputs are still being copied.
            self.complete(outcomes)
        return True

    def _controlled(self, item: list[Request], control: float) -> bool:
        """Run ``item`` (a floating SUM/AVERAGE allreduce; its CUDA data already written, see
        :meth:`_wait_for_data`) through a buffer with ``control`` appended; complete it only
        when the summed control is 0. On CUDA, reading the control waits for the collective."""
        first = item[0]
        comm = self.sets.communicator(first.process_set_id, first.signature.device or "cpu")
        if comm is None:
            raise CollectiveError(f"rank is not in process set {first.process_set_id}")
        sig = first.signature
        wire_dtype = _wire_dtype(item)
        op, post = wire_reduction(ReduceOp(sig.reduce_op), wire_dtype, sig.postscale, comm.size)
        # Decided from the communicator and the signature only (the same on every member), so
        # that every member puts the same layout on the wire: the vote beside the data (shm),
        # or one extra element of it.
        if getattr(comm, "allreduce_voted", None) is not None and comm.supports_allreduce_many(wire_dtype, op):
            return self._voted(item, comm, wire_dtype, op, post, control)
        t0 = time.monotonic()
        lone = _plain_lone(item)
        if lone is not None:
            buf, data, ctl = self.staging.get(lone.device, wire_dtype, lone.numel())
            data.copy_(lone.view(-1))
        else:
            tensors = [r.tensor for r in item]
            numel = sum(t.numel() for t in tensors)
            buf = self.buffers.get(first.tensor.device, wire_dtype, numel + 1)
            data, ctl = buf[:numel], buf[numel:]
            pack(tensors, data)
        ctl.fill_(control)
        t1 = time.monotonic()
        self._reduce(comm, buf, op, sig.prescale, post)
        t2 = time.monotonic()
        if ctl.item() != 0:
            return False
        if lone is None:
            outcomes = self._unfuse(item, data)
        elif first.output is None:  # the staging buffer is reused: the caller gets a copy
            outcomes = [(first, data.view(lone.shape).clone(), None)]
        else:
            first.output.copy_(data.view(lone.shape))
            outcomes = [(first, first.output, None)]
        _wait_for_gpu(item)  # the copies out, before any handle completes
        if self.timeline is not None:
            self._span(item, "MEMCPY_IN_FUSION_BUFFER", t0, t1)
            self._span(item, "ALLREDUCE", t1, t2)
            self._span(item, "MEMCPY_OUT_FUSION_BUFFER", t2, time.monotonic())
        self.complete(outcomes)
        return True

    def _voted(self, item: list[Request], comm: Any, wire: torch.dtype, op: ReduceOp, post: float,
               control: float) -> bool:
        """:meth:`_controlled` on a communicator that carries each rank's vote beside the data
        (``allreduce_voted``): a plain lone request is reduced straight from its tensor into
        its output (no staging copy in or out, no control element to read back); anything
        else goes through the fusion buffer, exactly its size. Nothing is written into an
        output unless every member voted 0."""
        first = item[0]
        sig = first.signature
        t0 = time.monotonic()
        lone = _plain_lone(item)
        buf = None
        if lone is not None and sig.prescale == 1.0:  # a prescale must not touch the caller's tensor first
            out = first.output if first.output is not None else memory.empty_like(lone)
            ins, outs = [lone], [out]
        elif len(item) > 1 and sig.prescale == 1.0 and _scattered_ok(comm, item, wire, op, 1.0, post):
            # A batch straight from its tensors into its outputs, as an unplanned cycle runs it
            # (no fusion buffer); each rank's choice may differ, the op on the wire does not.
            return self._voted_scattered(item, comm, wire, op, post, control, t0)
        else:
            tensors = [r.tensor for r in item]
            buf = self.buffers.get(first.tensor.device, wire, sum(t.numel() for t in tensors))
            pack(tensors, buf)
            scale_(buf, sig.prescale)
            ins = outs = [buf]
        t1 = time.monotonic()
        ran = _comm_call(comm.allreduce_voted, ins, outs, op, int(control != 0), wire)
        self.collectives += 1
        t2 = time.monotonic()
        if not ran:
            return False
        scale_(outs[0], post)
        outcomes = [(first, out, None)] if buf is None else self._unfuse(item, buf)
        if self.timeline is not None:
            if buf is not None:
                self._span(item, "MEMCPY_IN_FUSION_BUFFER", t0, t1)
            self._span(item, "ALLREDUCE", t1, t2)
            if buf is not None:
                self._span(item, "MEMCPY_OUT_FUSION_BUFFER", t2, time.monotonic())
        self.complete(outcomes)
        return True

    def _voted_scattered(self, item: list[Request], comm: Any, wire: torch.dtype, op: ReduceOp, post: float,
                         control: float, t0: float) -> bool:
        """:meth:`_voted` for a batch the communicator reduces piecewise (see
        :meth:`_allreduce_scattered`): nothing is written unless every member voted 0."""
        inputs = [r.tensor for r in item]
        outputs = [r.tensor if r.owned else memory.empty_like(r.tensor) for r in item]
        scales = post != 1.0 and getattr(comm, "allreduce_many_scales", False)
        if scales:
            ran = _comm_call(comm.allreduce_voted, inputs, outputs, op, int(control != 0), wire, post)
        else:
            ran = _comm_call(comm.allreduce_voted, inputs, outputs, op, int(control != 0), wire)
        self.collectives += 1
        if not ran:
            return False
        if post != 1.0 and not scales:
            torch._foreach_mul_(outputs, post)
        if self.timeline is not None:
            self._span(item, "ALLREDUCE", t0, time.monotonic())
        self.complete([(r, self._finish(r, o), None) for r, o in zip(item, outputs)])
        return True

    # --- helpers -------------------------------------------------------------------------

    def _span(self, reqs: Sequence[Request], phase: str, start: float, end: float) -> None:
        tl = self.timeline
        if tl is not None:
            for r in reqs:
                tl.span(r.name, phase, start, end)

    def _wait_for_data(self, item: Sequence[Request]) -> None:
        start = time.monotonic()
        for r in item:
            if r.ready_event is not None:  # CUDA: the producer stream must have written it
                r.ready_event.synchronize()
        if self.timeline is not None:
            self._span(item, "WAIT_FOR_DATA", start, time.monotonic())

    def _finish(self, r: Request, result: Any) -> Any:
        """Decompress into the output (or a private tensor); return the request's value.

        Raises:
            ValueError: the caller's output of an allgather or reducescatter that the
                communicator did not write into has another shape than the result.
        """
        if result is not None and result is r.output and r.ctx is None and r.compression.passthrough \
                and not result.is_cuda:
            return result  # reduced in place (a gradient): nothing to convert or copy
        if isinstance(result, torch.Tensor):
            if r.output is not None and result is not r.output and r.output.shape != result.shape:
                raise ValueError(with_hint(
                    f"{r.op.value} {r.name!r}: the output has shape {list(r.output.shape)}, the "
                    f"result has shape {list(result.shape)}", f"pass an output of shape {list(result.shape)}"))
            if r.output is not None:
                decompress_into(r.compression, result, r.ctx, r.output)
                value = r.output
            else:
                value = r.compression.decompress(result, r.ctx)
            if r.output is None and self.buffers.owns(value):
                value = memory.clone(value)
            return value  # CUDA: run() waits for the stream once per item (_wait_for_gpu)
        if isinstance(result, tuple) and result and isinstance(result[0], torch.Tensor):
            return (r.compression.decompress(result[0], r.ctx), *result[1:])
        return result

    def _private(self, r: Request) -> torch.Tensor:
        """A tensor the collective may overwrite (the request's own, or a copy)."""
        return r.tensor if r.owned else memory.clone(r.tensor)

    # --- allreduce (fused) ---------------------------------------------------------------

    def _allreduce(self, batch: list[Request], comm: Communicator) -> list[Outcome]:
        sig = batch[0].signature
        wire_dtype = _wire_dtype(batch)
        wire = batch[0].tensor
        op, post = wire_reduction(ReduceOp(sig.reduce_op), wire_dtype, sig.postscale, comm.size)
        # Requests with a deferred cast travel through a buffer (or the communicator's slots)
        # of the wire dtype: the copy in and out is the cast.
        cast = any(r.wire_dtype is not None for r in batch)
        # A lone contiguous request is reduced in place (its own tensor or a private clone), and
        # so is a batch whose tensors already lie back to back in one storage.
        fused = len(batch) > 1 or not wire.is_contiguous() or cast
        t0 = time.monotonic()
        tensors = [r.tensor for r in batch]
        span = adjacent_span(tensors) if fused and not cast and all(r.owned for r in batch) else None
        if span is None and fused and _scattered_ok(comm, batch, wire_dtype, op, sig.prescale, post):
            return self._allreduce_scattered(batch, comm, wire_dtype, op, sig.prescale, post)
        if span is not None:
            buf = span
        elif fused:
            buf = self.buffers.get(wire.device, wire_dtype, sum(t.numel() for t in tensors))
            pack(tensors, buf)
        else:
            buf = self._private(batch[0])
        t1 = time.monotonic()
        self._reduce(comm, buf, op, sig.prescale, post)
        t2 = time.monotonic()
        if span is not None or not fused:
            outcomes = [(r, self._finish(r, r.tensor if fused else buf), None) for r in batch]
        else:
            outcomes = self._unfuse(batch, buf)
        t3 = time.monotonic()
        if self.timeline is not None:
            if span is None and buf is not wire:
                self._span(batch, "MEMCPY_IN_FUSION_BUFFER", t0, t1)
            self._span(batch, "ALLREDUCE", t1, t2)
            if fused and span is None:
                self._span(batch, "MEMCPY_OUT_FUSION_BUFFER", t2, t3)
        return outcomes

    def _allreduce_scattered(self, batch: list[Request], comm: Any, wire: torch.dtype, op: ReduceOp,
                             pre: float, post: float) -> list[Outcome]:
        """A batch reduced piecewise by a communicator that needs no fusion buffer (shm)."""
        t1 = time.monotonic()
        inputs = [r.tensor for r in batch]
        outputs = [r.tensor if r.owned else memory.empty_like(r.tensor) for r in batch]
        if pre != 1.0:  # only owned (overwritable) batches come here with a prescale
            torch._foreach_mul_(inputs, pre)
        if post != 1.0 and getattr(comm, "allreduce_many_scales", False):
            # scaled chunk by chunk inside the op, while each is in cache: no pass of its own
            _comm_call(comm.allreduce_many, inputs, outputs, op, wire, post)
        else:
            _comm_call(comm.allreduce_many, inputs, outputs, op, wire)
            if post != 1.0:
                torch._foreach_mul_(outputs, post)
        self.collectives += 1
        if self.timeline is not None:
            self._span(batch, "ALLREDUCE", t1, time.monotonic())
        return [(r, self._finish(r, o), None) for r, o in zip(batch, outputs)]

    def _reduce(self, comm: Communicator, buf: torch.Tensor, op: ReduceOp, pre: float, post: float) -> None:
        """Scale, allreduce in place, scale: one data collective."""
        scale_(buf, pre)
        _comm_call(comm.allreduce, buf, op)
        scale_(buf, post)
        self.collectives += 1

    def _unfuse(self, batch: list[Request], buf: torch.Tensor) -> list[Outcome]:
        parts = unpack(buf, [r.tensor for r in batch])
        # Plain in-place requests (the common case: gradients) are copied out in one call.
        plain = [i for i, r in enumerate(batch) if r.output is not None and _as_reduced(r)
                 and r.output.dtype == r.tensor.dtype]
        copy_out([parts[i] for i in plain], [batch[i].output for i in plain])
        outcomes: list[Outcome] = [(batch[i], batch[i].output, None) for i in plain]
        # Plain out-of-place requests get fresh tensors, filled in one call too (one by one,
        # 160 results of a step cost about as much as the 16 MB allreduce's fixed overhead).
        fresh = [i for i, r in enumerate(batch) if r.output is None and _as_reduced(r) and r.wire_dtype is None]
        if fresh:
            outs = [memory.empty(batch[i].tensor.shape, parts[i].dtype, parts[i].device) for i in fresh]
            copy_out([parts[i] for i in fresh], outs)
            outcomes += [(batch[i], out, None) for i, out in zip(fresh, outs)]
        if len(plain) + len(fresh) < len(batch):
            skip = set(plain) | set(fresh)
            outcomes += [(r, self._finish(r, p.view(r.tensor.shape)), None)
                         for i, (r, p) in enumerate(zip(batch, parts)) if i not in skip]
        return outcomes

    # --- everything else, one request at a time ------------------------------------------

    def _one(self, r: Request, comm: Communicator) -> Any:
        t1 = time.monotonic()
        result = self._dispatch(r, comm)
        self.collectives += 1
        if self.timeline is not None:
            self._span([r], r.op.value.upper(), t1, time.monotonic())
        return self._finish(r, result)

    def _dispatch(self, r: Request, comm: Communicator) -> Any:
        root = comm.ranks.index(r.root_rank) if r.root_rank >= 0 else -1
        me_root = comm.rank == root
        if r.op is Op.BROADCAST:
            t = self._private(r)
            _comm_call(comm.broadcast, t, root)
            return t
        if r.op is Op.ALLGATHER:
            return _with_output(comm, "allgather", _direct_output(r), r.tensor)
        if r.op is Op.GATHER:
            return _comm_call(comm.gather, r.tensor, root)
        if r.op is Op.SCATTER:
            chunks = None
            if me_root:
                splits = list(r.splits) if r.splits else split_rows(r.tensor.shape[0], comm.size)
                chunks = list(torch.split(r.tensor, splits))
            return _comm_call(comm.scatter, chunks, root)
        if r.op is Op.ALLTOALL:
            return _comm_call(comm.alltoall, r.tensor, list(r.splits) if r.splits is not None else None)
        if r.op is Op.BARRIER:
            _comm_call(comm.barrier)
            return None
        # reducing ops with prescale/postscale
        sig = r.signature
        op, post = wire_reduction(ReduceOp(sig.reduce_op), r.tensor.dtype, sig.postscale, comm.size)
        t = r.tensor
        if sig.prescale != 1.0 or r.op is Op.REDUCE:
            t = self._private(r)
            scale_(t, sig.prescale)
        if r.op is Op.REDUCESCATTER:
            out = _with_output(comm, "reduce_scatter", _direct_output(r), t, op)
            scale_(out, post)
            return out
        if r.op is Op.REDUCE:
            _comm_call(comm.reduce, t, op, root)
            if not me_root:
                return None
            scale_(t, post)
            return t
        raise ValueError(f"unknown op {r.op!r}")
