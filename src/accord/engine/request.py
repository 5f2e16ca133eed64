"""What a rank submits to the engine (a ``Request``), what ranks must agree on (its
``Signature``), and what the caller waits on (a ``Handle``)."""
from __future__ import annotations

import enum
import logging
import numbers
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Sequence

import torch

from accord.comm.ops import ReduceOp
from accord.engine.compression import Compressor, NoneCompressor, deferred_cast
from accord.errors import with_hint


class Op(str, enum.Enum):
    """The collectives the engine runs."""

    ALLREDUCE = "allreduce"
    ALLGATHER = "allgather"
    BROADCAST = "broadcast"
    ALLTOALL = "alltoall"
    REDUCESCATTER = "reducescatter"
    REDUCE = "reduce"
    GATHER = "gather"
    SCATTER = "scatter"
    BARRIER = "barrier"


# Ops whose first dimension may differ between ranks: only the trailing shape must agree.
OP_NAMES = {op: op.value for op in Op}  # a dict read is cheaper than Enum's .value descriptor
RAGGED_OPS = frozenset({Op.ALLGATHER, Op.ALLTOALL, Op.GATHER, Op.SCATTER})
ROOTED_OPS = frozenset({Op.BROADCAST, Op.REDUCE, Op.GATHER, Op.SCATTER})
REDUCING_OPS = frozenset({Op.ALLREDUCE, Op.REDUCESCATTER, Op.REDUCE})
_PLAIN_NUMBERS = (float, int)  # scale factors of these types need no check


_DTYPE_NAMES: dict = {None: ""}


