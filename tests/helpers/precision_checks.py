"""Precision through the engine, end to end: every collective x dtype through
``accord.engine.session`` on whatever backend the session picked (gloo, shm, mpi, hierarchical).

Inputs use every bit of their dtype (:func:`helpers.values.random_values`). With no compression
(``Compression.none``, the default) copies must arrive bit for bit and reductions within
:func:`helpers.values.reduce_tolerance` of the float64 result; with fp16/bf16 compression,
within the bound of the narrower wire. Lone requests, fused batches and grouped calls take
different paths through the engine (fusion buffers, deferred casts), so each is checked.

``engine_precision_checks(rank, size)`` runs after ``session.init()`` on every rank and returns
``(checks, failures)``; the caller asserts no failures.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from accord.comm.ops import ReduceOp
from accord.engine import session
from accord.engine.compression import Compression
from helpers.comm_checks import AVG, MAX, MIN, PROD, SUM, expected_reduce, tolerance, values
from helpers.values import bits_equal, reduce_tolerance, to_tensor, within

DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
          torch.int32, torch.int64, torch.bool, torch.complex64)


class Collector:
    """Failures of one rank, collected so that one wrong value does not desynchronise ranks."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.count = 0
        self.failures: list[str] = []

    def check(self, what: str, got: Any, want: np.ndarray, dtype: torch.dtype, bound: Any = None) -> None:
        self.count += 1
        if not isinstance(got, torch.Tensor) or got.dtype != dtype or tuple(got.shape) != np.shape(want):
            desc = f"{got.dtype} {tuple(got.shape)}" if isinstance(got, torch.Tensor) else repr(got)[:80]
            self.failures.append(f"[rank {self.rank}] {what}: got {desc}, expected {dtype} {np.shape(want)}")
            return
        ok = bits_equal(got, want, dtype) if bound is None else within(got, want, bound)
        if not ok:
            wide = got.detach().to(torch.complex128 if dtype.is_complex else torch.float64).numpy()
            diff = np.abs(wide - want).ravel()
            i = int(np.argmax(diff))
            limit = "bit-exact" if bound is None else f"bound {np.broadcast_to(bound, np.shape(want)).ravel()[i]:.3g}"
            self.failures.append(f"[rank {self.rank}] {what}: element {i} is {wide.ravel()[i]!r}, "
                                 f"expected {np.asarray(want).ravel()[i]!r} ({limit})")


def _ops(dtype: torch.dtype) -> tuple[ReduceOp, ...]:
    if dtype == torch.bool:
        return (SUM, MIN, MAX, PROD)
    if dtype.is_complex:
        return (SUM, AVG, PROD)
    if not dtype.is_floating_point:
        return (SUM, MIN, MAX, PROD)  # integer Average: the comm layer's rule, checked there
    return (SUM, AVG, MIN, MAX, PROD)


def _reductions(c: Collector, rank: int, size: int) -> None:
    """allreduce of every dtype x op: one lone (synchronous) and one fused batch, in place and
    out of place; the batch mixes dtypes so each dtype's fusion buffer is exercised."""
    shape = (3, 37)
    batch = []
    for dtype in DTYPES:
        for op in _ops(dtype):
            tag = f"{dtype}-{op.name}"
            ins = [values(f"eng-{tag}", r, shape, dtype, op) for r in range(size)]
            want, bound = expected_reduce(ins, op, dtype), tolerance(ins, op, dtype)
            mine = to_tensor(ins[rank], dtype)
            got = session.synchronize(session.submit("allreduce", mine, f"lone.{tag}", reduce_op=op))
            c.check(f"lone allreduce {tag}", got, want, dtype, bound)
            c.check(f"lone allreduce {tag} leaves its input", mine, ins[rank], dtype)
            t = to_tensor(ins[rank], dtype)
            batch.append((f"batch allreduce {tag}", t, want, dtype, bound, session.submit(
                "allreduce", t, f"batch.{tag}", reduce_op=op, in_place=True)))
    for what, t, want, dtype, bound, handle in batch:
        got = session.synchronize(handle)
        c.check(what, got, want, dtype, bound)
        c.check(f"{what} in place", t, want, dtype, bound)


