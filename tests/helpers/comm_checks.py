"""One suite of communicator checks, run on every rank of a job, for any backend.

``run_checks(backend, rank, size)`` creates communicators over the full set and a subset of the
ranks and runs every collective x op x dtype through them. Each rank regenerates every rank's
input from a seed (case name + global rank), computes the expected result with numpy, and
compares. Failures are collected (not raised) so that one wrong value does not desynchronise
the ranks; the caller asserts the returned list is empty.

Inputs use every bit of their dtype (:func:`helpers.values.random_values`): a float32 tensor
that crossed the wire as 16 bits, or a float64 one as 32, would not come back the same.
Copies (broadcast, allgather, alltoall, scatter, gather) and min/max/integer/bool reductions
must match bit for bit; floating sums, averages and products must stay within
:func:`helpers.values.reduce_tolerance` (dtype, number of ranks, magnitudes).
"""
from __future__ import annotations

import functools
import zlib
from typing import Any, Callable

import numpy as np
import torch

from accord.comm.backend import Communicator
from accord.comm.base_communicator import split_rows
from accord.comm.ops import ReduceOp
from accord.errors import BackendError, MismatchError
from helpers import groups
from helpers.values import bits_equal, random_values, reduce_tolerance, to_tensor, within

SUM, AVG, MIN, MAX, PROD = ReduceOp.SUM, ReduceOp.AVERAGE, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT
OPS = (SUM, AVG, MIN, MAX, PROD)
FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
INTS = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32, torch.uint64)
COMPLEX = (torch.complex64, torch.complex128)
DTYPES = FLOATS + INTS + (torch.bool,) + COMPLEX
_OP_NAMES = {SUM: "sum", AVG: "average", MIN: "min", MAX: "max", PROD: "product"}


def _np_dtype(dtype: torch.dtype) -> Any:
    return torch.empty(0, dtype=dtype).numpy().dtype


def values(case: str, grank: int, shape: tuple, dtype: torch.dtype, op: ReduceOp | None = None) -> np.ndarray:
    """Rank ``grank``'s input for ``case``: every bit of ``dtype`` used (see random_values)."""
    if dtype == torch.bool or dtype.is_floating_point or dtype.is_complex:
        return random_values(f"{case}|{grank}", shape, dtype, spread=0 if op == PROD else 3)
    rng = np.random.default_rng(zlib.crc32(f"{case}|{grank}".encode()))
    npd = _np_dtype(dtype)
    info = np.iinfo(npd)
    low, high = int(info.min), int(info.max)
    if op == AVG and info.bits == 64:
        low, high = max(low, -(2**40)), min(high, 2**40)  # keep the exact sum inside 64 bits
    return rng.integers(low, high, size=shape, endpoint=True, dtype=npd)