def dtype_name(dtype: torch.dtype | None) -> str:
    """``torch.float32`` -> ``"float32"`` (what error messages and the wire show)."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).replace("torch.", "")
    return name


class Signature(NamedTuple):
    """Everything ranks must agree on for one name before the collective may run.

    ``shape`` is the full shape, or all but dim 0 for ragged ops. ``reduce_op`` / ``root`` are
    -1 where the op has none. ``wire_dtype`` is the dtype after compression. ``problem``: why
    this rank's arguments are unusable ("" when they are fine; see :attr:`Request.problem`).
    (A NamedTuple: one is built per submitted request, so construction cost matters.)
    """

    op: str
    dtype: str
    wire_dtype: str
    shape: tuple[int, ...]
    device: str
    reduce_op: int
    root: int
    prescale: float
    postscale: float
    process_set: int
    problem: str = ""

    def to_json(self) -> list:
        """A JSON-friendly list (field order as declared; ``problem`` only when set)."""
        data = [self.op, self.dtype, self.wire_dtype, list(self.shape), self.device,
                self.reduce_op, self.root, self.prescale, self.postscale, self.process_set]
        if self.problem:
            data.append(self.problem)
        return data

    @classmethod
    def from_json(cls, data: Sequence) -> "Signature":
        """Inverse of :meth:`to_json` (validates field count and types)."""
        if len(data) not in (10, 11):
            raise ValueError(f"signature has {len(data)} fields, expected 10 or 11")
        op, dtype, wire, shape, device, red, root, pre, post, pset = data[:10]
        return cls(str(op), str(dtype), str(wire), tuple(int(d) for d in shape), str(device),
                   int(red), int(root), float(pre), float(post), int(pset),
                   str(data[10]) if len(data) == 11 else "")


class Handle:
    """Completion of one request: ``done()``, ``wait()``, ``result()`` (re-raises the engine's error)."""

    # A bare lock held until completion: a fraction of threading.Event's creation cost, which
    # matters when a training step submits hundreds of gradients.
    __slots__ = ("name", "_gate", "_done", "_value", "_error", "owner", "_callbacks")

    def __init__(self, name: str) -> None:
        self.name = name
        self._gate = threading.Lock()
        self._gate.acquire()
        self._done = False
        self._value: Any = None
        self._error: BaseException | None = None
        self.owner: Any = None  # the engine's controller that runs the request (set at submit)
        self._callbacks: list[Callable[[Handle], None]] | None = None

    def done(self) -> bool:
        """True once the request has completed or failed."""
        return self._done

    def wait(self, timeout: float | None = None) -> bool:
        """Block until done (or ``timeout`` seconds); return ``done()``."""
        if not self._done and self._gate.acquire(timeout=-1 if timeout is None else max(timeout, 0)):
            self._gate.release()  # let the next waiter through
        return self._done

    def result(self) -> Any:
        """The collective's result; raises the engine's error if the request failed."""
        if not self._done:
            raise RuntimeError(f"request {self.name!r} has not completed; call wait() first")
        if self._error is not None:
            raise self._error
        return self._value

    def add_done_callback(self, callback: Callable[["Handle"], None]) -> None:
        """Call ``callback(handle)`` once the request completes or fails (at once if it has):
        on the engine's thread, so it must be short and must not wait on the engine. One
        callback per handle."""
        if self._callbacks is not None:
            raise RuntimeError(f"request {self.name!r} already has a done callback")
        self._callbacks = [callback]
        if self._done:
            self._run_callback()

    def _run_callback(self) -> None:
        # Both the engine and add_done_callback may get here; list.pop is atomic, so exactly
        # one of them runs the callback.
        try:
            callback = self._callbacks.pop()
        except (IndexError, AttributeError):
            return
        try:
            callback(self)
        except Exception:  # noqa: BLE001 (the engine's thread must go on completing others)
            logging.getLogger("accord.engine").exception("the done callback of %r failed", self.name)

    def _finish(self, value: Any, error: BaseException | None) -> None:
        if self._done:  # the first outcome wins
            return
        self._value, self._error = value, error
        self._done = True
        self._gate.release()
        if self._callbacks is not None:
            self._run_callback()

    def set_result(self, value: Any) -> None:
        """Complete the handle (engine side)."""
        self._finish(value, None)

    def set_exception(self, error: BaseException) -> None:
        """Fail the handle (engine side)."""
        self._finish(None, error)

    def __repr__(self) -> str:
        state = "failed" if self._error is not None else "done" if self.done() else "pending"
        return f"Handle({self.name!r}, {state})"


@dataclass(eq=False, slots=True)
class Request:
    """One named collective submitted by this rank.

    ``tensor`` is what goes on the wire (already compressed). ``output`` is the user's tensor for
    in-place ops (results are copied or reduced into it), or the output the caller gave an
    allgather or reducescatter (the communicator writes the result there), else None. ``owned``
    says the engine may overwrite ``tensor`` (it is the in-place target or a private copy).
    ``root_rank`` is a global rank. ``splits`` is per-rank rows for alltoall/scatter.
    ``wire_dtype`` (allreduce only): the engine casts ``tensor`` to this dtype for the wire and
    the result back into ``output`` while it moves the data (a deferred cast compression);
    None when ``tensor`` already is what goes on the wire. ``group``: (key, size) of the
    grouped call it belongs to (:mod:`accord.engine.naming`), None for a single request.
    ``problem``: why this rank's arguments are unusable, a message with a ``HINT:`` ("" when
    they are fine). Such a request is still submitted, never run: its signature carries the
    problem to the other ranks, and the negotiation fails the name on every rank (see
    :func:`accord.engine.negotiation.validate.refused_message`).
    """

    name: str
    op: Op
    tensor: torch.Tensor | None = None
    output: torch.Tensor | None = None
    reduce_op: ReduceOp = ReduceOp.SUM
    root_rank: int = -1
    prescale_factor: float = 1.0
    postscale_factor: float = 1.0
    process_set_id: int = 0
    splits: tuple[int, ...] | None = None
    compression: type[Compressor] | Compressor = NoneCompressor
    dtype: torch.dtype | None = None  # the caller's dtype (before compression)
    ctx: Any = None
    owned: bool = False
    ready_event: Any = None  # CUDA event recorded at submit (data ready on the producer stream)
    wire_dtype: torch.dtype | None = None
    group: tuple[str, int] | None = None
    problem: str = ""
    handle: Handle = field(init=False)
    signature: Signature = field(init=False)
    submitted_at: float = field(init=False)
    announced: bool = False  # already sent in a full exchange (the others know about it)
    nbytes: int = field(init=False)  # bytes this request puts on the wire

    def __post_init__(self) -> None:
        self.handle = Handle(self.name)
        self.submitted_at = time.monotonic()
        if self.dtype is None and self.tensor is not None:
            self.dtype = self.tensor.dtype
        if (type(self.root_rank) is not int or type(self.prescale_factor) not in _PLAIN_NUMBERS
                or type(self.postscale_factor) not in _PLAIN_NUMBERS):
            self._plain_arguments()
        self.signature = signature_of(self)
        if self.problem:
            self.signature = self.signature._replace(problem=self.problem)
        t = self.tensor
        if t is None:
            self.nbytes = 0
        elif self.wire_dtype is None:
            self.nbytes = t.nbytes
        else:
            self.nbytes = t.numel() * self.wire_dtype.itemsize

    def _plain_arguments(self) -> None:
        """Make the root a plain int and the scale factors plain floats (numpy numbers are
        fine); anything else is refused (``problem``), with a neutral value in the signature:
        raised here, on this rank alone, it would leave the peers waiting, and sent as is it
        cannot be encoded for them."""
        if isinstance(self.root_rank, numbers.Integral) and not isinstance(self.root_rank, bool):
            self.root_rank = int(self.root_rank)
        else:
            if self.op in ROOTED_OPS:
                self.refuse(with_hint(f"root_rank must be an int, got {self.root_rank!r}",
                                      "pass the global rank of the root"))
            self.root_rank = -1
        for field_name in ("prescale_factor", "postscale_factor"):
            value = getattr(self, field_name)
            if isinstance(value, numbers.Real) and not isinstance(value, bool):
                setattr(self, field_name, float(value))
            else:
                self.refuse(with_hint(f"{field_name} must be a number, got {value!r}",
                                      f"pass {field_name} as a float (1.0: no scaling)"))
                setattr(self, field_name, 1.0)

    def refuse(self, problem: str) -> None:
        """Mark the request unusable (see ``problem``); the first problem found is kept."""
        if not self.problem:
            self.problem = problem
            if hasattr(self, "signature"):  # (not yet while __post_init__ checks the arguments)
                self.signature = self.signature._replace(problem=problem)


def signature_of(request: Request) -> Signature:
    """The values every rank must agree on for ``request``."""
    # Built once per submitted request (hundreds per training step): attribute reads that
    # cost a device object (t.device.type) are avoided where a flag answers.
    t = request.tensor
    op = request.op
    if t is None:
        shape: tuple[int, ...] = ()
        wire, device = "", ""
    else:
        shape = tuple(t.shape)
        wire = dtype_name(request.wire_dtype or t.dtype)
        device = "cpu" if t.is_cpu else t.device.type
        if op in RAGGED_OPS:
            shape = shape[1:]
    if op in REDUCING_OPS:
        return Signature(OP_NAMES[op], dtype_name(request.dtype), wire, shape, device,
                         int(request.reduce_op), request.root_rank if op in ROOTED_OPS else -1,
                         float(request.prescale_factor), float(request.postscale_factor),
                         request.process_set_id)
    return Signature(OP_NAMES[op], dtype_name(request.dtype), wire, shape, device, -1,
                     request.root_rank if op in ROOTED_OPS else -1, 1.0, 1.0, request.process_set_id)


def build_request(op: Op, tensor: torch.Tensor | None, name: str, *, in_place: bool = False,
                  compression: type[Compressor] | Compressor = NoneCompressor,
                  reduce_op: ReduceOp = ReduceOp.SUM, root_rank: int = -1,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                  process_set_id: int = 0, splits: Sequence[int] | None = None,
                  wire_buffers: dict[str, torch.Tensor] | None = None,
                  group: tuple[str, int] | None = None, problem: str = "",
                  output: torch.Tensor | None = None) -> Request:
    """Make a request the way frontends do: compress now, decide who owns what.

    ``in_place`` (allreduce, broadcast): the result is written into ``tensor``. Otherwise the
    engine never writes into ``tensor`` (unless ``output`` is a view of it); it must not change
    until the handle completes. ``output`` (allgather, reducescatter): the tensor the result is
    written into and returned as, checked by the frontend (shape, dtype, device, contiguity;
    an allgather's total rows by the communicator, on every rank); it may be this rank's own
    rows of ``tensor`` (the in-place forms).
    ``wire_buffers``: name -> compressed tensor of an earlier request under this name, reused
    (and updated) by compressors that can write into a buffer. The caller guarantees that no
    request under ``name`` is still in flight. ``problem``: what the frontend refuses in the
    arguments (:attr:`Request.problem`); such a request is not compressed, it never runs.
    """
    if in_place and op not in (Op.ALLREDUCE, Op.BROADCAST):
        raise ValueError(f"{op.value} cannot run in place: its output has another shape")
    if output is not None and (in_place or op not in (Op.ALLGATHER, Op.REDUCESCATTER)):
        raise ValueError(f"{op.value} takes no output tensor (only allgather and reducescatter do)")
    cast = None
    if compression is NoneCompressor or tensor is None or problem:
        wire, ctx = tensor, None  # the common case (gradients, no compression) costs nothing here
    elif op is Op.ALLREDUCE and in_place and (cast := deferred_cast(compression, tensor)) is not None:
        wire, ctx = tensor, None  # a deferred cast: the engine casts while it moves the data
    elif wire_buffers is not None and (into := getattr(compression, "compress_into", None)) is not None:
        wire, ctx = into(tensor, wire_buffers.get(name))
        if wire is not tensor:
            wire_buffers[name] = wire
    else:
        wire, ctx = compression.compress(tensor)
    return Request(
        name, op, wire, output=tensor if in_place else output,
        reduce_op=reduce_op if type(reduce_op) is ReduceOp else ReduceOp(reduce_op),
        root_rank=root_rank, prescale_factor=prescale_factor, postscale_factor=postscale_factor,
        process_set_id=process_set_id, splits=None if splits is None else tuple(int(s) for s in splits),
        compression=compression, dtype=None if tensor is None else tensor.dtype, ctx=ctx,
        owned=in_place or (tensor is not None and wire is not tensor), wire_dtype=cast, group=group,
        problem=problem)