def _compression(c: Collector, rank: int, size: int) -> None:
    """Compression.none is bit-exact end to end; fp16/bf16 stay within their wire's bound
    (lone and fused, in place: the engine's deferred cast; out of place: compress())."""
    wires = {"none": (Compression.none, None), "fp16": (Compression.fp16, torch.float16),
             "bf16": (Compression.bf16, torch.bfloat16)}
    pending = []
    for cname, (compression, wire) in wires.items():
        for dtype in (torch.float32, torch.float64):
            for op, opname in ((SUM, "sum"), (AVG, "average")):
                for in_place in (True, False):
                    tag = f"{cname}-{dtype}-{op.name}-{'in' if in_place else 'out'}"
                    ins = [values(f"cmp-{tag}", r, (4, 33), dtype, op) for r in range(size)]
                    want = expected_reduce(ins, op, dtype)
                    bound = reduce_tolerance(ins, opname, dtype, wire=wire)
                    t = to_tensor(ins[rank], dtype)
                    pending.append((f"compressed allreduce {tag}", t, want, dtype, bound, session.submit(
                        "allreduce", t, f"cmp.{tag}", reduce_op=op, in_place=in_place,
                        compression=compression)))
        # copies with Compression.none: bit for bit
        ins = [values(f"cmp-copy-{cname}", r, (r + 1, 5), torch.float32) for r in range(size)]
        if compression is Compression.none:
            got = session.synchronize(session.submit("allgather", to_tensor(ins[rank], torch.float32),
                                                     "cmp.allgather", compression=compression))
            c.check("allgather with Compression.none", got, np.concatenate(ins), torch.float32)
            got = session.synchronize(session.submit("broadcast", to_tensor(ins[rank][:1], torch.float32),
                                                     "cmp.broadcast", root_rank=size - 1,
                                                     compression=compression))
            c.check("broadcast with Compression.none", got, ins[size - 1][:1], torch.float32)
    for what, _, want, dtype, bound, handle in pending:
        got = session.synchronize(handle)
        c.check(what, got, want, dtype, bound)


def _copies(c: Collector, rank: int, size: int) -> None:
    """broadcast, allgather, alltoall, scatter, gather: bit for bit for every dtype; plus
    reducescatter and reduce, and a grouped allreduce."""
    for dtype in DTYPES:
        d = str(dtype).replace("torch.", "")
        ins = [values(f"bc-{d}", r, (2, 9), dtype) for r in range(size)]
        b = to_tensor(ins[rank], dtype)
        session.synchronize(session.submit("broadcast", b, f"bc.{d}", root_rank=size - 1, in_place=True))
        c.check(f"broadcast {d}", b, ins[size - 1], dtype)
        rows = [(r + 1) % 3 for r in range(size)]  # rank 2 sends none
        ins = [values(f"ag-{d}", r, (rows[r], 7), dtype) for r in range(size)]
        got = session.synchronize(session.submit("allgather", to_tensor(ins[rank], dtype), f"ag.{d}"))
        c.check(f"allgather {d}", got, np.concatenate(ins), dtype)
        splits = [[(i + j) % 3 for j in range(size)] for i in range(size)]
        ins = [values(f"a2a-{d}", r, (sum(splits[r]), 3), dtype) for r in range(size)]
        out, received = session.synchronize(session.submit("alltoall", to_tensor(ins[rank], dtype),
                                                           f"a2a.{d}", splits=splits[rank]))
        parts = [ins[s][sum(splits[s][:rank]):sum(splits[s][:rank + 1])] for s in range(size)]
        c.check(f"alltoall {d}", out, np.concatenate(parts), dtype)
        c.check(f"alltoall {d} received", received, np.array([splits[s][rank] for s in range(size)]),
                received.dtype if isinstance(received, torch.Tensor) else torch.int64)
        counts = [r + 1 for r in range(size)]
        full = values(f"sc-{d}", 0, (sum(counts), 4), dtype)
        given = to_tensor(full, dtype) if rank == 0 else torch.empty(0, 4, dtype=dtype)
        got = session.synchronize(session.submit("scatter", given, f"sc.{d}", root_rank=0,
                                                 splits=counts if rank == 0 else None))
        c.check(f"scatter {d}", got, full[sum(counts[:rank]):sum(counts[:rank + 1])], dtype)
        ins = [values(f"ga-{d}", r, (r % 2 + 1, 5), dtype) for r in range(size)]
        got = session.synchronize(session.submit("gather", to_tensor(ins[rank], dtype), f"ga.{d}",
                                                 root_rank=size - 1))
        if rank == size - 1:
            c.check(f"gather {d}", got, np.concatenate(ins), dtype)
        if dtype.is_floating_point:
            ins = [values(f"rs-{d}", r, (2 * size + 1, 6), dtype) for r in range(size)]
            full, bound = expected_reduce(ins, SUM, dtype), tolerance(ins, SUM, dtype)
            got = session.synchronize(session.submit("reducescatter", to_tensor(ins[rank], dtype), f"rs.{d}"))
            mine = [len(p) for p in np.array_split(np.arange(2 * size + 1), size)]
            part = slice(sum(mine[:rank]), sum(mine[:rank + 1]))
            c.check(f"reducescatter {d}", got, full[part], dtype, bound[part])
            ins = [values(f"red-{d}", r, (11,), dtype) for r in range(size)]
            full, bound = expected_reduce(ins, SUM, dtype), tolerance(ins, SUM, dtype)
            got = session.synchronize(session.submit("reduce", to_tensor(ins[rank], dtype), f"red.{d}", root_rank=0))
            if rank == 0:
                c.check(f"reduce {d}", got, full, dtype, bound)
    ins = [[values(f"grp-{k}", r, (k + 1, 3), torch.float64) for k in range(4)] for r in range(size)]
    handles = session.submit_group("allreduce", [to_tensor(x, torch.float64) for x in ins[rank]], "grp")
    for k, handle in enumerate(handles):
        arrays = [ins[r][k] for r in range(size)]
        c.check(f"grouped allreduce {k}", session.synchronize(handle), expected_reduce(arrays, SUM, torch.float64),
                torch.float64, tolerance(arrays, SUM, torch.float64))