def expected_reduce(arrays: list[np.ndarray], op: ReduceOp, dtype: torch.dtype) -> np.ndarray:
    """The reduction of every rank's input, computed independently with numpy."""
    if dtype == torch.bool:
        fn = np.logical_or if op in (SUM, MAX) else np.logical_and
        return functools.reduce(fn, arrays)
    if dtype.is_floating_point or dtype.is_complex:
        stack = np.stack([a.astype(np.complex128 if dtype.is_complex else np.float64) for a in arrays])
        return {SUM: np.sum, AVG: np.mean, MIN: np.min, MAX: np.max, PROD: np.prod}[op](stack, axis=0)
    if op == AVG:  # exact sum in Python ints, quotient truncated toward zero
        total = sum(a.astype(object) for a in arrays)
        n = len(arrays)
        trunc = np.vectorize(lambda s: -((-s) // n) if s < 0 else s // n, otypes=[object])
        return trunc(total).astype(arrays[0].dtype)
    fn = {SUM: np.add, MIN: np.minimum, MAX: np.maximum, PROD: np.multiply}[op]
    with np.errstate(over="ignore"):
        return functools.reduce(fn, arrays)  # wraps around like the native integer type


def tolerance(arrays: list[np.ndarray], op: ReduceOp, dtype: torch.dtype) -> Any:
    """The bound for reducing ``arrays`` by ``op`` in ``dtype``; None where bits must match."""
    if not (dtype.is_floating_point or dtype.is_complex) or op in (MIN, MAX):
        return None
    return reduce_tolerance(arrays, _OP_NAMES[op], dtype)


def refused(dtype: torch.dtype, op: ReduceOp) -> bool:
    """Pairs every backend must refuse with ValueError."""
    return ((dtype == torch.bool and op == AVG) or (dtype.is_complex and op in (MIN, MAX))
            or (dtype == torch.uint64 and op == AVG))


class Checks:
    """Collects failures on one rank for one communicator."""

    def __init__(self, comm: Any, label: str) -> None:
        self.comm = comm
        self.label = label
        self.members = list(comm.ranks)
        self.me = comm.ranks[comm.rank]
        self.count = 0
        self.failures: list[str] = []

    def fail(self, what: str, detail: str) -> None:
        self.failures.append(f"[{self.label} rank {self.me}] {what}: {detail}")

    def equal(self, what: str, actual: torch.Tensor | None, expected: np.ndarray, dtype: torch.dtype,
              bound: Any = None) -> None:
        """``actual`` holds ``expected`` in ``dtype``: bit for bit, or within ``bound`` (a
        scalar or elementwise bound from :func:`tolerance`) when one is given."""
        self.count += 1
        if actual is None or actual.dtype != dtype or tuple(actual.shape) != tuple(np.shape(expected)):
            got = None if actual is None else f"{actual.dtype} {tuple(actual.shape)}"
            self.fail(what, f"got {got}, expected {dtype} {tuple(np.shape(expected))}")
            return
        ok = bits_equal(actual, expected, dtype) if bound is None else within(actual, expected, bound)
        if not ok:
            wide = actual.detach().to(torch.complex128 if dtype.is_complex else torch.float64
                                      if dtype.is_floating_point else actual.dtype).numpy()
            worst = ""
            if bound is not None:
                err = np.abs(wide - expected) - bound
                i = int(np.argmax(err))
                worst = f" (worst element {i}: off by {np.abs(wide - expected).ravel()[i]:.3g}, " \
                        f"bound {np.broadcast_to(bound, np.shape(expected)).ravel()[i]:.3g})"
            self.fail(what, f"got {wide.ravel()[:6].tolist()}, expected "
                            f"{np.asarray(expected).ravel()[:6].tolist()}{worst}")

    def raises(self, what: str, kind: type, fn: Callable[[], Any], match: str = "") -> None:
        self.count += 1
        try:
            fn()
        except kind as exc:
            text = str(exc)
            if match and match not in text:
                self.fail(what, f"{kind.__name__} without {match!r}: {text}")
            elif "HINT:" not in text:
                self.fail(what, f"message lacks a HINT: {text}")
            return
        except Exception as exc:  # noqa: BLE001 - report anything unexpected
            self.fail(what, f"raised {type(exc).__name__}: {exc}")
            return
        self.fail(what, f"did not raise {kind.__name__}")

    def guarded(self, what: str, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception as exc:  # noqa: BLE001
            self.fail(what, f"raised {type(exc).__name__}: {str(exc)[:300]}")


def check_reductions(c: Checks) -> None:
    comm, members, size = c.comm, c.members, c.comm.size
    for dtype in DTYPES:
        for op in OPS:
            tag = f"{dtype}-{op.name}"
            shape = (5, 16)  # 80 elements: long enough for vectorised library kernels
            case = f"red-{tag}"
            inputs = [values(case, r, shape, dtype, op) for r in members]
            if refused(dtype, op):
                c.raises(f"allreduce {tag}", ValueError,
                         lambda: comm.allreduce(to_tensor(inputs[comm.rank], dtype), op))
                continue
            want, bound = expected_reduce(inputs, op, dtype), tolerance(inputs, op, dtype)

            def allreduce() -> None:
                t = to_tensor(inputs[comm.rank], dtype)
                comm.allreduce(t, op)
                c.equal(f"allreduce {tag}", t, want, dtype, bound)

            def reduce(root: int) -> None:
                t = to_tensor(inputs[comm.rank], dtype)
                comm.reduce(t, op, root)
                if comm.rank == root:
                    c.equal(f"reduce {tag} root {root}", t, want, dtype, bound)

            def reduce_scatter(rows: int) -> None:
                ins = [values(f"rs{rows}-{tag}", r, (rows, 2), dtype, op) for r in members]
                full, limit = expected_reduce(ins, op, dtype), tolerance(ins, op, dtype)
                base, extra = divmod(rows, size)
                mine = [base + (i < extra) for i in range(size)]
                part = slice(sum(mine[: comm.rank]), sum(mine[: comm.rank + 1]))
                out = comm.reduce_scatter(to_tensor(ins[comm.rank], dtype), op)
                c.equal(f"reduce_scatter {tag} rows {rows}", out, full[part], dtype,
                        None if limit is None else limit[part])

            c.guarded(f"allreduce {tag}", allreduce)
            for root in sorted({0, size - 1}):
                c.guarded(f"reduce {tag}", lambda: reduce(root))
            for rows in (5, size * 2) if op == SUM else (5,):
                c.guarded(f"reduce_scatter {tag}", lambda: reduce_scatter(rows))
    # Fewer rows than ranks: with 2 rows over 3 ranks the last rank gets none.
    ins = [values("rs-short", r, (2, 2), torch.float32) for r in members]
    full, limit = expected_reduce(ins, SUM, torch.float32), tolerance(ins, SUM, torch.float32)
    mine = [len(part) for part in np.array_split(np.arange(2), size)]
    part = slice(sum(mine[: comm.rank]), sum(mine[: comm.rank + 1]))
    c.guarded("reduce_scatter short", lambda: c.equal(
        "reduce_scatter short", comm.reduce_scatter(to_tensor(ins[comm.rank], torch.float32), SUM),
        full[part], torch.float32, limit[part]))


def check_layouts(c: Checks) -> None:
    """Non-contiguous inputs work (results copied back); overlapping outputs are refused."""
    comm, members = c.comm, c.members
    for dtype, op in ((torch.float32, SUM), (torch.int16, MAX), (torch.bfloat16, AVG), (torch.bool, PROD)):
        ins = [values(f"nc-{dtype}", r, (4, 3), dtype, op) for r in members]
        want, bound = expected_reduce(ins, op, dtype), tolerance(ins, op, dtype)

        def run() -> None:
            base = to_tensor(ins[comm.rank].T.copy(), dtype)  # stored transposed...
            view = base.t()  # ...so this view has the logical values and is not contiguous
            comm.allreduce(view, op)
            c.equal(f"allreduce non-contiguous {dtype}", view, want, dtype, bound)
            c.equal(f"allreduce non-contiguous {dtype} storage", base, want.T, dtype,
                    None if bound is None else bound.T)

        c.guarded(f"non-contiguous {dtype}", run)
    ins = [values("nc-bcast", r, (3, 2), torch.float64) for r in members]

    def bcast() -> None:
        base = to_tensor(ins[comm.rank].T.copy(), torch.float64)
        comm.broadcast(base.t(), 0)
        c.equal("broadcast non-contiguous", base.t(), ins[0], torch.float64)

    c.guarded("broadcast non-contiguous", bcast)
    check_noncontiguous_inputs(c)
    check_packed_dtypes(c)
    c.raises("allreduce expanded", ValueError, lambda: comm.allreduce(torch.ones(1).expand(4), SUM), "strides")
    c.raises("broadcast expanded", ValueError, lambda: comm.broadcast(torch.ones(3, 1).expand(3, 2), 0), "strides")


def _transposed(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """A non-contiguous tensor holding ``array`` (a transposed view of its transpose)."""
    return to_tensor(np.ascontiguousarray(array.T), dtype).t()


def check_noncontiguous_inputs(c: Checks) -> None:
    """The other collectives take non-contiguous inputs too, and leave them untouched."""
    comm, members, size = c.comm, c.members, c.comm.size
    dtype = torch.float64
    ins = [values("ncx", r, (2 * size, 3), dtype) for r in members]

    def run() -> None:
        mine = _transposed(ins[comm.rank], dtype)
        assert not mine.is_contiguous()
        c.equal("allgather non-contiguous", comm.allgather(mine), np.concatenate(ins), dtype)
        out = comm.gather(mine, size - 1)
        if comm.rank == size - 1:
            c.equal("gather non-contiguous", out, np.concatenate(ins), dtype)
        full, bound = expected_reduce(ins, SUM, dtype), tolerance(ins, SUM, dtype)
        part = slice(2 * comm.rank, 2 * comm.rank + 2)
        c.equal("reduce_scatter non-contiguous", comm.reduce_scatter(mine, SUM), full[part], dtype, bound[part])
        out, got = comm.alltoall(mine, None)
        c.equal("alltoall non-contiguous", out,
                np.concatenate([x[2 * comm.rank:2 * comm.rank + 2] for x in ins]), dtype)
        chunks = [_transposed(x[:2], dtype) for x in ins] if comm.rank == 0 else None
        c.equal("scatter non-contiguous", comm.scatter(chunks, 0), ins[comm.rank][:2], dtype)
        c.equal("non-contiguous input unchanged", mine, ins[comm.rank], dtype)
        # One element of a strided tensor: torch calls it contiguous, yet it keeps its stride.
        first = [x[:1, :1] for x in ins]
        lone = to_tensor(np.concatenate([first[comm.rank], np.zeros((1, 1))], axis=1), dtype)[:, ::2]
        assert lone.is_contiguous() and lone.stride() == (2, 2)
        c.equal("allgather one strided element", comm.allgather(lone), np.concatenate(first), dtype)
        out = comm.gather(lone, 0)
        if comm.rank == 0:
            c.equal("gather one strided element", out, np.concatenate(first), dtype)
        comm.broadcast(lone, size - 1)
        c.equal("broadcast one strided element", lone, first[size - 1], dtype)
        reduced = _transposed(ins[comm.rank], dtype)
        comm.reduce(reduced, SUM, 0)
        if comm.rank == 0:
            c.equal("reduce non-contiguous", reduced, full, dtype, bound)

    c.guarded("non-contiguous inputs", run)


def check_packed_dtypes(c: Checks) -> None:
    """float8_e8m0fnu and the packed float4_e2m1fn_x2 move bit for bit; float4 is not reduced."""
    comm, members, size = c.comm, c.members, c.comm.size
    for name in ("float8_e8m0fnu", "float4_e2m1fn_x2"):
        dtype = getattr(torch, name, None)
        if dtype is None:
            continue
        raw = [np.arange(2 * size, dtype=np.uint8) + 17 * r + 3 for r in members]

        def run() -> None:
            mine = torch.from_numpy(raw[comm.rank].copy()).view(dtype)
            c.equal(f"allgather {name}", comm.allgather(mine).view(torch.uint8), np.concatenate(raw), torch.uint8)
            b = mine.clone()
            comm.broadcast(b, size - 1)
            c.equal(f"broadcast {name}", b.view(torch.uint8), raw[-1], torch.uint8)
            out, _ = comm.alltoall(mine, None)
            c.equal(f"alltoall {name}", out.view(torch.uint8),
                    np.concatenate([x[2 * comm.rank:2 * comm.rank + 2] for x in raw]), torch.uint8)

        c.guarded(f"move {name}", run)
    packed = getattr(torch, "float4_e2m1fn_x2", None)
    if packed is not None:
        c.raises("allreduce float4_e2m1fn_x2", ValueError,
                 lambda: comm.allreduce(torch.zeros(4, dtype=torch.uint8).view(packed), SUM), "4-bit")


def check_fast_path(c: Checks) -> None:
    """Contiguous float32/float64/int SUM/MIN/MAX go straight to the library: no planning, no copy."""
    from accord.comm import base_communicator

    comm = c.comm
    original = base_communicator.dtypes.plan_reduction
    planned: list[Any] = []
    base_communicator.dtypes.plan_reduction = lambda *a: planned.append(a) or original(*a)
    try:
        for dtype in (torch.float32, torch.float64, torch.int32, torch.int64):
            for op in (SUM, MIN, MAX):
                t = torch.ones(8, dtype=dtype)
                ptr = t.data_ptr()
                comm.allreduce(t, op)
                c.count += 1
                if t.data_ptr() != ptr or planned:
                    c.fail(f"fast path {dtype} {op.name}", f"planned={planned} moved={t.data_ptr() != ptr}")
    finally:
        base_communicator.dtypes.plan_reduction = original


def check_movement(c: Checks) -> None:
    comm, members, size = c.comm, c.members, c.comm.size
    for dtype in DTYPES:
        for root in range(size):
            ins = [values(f"bc-{dtype}-{root}", r, (2, 3), dtype) for r in members]

            def bcast() -> None:
                t = to_tensor(ins[comm.rank], dtype)
                comm.broadcast(t, root)
                c.equal(f"broadcast {dtype} root {root}", t, ins[root], dtype)

            c.guarded(f"broadcast {dtype}", bcast)
        rows = [r % 3 for r in members]  # global rank 0 sends no rows
        ins = [values(f"ag-{dtype}", r, (rows[i], 2), dtype) for i, r in enumerate(members)]
        c.guarded(f"allgather {dtype}", lambda: c.equal(
            f"allgather {dtype}", comm.allgather(to_tensor(ins[comm.rank], dtype)), np.concatenate(ins), dtype))
    scal = [values("ag-scalar", r, (), torch.float64) for r in members]
    c.guarded("allgather scalar", lambda: c.equal(
        "allgather scalar", comm.allgather(to_tensor(scal[comm.rank], torch.float64)),
        np.stack(scal), torch.float64))
    for dtype in (torch.float32, torch.bfloat16, torch.bool, torch.uint64, torch.complex64, torch.int16):
        rows = [(r + 1) % 3 for r in members]
        ins = [values(f"ga-{dtype}", r, (rows[i], 3), dtype) for i, r in enumerate(members)]
        for root in range(size):
            def gather() -> None:
                out = comm.gather(to_tensor(ins[comm.rank], dtype), root)
                if comm.rank == root:
                    c.equal(f"gather {dtype} root {root}", out, np.concatenate(ins), dtype)
                elif out is not None:
                    c.fail(f"gather {dtype} root {root}", "non-root got a result")

            c.guarded(f"gather {dtype}", gather)

            chunks = [values(f"sc-{dtype}-{root}", i, (i % 3, 2), dtype) for i in range(size)]

            def scatter() -> None:
                given = [to_tensor(x, dtype) for x in chunks] if comm.rank == root else None
                c.equal(f"scatter {dtype} root {root}", comm.scatter(given, root), chunks[comm.rank], dtype)

            c.guarded(f"scatter {dtype}", scatter)
        check_alltoall(c, dtype)
    check_empty(c)
    comm.barrier()
    c.count += 1


def check_empty(c: Checks) -> None:
    """Zero-element tensors on every rank: valid, and nothing hangs."""
    comm, size = c.comm, c.comm.size
    nothing = np.zeros((0, 3))

    def run() -> None:
        for op in (SUM, AVG, PROD):
            t = torch.zeros(0, 3)
            comm.allreduce(t, op)
            c.equal(f"allreduce empty {op.name}", t, nothing, torch.float32)
            c.equal(f"reduce_scatter empty {op.name}", comm.reduce_scatter(torch.zeros(0, 3), op), nothing,
                    torch.float32)
        t = torch.zeros(0, 3)
        comm.broadcast(t, 0)
        c.equal("broadcast empty", t, nothing, torch.float32)
        c.equal("allgather empty", comm.allgather(torch.zeros(0, 3)), nothing, torch.float32)
        out, got = comm.alltoall(torch.zeros(0, 3), None)
        c.equal("alltoall empty", out, nothing, torch.float32)
        c.equal("alltoall empty splits", got, np.zeros(size), torch.int64)
        c.equal("scatter empty", comm.scatter([torch.zeros(0, 3)] * size if comm.rank == 0 else None, 0),
                nothing, torch.float32)

    c.guarded("empty tensors", run)


def check_alltoall(c: Checks, dtype: torch.dtype) -> None:
    comm, members, size = c.comm, c.members, c.comm.size
    even = [values(f"a2a-{dtype}", r, (2 * size, 3), dtype) for r in members]

    def run_even() -> None:
        out, got = comm.alltoall(to_tensor(even[comm.rank], dtype), None)
        want = np.concatenate([x[2 * comm.rank:2 * comm.rank + 2] for x in even])
        c.equal(f"alltoall even {dtype}", out, want, dtype)
        c.equal(f"alltoall even {dtype} splits", got, np.full(size, 2), torch.int64)

    c.guarded(f"alltoall even {dtype}", run_even)
    splits = [[(m + i) % 3 for i in range(size)] for m in members]
    ins = [values(f"a2as-{dtype}", r, (sum(splits[i]), 2), dtype) for i, r in enumerate(members)]

    def run_splits() -> None:
        out, got = comm.alltoall(to_tensor(ins[comm.rank], dtype), splits[comm.rank])
        me = comm.rank
        parts = [ins[s][sum(splits[s][:me]):sum(splits[s][:me + 1])] for s in range(size)]
        c.equal(f"alltoall splits {dtype}", out, np.concatenate(parts), dtype)
        c.equal(f"alltoall splits {dtype} received", got, np.array([splits[s][me] for s in range(size)]), torch.int64)

    c.guarded(f"alltoall splits {dtype}", run_splits)
    # The last rank neither sends nor receives: it must still take part (Gloo's alltoallv
    # waits for a message from every peer, even an empty one).
    last = size - 1
    idle = [[int(i != last and j != last) for i in range(size)] for j in range(size)]
    parts = [values(f"a2ai-{dtype}", r, (sum(idle[i]), 2), dtype) for i, r in enumerate(members)]

    def run_idle() -> None:
        out, got = comm.alltoall(to_tensor(parts[comm.rank], dtype), idle[comm.rank])
        me = comm.rank
        want = [parts[s][sum(idle[s][:me]):sum(idle[s][:me + 1])] for s in range(size)]
        c.equal(f"alltoall idle rank {dtype}", out, np.concatenate(want), dtype)
        c.equal(f"alltoall idle rank {dtype} received", got, np.array([idle[s][me] for s in range(size)]),
                torch.int64)

    c.guarded(f"alltoall idle rank {dtype}", run_idle)


def check_outputs(c: Checks) -> None:
    """allgather and reduce_scatter write into a caller-given ``out`` and return that very
    tensor, also in place (the input is this rank's rows of ``out``), across dtypes whose wire
    is the caller's own, a view of it (bool) or a cast (int16 on Gloo); a wrong ``out`` raises
    a ValueError naming what was wrong, on every rank, and the ranks stay in step."""
    comm, members, size, me = c.comm, c.members, c.comm.size, c.comm.rank
    for dtype, op in ((torch.float32, SUM), (torch.float64, AVG), (torch.bfloat16, SUM), (torch.int16, MAX),
                      (torch.bool, MAX)):
        tag = f"{dtype}-{op.name}"
        rows = [1 + r % 2 for r in members]  # ragged
        ins = [values(f"out-ag-{tag}", r, (rows[i], 3), dtype) for i, r in enumerate(members)]
        start = sum(rows[:me])

        def gather_into(in_place: bool) -> None:
            out = to_tensor(values(f"out-junk-{tag}", c.me, (sum(rows), 3), dtype), dtype)
            mine = out[start:start + rows[me]] if in_place else to_tensor(ins[me], dtype)
            mine.copy_(to_tensor(ins[me], dtype))
            got = comm.allgather(mine, out)
            c.count += 1
            if got is not out:
                c.fail(f"allgather out {tag}", "did not return the given output")
            c.equal(f"allgather out {tag}{' in place' if in_place else ''}", out, np.concatenate(ins), dtype)

        for in_place in (False, True):
            c.guarded(f"allgather out {tag}", lambda: gather_into(in_place))
        total = 2 * size + 1  # uneven: lower ranks get the extra row
        ins = [values(f"out-rs-{tag}", r, (total, 2), dtype, op) for r in members]
        full, limit = expected_reduce(ins, op, dtype), tolerance(ins, op, dtype)
        mine_rows = split_rows(total, size)
        part = slice(sum(mine_rows[:me]), sum(mine_rows[:me + 1]))

        def scatter_into(in_place: bool) -> None:
            t = to_tensor(ins[me], dtype)
            out = t[part] if in_place else torch.empty((mine_rows[me], 2), dtype=dtype)
            got = comm.reduce_scatter(t, op, out)
            c.count += 1
            if got is not out:
                c.fail(f"reduce_scatter out {tag}", "did not return the given output")
            c.equal(f"reduce_scatter out {tag}{' in place' if in_place else ''}", out, full[part], dtype,
                    None if limit is None else limit[part])

        for in_place in (False, True):
            c.guarded(f"reduce_scatter out {tag}", lambda: scatter_into(in_place))
    # wrong outputs: every rank passes the same kind of wrong output, or one rank alone does
    x = torch.ones(2 * size, 3)
    mine = split_rows(2 * size, size)[me]
    c.raises("reduce_scatter out shape", ValueError,
             lambda: comm.reduce_scatter(x, SUM, torch.empty(mine + 1, 3)), f"shape [{mine + 1}, 3]")
    c.raises("reduce_scatter out dtype", ValueError,
             lambda: comm.reduce_scatter(x, SUM, torch.empty(mine, 3, dtype=torch.float64)), "dtype torch.float64")
    c.raises("reduce_scatter out not contiguous", ValueError,
             lambda: comm.reduce_scatter(x, SUM, torch.empty(3, mine).t()), "not contiguous")
    # (the host-staged communicator hands the inner one a host copy of the input: no overlap
    # can hurt there, and none is refused)
    staged = getattr(comm, "backend_name", "") == "host"
    if size > 1 and not staged:
        other = 0 if me else 2  # rows of another rank, not this rank's own
        c.raises("reduce_scatter out overlaps", ValueError,
                 lambda: comm.reduce_scatter(x, SUM, x[other:other + mine]), "overlaps")
    lone = torch.ones(1, 3)
    wrong = size + 1 if me == 0 else size  # rank 0 alone gives the wrong number of rows
    c.raises("allgather out rows", ValueError, lambda: comm.allgather(lone, torch.empty(wrong, 3)),
             f"rank {members[0]}: {size + 1}")
    bad = torch.float64 if me == size - 1 else torch.float32  # the last rank alone
    c.raises("allgather out dtype", ValueError, lambda: comm.allgather(lone, torch.empty(size, 3, dtype=bad)),
             f"invalid arguments on ranks [{members[-1]}]")
    if size > 1 and not staged:
        def misplaced() -> torch.Tensor:
            out = torch.empty(size, 3)
            return comm.allgather(out[size - 1 - me:size - me] if me == 0 else out[me:me + 1], out)

        c.raises("allgather in place at the wrong rows", ValueError, misplaced, f"rank {members[0]} at row {size - 1}")
    got = comm.allgather(lone)  # still in step after the errors
    c.equal("allgather after the output errors", got, np.ones((size, 3), dtype=np.float32), torch.float32)


def check_errors(c: Checks) -> None:
    """Bad arguments raise clear errors on every rank (never a hang)."""
    comm, size = c.comm, c.comm.size
    c.raises("adasum", BackendError, lambda: comm.allreduce(torch.ones(2), ReduceOp.ADASUM), "Adasum")
    c.raises("root out of range", ValueError, lambda: comm.broadcast(torch.ones(2), size), "root")
    c.raises("reduce_scatter scalar", ValueError, lambda: comm.reduce_scatter(torch.tensor(1.0), SUM))
    if size > 1:
        width = 3 if comm.rank == 0 else 2
        c.raises("allgather mismatch", MismatchError, lambda: comm.allgather(torch.ones(1, width)),
                 f"rank {c.members[0]} sent float32 [1, 3]")
        bad = [1] * size if comm.rank == size - 1 else None  # wrong sum on the last rank only
        c.raises("alltoall bad splits", ValueError, lambda: comm.alltoall(torch.ones(2 * size), bad),
                 f"ranks [{c.members[-1]}]")
    c.raises("scatter bad chunks", ValueError,
             lambda: comm.scatter([torch.ones(1)] * (size + 1) if comm.rank == 0 else None, 0), "invalid chunks")
    comm.allreduce(torch.ones(1), SUM)  # still in step after the errors
    c.count += 1


def run_checks(backend: Any, rank: int, size: int) -> tuple[int, list[str]]:
    """Run every check on this rank over the full set and a subset; return (checks, failures)."""
    sets = [list(range(size))] + ([[0, 2]] if size >= 3 else [[1]])
    comms = [(g, groups.create(backend, g, rank=rank)) for g in sets]  # every rank, same order
    count, failures = 0, []
    for members, comm in comms:
        if comm is None:
            if rank in members:
                failures.append(f"rank {rank} got no communicator for {members}")
            continue
        if not isinstance(comm, Communicator):
            failures.append(f"rank {rank}: {type(comm).__name__} does not implement the Communicator protocol")
        if list(comm.ranks) != members or comm.ranks[comm.rank] != rank or comm.size != len(members):
            failures.append(f"rank {rank}: communicator {comm.ranks}/{comm.rank} for {members}")
        c = Checks(comm, f"{backend.name} {members}")
        for part in (check_reductions, check_layouts, check_fast_path, check_movement, check_outputs, check_errors):
            part(c)
        count += c.count
        failures += c.failures
    for members, comm in comms:
        if rank not in members and comm is not None:
            failures.append(f"rank {rank} got a communicator for {members}")
    return count, failures