def _outputs(c: Collector, rank: int, size: int) -> None:
    """allgather and reducescatter into a given output: the handle returns that very tensor,
    bit for bit what the engine returns without one (copies exact, sums within their bound),
    also in place (the input is this rank's rows of the output), with Average, a postscale and
    fp16 compression (decompressed into the output); submitted back to back, so several are
    in flight at once."""
    pending = []
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.int32, torch.bool):
        d = str(dtype).replace("torch.", "")
        rows = [(r + 1) % 3 for r in range(size)]  # rank 2 sends none
        ins = [values(f"out-ag-{d}", r, (rows[r], 5), dtype) for r in range(size)]
        start = sum(rows[:rank])
        for in_place in (False, True):
            out = torch.zeros(sum(rows), 5, dtype=dtype)
            mine = out[start:start + rows[rank]] if in_place else torch.empty(rows[rank], 5, dtype=dtype)
            mine.copy_(to_tensor(ins[rank], dtype))
            pending.append((f"allgather into output {d}{' in place' if in_place else ''}", out, np.concatenate(ins),
                            dtype, None, session.submit("allgather", mine, f"out.ag.{d}.{in_place}", output=out)))
    for dtype, op, compression in ((torch.float32, SUM, Compression.none), (torch.float64, AVG, Compression.none),
                                   (torch.int64, SUM, Compression.none), (torch.float32, AVG, Compression.fp16)):
        tag = f"{dtype}-{op.name}-{compression.__name__}"
        total = 2 * size + 1
        ins = [values(f"out-rs-{tag}", r, (total, 6), dtype, op) for r in range(size)]
        full = expected_reduce(ins, op, dtype) * (3.0 if dtype.is_floating_point else 1)
        wire = torch.float16 if compression is Compression.fp16 else None
        bound = None if not dtype.is_floating_point else \
            reduce_tolerance(ins, "average" if op == AVG else "sum", dtype, wire=wire) * 3.0
        mine = [len(p) for p in np.array_split(np.arange(total), size)]
        part = slice(sum(mine[:rank]), sum(mine[:rank + 1]))
        for in_place in (False, True):
            t = to_tensor(ins[rank], dtype)
            out = t[part] if in_place else torch.full((mine[rank], 6), 7, dtype=dtype)
            post = 3.0 if dtype.is_floating_point else 1.0
            pending.append((f"reducescatter into output {tag}{' in place' if in_place else ''}", out, full[part],
                            dtype, None if bound is None else bound[part],
                            session.submit("reducescatter", t, f"out.rs.{tag}.{in_place}", reduce_op=op,
                                           postscale_factor=post, compression=compression, output=out)))
    for what, out, want, dtype, bound, handle in pending:
        got = session.synchronize(handle)
        c.count += 1
        if got is not out:
            c.failures.append(f"[rank {rank}] {what}: the handle returned another tensor than the output")
        c.check(what, out, want, dtype, bound)


def engine_precision_checks(rank: int, size: int) -> tuple[int, list[str]]:
    """Run every precision check through the initialized session; return (checks, failures)."""
    c = Collector(rank)
    for part in (_reductions, _compression, _copies, _outputs):
        try:
            part(c, rank, size)
        except Exception as exc:  # noqa: BLE001 - report, and let the other ranks see it too
            c.failures.append(f"[rank {rank}] {part.__name__} raised {type(exc).__name__}: {str(exc)[:400]}")
            raise
    return c.count, c.failures
