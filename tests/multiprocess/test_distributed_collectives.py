"""Every collective torch.distributed calls on a process group, through the public API, on the
accord backend (``init_process_group("accord")``), on 2 and 3 ranks.

One table of cases runs on every rank in one process per rank (:func:`_table`): each reduce op
and dtype through all_reduce, reduce, reduce_scatter (list and tensor forms); each dtype through
broadcast, all_gather (list, flat and stacked tensor, coalesced), gather, scatter, all_to_all
(list and single, uneven splits); the coalescing manager; send/recv, isend/irecv, recv from any
source, batch_isend_irecv; the object collectives; and the same collectives on groups made by
``new_group`` and ``new_subgroups``. Each rank rebuilds every rank's input from a seed (case name
and global rank) and computes the expected result with numpy: copies and min/max/integer/bool
reductions must match bit for bit, floating sums, averages and products within
:func:`helpers.values.reduce_tolerance`. A case that raises is recorded, not propagated, so the
ranks stay in step.

At 2 ranks the same table also runs on ``gloo`` and every case both backends run must give the
same bits on every rank; a case gloo refuses is listed as accord-only. At 3 ranks the results
every rank of a group must hold alike (all_reduce, broadcast, all_gather...) are compared across
ranks bit for bit by the parent.
"""
from __future__ import annotations

import functools
import re
import zlib
from typing import Any, Callable

import numpy as np
import pytest
from helpers.ranks import run_ranks
from helpers.torch_features import premul_factor_readable, torch_release
from helpers.values import bits_equal, random_values, reduce_tolerance, to_tensor, within

pytestmark = pytest.mark.timeout(300)

ARITH = ("SUM", "AVG", "PRODUCT", "MIN", "MAX")
BITWISE = ("BAND", "BOR", "BXOR")
FLOATS = ("float32", "float64", "float16", "bfloat16")
INTS = ("int8", "uint8", "int32", "int64")
DTYPES = FLOATS + INTS + ("bool",)
SHAPE = (4, 5)
ANY_TAG = 7

# (label, actual, expected, dtype, bound): a tensor output and what it must hold (bound None:
# bit for bit); dtype None: actual and expected are Python objects that must compare equal.
Check = tuple[str, Any, Any, Any, Any]


# --- inputs and expected values (numpy only) ---------------------------------------------------

def _dtype(name: str) -> Any:
    import torch

    return getattr(torch, name)


def _input(case: str, grank: int, shape: tuple, dtype: str, op: str = "", n: int = 1) -> np.ndarray:
    """Global rank ``grank``'s input for ``case``: every bit of the dtype used (random_values);
    integers for AVG stay within 1/n of the range, so that the exact sum fits the dtype."""
    if dtype == "bool" or dtype in FLOATS:
        return random_values(f"{case}|{grank}", shape, dtype, spread=0 if op in ("PRODUCT", "PREMUL") else 3)
    info = np.iinfo(np.dtype(dtype))
    low, high = int(info.min), int(info.max)
    if op == "AVG":
        low, high = -(-low // n) if low < 0 else 0, high // n
    rng = np.random.default_rng(zlib.crc32(f"{case}|{grank}".encode()))
    return rng.integers(low, high, size=shape, endpoint=True, dtype=np.dtype(dtype))


def _reduced(arrays: list[np.ndarray], op: str, dtype: str) -> np.ndarray:
    """The reduction of every rank's input, computed with numpy."""
    if dtype == "bool":
        fn = {"SUM": np.logical_or, "MAX": np.logical_or, "BOR": np.logical_or, "PRODUCT": np.logical_and,
              "MIN": np.logical_and, "BAND": np.logical_and, "BXOR": np.logical_xor}[op]
        return functools.reduce(fn, arrays)
    if dtype in FLOATS:
        stack = np.stack([a.astype(np.float64) for a in arrays])
        if op == "PREMUL":
            return np.sum(2.0 * stack, axis=0)
        return {"SUM": np.sum, "AVG": np.mean, "PRODUCT": np.prod, "MIN": np.min, "MAX": np.max}[op](stack, axis=0)
    if op == "AVG":  # exact sum, quotient truncated toward zero (C integer division)
        total = sum(a.astype(object) for a in arrays)
        n = len(arrays)
        trunc = np.vectorize(lambda s: -((-s) // n) if s < 0 else s // n, otypes=[object])
        return trunc(total).astype(arrays[0].dtype)
    fn = {"SUM": np.add, "PRODUCT": np.multiply, "MIN": np.minimum, "MAX": np.maximum,
          "BAND": np.bitwise_and, "BOR": np.bitwise_or, "BXOR": np.bitwise_xor}[op]
    with np.errstate(over="ignore"):
        return functools.reduce(fn, arrays)  # wraps around like the native integer type


def _bound(arrays: list[np.ndarray], op: str, dtype: str) -> Any:
    """How far a floating result may be from the exact one; None where bits must match."""
    if dtype not in FLOATS or op in ("MIN", "MAX"):
        return None
    if op == "PREMUL":
        return reduce_tolerance([2.0 * a for a in arrays], "sum", dtype)
    return reduce_tolerance(arrays, {"SUM": "sum", "AVG": "average", "PRODUCT": "product"}[op], dtype)


def _ops_for(dtype: str) -> tuple[str, ...]:
    """The reduce ops a dtype can take (AVG of booleans is not a boolean; bitwise ops take
    integers and bool)."""
    if dtype == "bool":
        return ("SUM", "PRODUCT", "MIN", "MAX") + BITWISE
    return ARITH + (BITWISE if dtype in INTS else ())


def _op(name: str) -> Any:
    import torch.distributed as dist

    return dist._make_nccl_premul_sum(2.0) if name == "PREMUL" else getattr(dist.ReduceOp, name)


def _raw(t: Any) -> bytes:
    """The bits of a tensor (or the repr of an object), with its dtype and shape."""
    import torch

    if not isinstance(t, torch.Tensor):
        return repr(t).encode()
    flat = t.detach().contiguous().reshape(-1)
    return f"{t.dtype}{tuple(t.shape)}:".encode() + flat.view(torch.uint8).numpy().tobytes()


# --- the table ---------------------------------------------------------------------------------

class Table:
    """One rank's cases: runs each, compares with the expected values, keeps the bits.

    ``results[name]``: ``("ok", blobs, shared, matched)`` (blobs: the outputs' bits; shared: the
    global ranks that must hold the same bits, or None; matched: every output as expected) or
    ``("error", message)``.
    """

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.results: dict[str, tuple] = {}
        self.failures: list[str] = []

    def case(self, name: str, fn: Callable[[], list[Check]], shared: list[int] | None = None) -> None:
        assert name not in self.results, name
        try:
            checks = fn()
        except Exception as exc:  # noqa: BLE001 (recorded: the parent decides)
            self.results[name] = ("error", f"{type(exc).__name__}: {str(exc)[:500]}")
            return
        matched = True
        for label, actual, want, dtype, bound in checks:
            problem = _mismatch(actual, want, dtype, bound)
            if problem:
                matched = False
                self.failures.append(f"rank {self.rank} {name} {label}: {problem}")
        self.results[name] = ("ok", [_raw(c[1]) for c in checks], shared, matched)


def _mismatch(actual: Any, want: Any, dtype: Any, bound: Any) -> str:
    import torch

    if dtype is None:
        return "" if actual == want else f"got {actual!r}, expected {want!r}"
    dt = _dtype(dtype)
    if not isinstance(actual, torch.Tensor) or actual.dtype != dt or tuple(actual.shape) != np.shape(want):
        got = f"{actual.dtype} {tuple(actual.shape)}" if isinstance(actual, torch.Tensor) else repr(actual)
        return f"got {got}, expected {dtype} {np.shape(want)}"
    if dt == torch.bool:  # True is the byte 1 (a byte 2 reads as True, but not in every kernel)
        stored = set(actual.contiguous().view(torch.uint8).reshape(-1).tolist())
        if not stored <= {0, 1}:
            return f"a bool tensor holds the bytes {sorted(stored)}, not only 0 and 1"
    ok = bits_equal(actual, want, dt) if bound is None else within(actual, want, bound)
    if ok:
        return ""
    wide = actual.detach().to(torch.float64 if dt.is_floating_point else actual.dtype).numpy()
    return f"got {wide.ravel()[:6].tolist()}, expected {np.asarray(want).ravel()[:6].tolist()}"


def _table(t: Table, group: Any, members: list[int], prefix: str, full: bool) -> None:
    """The collective cases on ``group`` (None: the world) whose global ranks are ``members``;
    ``full``: every dtype and op, else a few."""
    import torch
    import torch.distributed as dist

    me, n = members.index(t.rank), len(members)
    dtypes = DTYPES if full else ("float32", "int64", "bool")
    ag_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    rs_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

    def ins(case: str, dtype: str, shape: tuple = SHAPE, op: str = "") -> list[np.ndarray]:
        return [_input(prefix + case, g, shape, dtype, op, n) for g in members]

    def tensor(array: np.ndarray, dtype: str) -> Any:
        return to_tensor(array, dtype)

    def case(name: str, fn: Callable[[], list[Check]], shared: bool) -> None:
        t.case(prefix + name, fn, members if shared else None)

    gloo_aborts_on_stacked = dist.get_backend(group) == "gloo" and torch_release() < (2, 5)
    for dtype in dtypes:
        ops = _ops_for(dtype) if full else tuple(o for o in ("SUM", "MAX", "BOR") if o in _ops_for(dtype))
        # (on torch 2.4 PREMUL_SUM is refused: tests/multiprocess/test_distributed_errors.py)
        if dtype in FLOATS and full and premul_factor_readable():
            ops = ops + ("PREMUL",)
        for op in ops:
            tag = f"{dtype}-{op}"

            def all_reduce(tag: str = tag, dtype: str = dtype, op: str = op) -> list[Check]:
                x = ins(f"ar-{tag}", dtype, op=op)
                out = tensor(x[me], dtype)
                dist.all_reduce(out, op=_op(op), group=group)
                return [("out", out, _reduced(x, op, dtype), dtype, _bound(x, op, dtype))]

            case(f"all_reduce {tag}", all_reduce, True)

            for root in sorted({0, n - 1}) if op == "SUM" else (n - 1,):
                def reduce(tag: str = tag, dtype: str = dtype, op: str = op, root: int = root) -> list[Check]:
                    x = ins(f"red-{tag}-{root}", dtype, op=op)
                    out = tensor(x[me], dtype)
                    dist.reduce(out, dst=members[root], op=_op(op), group=group)
                    return [("root", out, _reduced(x, op, dtype), dtype, _bound(x, op, dtype))] if me == root else []

                case(f"reduce {tag} root {root}", reduce, False)

            def reduce_scatter(tag: str = tag, dtype: str = dtype, op: str = op) -> list[Check]:
                x = ins(f"rsl-{tag}", dtype, (n, 3, 2), op)
                out = torch.empty((3, 2), dtype=_dtype(dtype))
                dist.reduce_scatter(out, [tensor(part, dtype) for part in x[me]], op=_op(op), group=group)
                part = [a[me] for a in x]
                return [("out", out, _reduced(part, op, dtype), dtype, _bound(part, op, dtype))]

            case(f"reduce_scatter {tag}", reduce_scatter, False)

            for form in ("flat", "stacked"):
                if form == "stacked" and gloo_aborts_on_stacked:
                    continue  # torch 2.4's Gloo kills the process (a C++ CHECK) on the stacked input
                def reduce_scatter_tensor(tag: str = tag, dtype: str = dtype, op: str = op,
                                          form: str = form) -> list[Check]:
                    x = ins(f"rst-{form}-{tag}", dtype, (n, 3, 2), op)
                    given = tensor(x[me], dtype)
                    out = torch.empty((3, 2), dtype=_dtype(dtype))
                    rs_single(out, given.reshape(n * 3, 2) if form == "flat" else given, op=_op(op), group=group)
                    part = [a[me] for a in x]
                    return [("out", out, _reduced(part, op, dtype), dtype, _bound(part, op, dtype))]

                case(f"reduce_scatter_tensor {form} {tag}", reduce_scatter_tensor, False)

        coalesced_ops = ("SUM", "MAX") if full else ("SUM",)
        for op in coalesced_ops:
            def all_reduce_coalesced(dtype: str = dtype, op: str = op) -> list[Check]:
                xs = [ins(f"arc-{dtype}-{op}-{i}", dtype, shape, op) for i, shape in enumerate(((3, 4), (5,)))]
                outs = [tensor(x[me], dtype) for x in xs]
                dist.all_reduce_coalesced(outs, op=_op(op), group=group)
                return [(f"out {i}", o, _reduced(x, op, dtype), dtype, _bound(x, op, dtype))
                        for i, (o, x) in enumerate(zip(outs, xs))]

            case(f"all_reduce_coalesced {dtype}-{op}", all_reduce_coalesced, True)

        for root in sorted({0, n - 1}):
            def broadcast(dtype: str = dtype, root: int = root) -> list[Check]:
                x = ins(f"bc-{dtype}-{root}", dtype)
                out = tensor(x[me], dtype)
                dist.broadcast(out, src=members[root], group=group)
                return [("out", out, x[root], dtype, None)]

            case(f"broadcast {dtype} root {root}", broadcast, True)

            def gather(dtype: str = dtype, root: int = root) -> list[Check]:
                x = ins(f"ga-{dtype}-{root}", dtype)
                outs = [torch.empty(SHAPE, dtype=_dtype(dtype)) for _ in range(n)] if me == root else None
                dist.gather(tensor(x[me], dtype), outs, dst=members[root], group=group)
                return [(f"from {i}", o, x[i], dtype, None) for i, o in enumerate(outs or [])]

            case(f"gather {dtype} root {root}", gather, False)

            def scatter(dtype: str = dtype, root: int = root) -> list[Check]:
                parts = [_input(f"{prefix}sc-{dtype}-{root}", i, SHAPE, dtype) for i in range(n)]
                out = torch.empty(SHAPE, dtype=_dtype(dtype))
                given = [tensor(p, dtype) for p in parts] if me == root else None
                dist.scatter(out, given, src=members[root], group=group)
                return [("out", out, parts[me], dtype, None)]

            case(f"scatter {dtype} root {root}", scatter, False)

        def all_gather(dtype: str = dtype) -> list[Check]:
            x = ins(f"ag-{dtype}", dtype)
            outs = [torch.empty(SHAPE, dtype=_dtype(dtype)) for _ in range(n)]
            dist.all_gather(outs, tensor(x[me], dtype), group=group)
            return [(f"from {i}", o, x[i], dtype, None) for i, o in enumerate(outs)]

        case(f"all_gather {dtype}", all_gather, True)

        for form in ("flat", "stacked"):
            def all_gather_tensor(dtype: str = dtype, form: str = form) -> list[Check]:
                x = ins(f"agt-{form}-{dtype}", dtype)
                shape = (n * SHAPE[0], SHAPE[1]) if form == "flat" else (n, *SHAPE)
                out = torch.empty(shape, dtype=_dtype(dtype))
                ag_single(out, tensor(x[me], dtype), group=group)
                want = np.concatenate(x) if form == "flat" else np.stack(x)
                return [("out", out, want, dtype, None)]

            case(f"all_gather_tensor {form} {dtype}", all_gather_tensor, True)

        def all_gather_coalesced(dtype: str = dtype) -> list[Check]:
            xs = [ins(f"agc-{dtype}-{i}", dtype, shape) for i, shape in enumerate(((2, 3), (4,)))]
            # torch's layout: one list per rank, holding that rank's tensors in input order
            outs = [[torch.empty(x[0].shape, dtype=_dtype(dtype)) for x in xs] for _ in range(n)]
            dist.all_gather_coalesced(outs, [tensor(x[me], dtype) for x in xs], group=group)
            return [(f"input {i} from {r}", outs[r][i], x[r], dtype, None)
                    for i, x in enumerate(xs) for r in range(n)]

        case(f"all_gather_coalesced {dtype}", all_gather_coalesced, True)

        for form in ("even", "uneven"):
            def all_to_all(dtype: str = dtype, form: str = form) -> list[Check]:
                # rows sent from rank s to rank d
                rows = [[2 if form == "even" else (s + d) % 3 + 1 for d in range(n)] for s in range(n)]
                x = [[_input(f"{prefix}a2a-{form}-{dtype}-{d}", g, (rows[s][d], 2), dtype) for d in range(n)]
                     for s, g in enumerate(members)]
                outs = [torch.empty((rows[s][me], 2), dtype=_dtype(dtype)) for s in range(n)]
                dist.all_to_all(outs, [tensor(p, dtype) for p in x[me]], group=group)
                return [(f"from {s}", o, x[s][me], dtype, None) for s, o in enumerate(outs)]

            case(f"all_to_all {form} {dtype}", all_to_all, False)

        for form in ("even", "uneven"):
            def all_to_all_single(dtype: str = dtype, form: str = form) -> list[Check]:
                # uneven: rank s sends (s + 2d) % 3 rows to rank d, some of them none
                splits = [[2 if form == "even" else (s + 2 * d) % 3 for d in range(n)] for s in range(n)]
                x = [_input(f"{prefix}a2as-{form}-{dtype}", g, (sum(splits[s]), 3), dtype)
                     for s, g in enumerate(members)]
                received = [splits[s][me] for s in range(n)]
                out = torch.empty((sum(received), 3), dtype=_dtype(dtype))
                if form == "even":
                    dist.all_to_all_single(out, tensor(x[me], dtype), group=group)
                else:
                    dist.all_to_all_single(out, tensor(x[me], dtype), received, splits[me], group=group)
                want = np.concatenate([x[s][sum(splits[s][:me]):sum(splits[s][:me + 1])] for s in range(n)])
                return [("out", out, want, dtype, None)]

            case(f"all_to_all_single {form} {dtype}", all_to_all_single, False)

    for dtype in ("float32", "int64"):
        def async_all_reduce(dtype: str = dtype) -> list[Check]:
            xs = [ins(f"ara-{dtype}-{i}", dtype) for i in range(3)]
            outs = [tensor(x[me], dtype) for x in xs]
            works = [dist.all_reduce(o, async_op=True, group=group) for o in outs]
            for w in works:
                w.wait()
            done = [w.is_completed() for w in works]
            return [("completed", done, [True] * 3, None, None)] + [
                (f"out {i}", o, _reduced(x, "SUM", dtype), dtype, _bound(x, "SUM", dtype))
                for i, (o, x) in enumerate(zip(outs, xs))]

        case(f"all_reduce async {dtype}", async_all_reduce, True)

        def coalescing_all_reduce(dtype: str = dtype) -> list[Check]:
            xs = [ins(f"cm-ar-{dtype}-{i}", dtype) for i in range(2)]
            outs = [tensor(x[me], dtype) for x in xs]
            with dist._coalescing_manager(group=group, async_ops=True) as cm:
                for o in outs:
                    dist.all_reduce(o, group=group)
            cm.wait()
            return [(f"out {i}", o, _reduced(x, "SUM", dtype), dtype, _bound(x, "SUM", dtype))
                    for i, (o, x) in enumerate(zip(outs, xs))]

        case(f"coalescing_manager all_reduce {dtype}", coalescing_all_reduce, True)

        def coalescing_all_gather(dtype: str = dtype) -> list[Check]:
            xs = [ins(f"cm-ag-{dtype}-{i}", dtype) for i in range(2)]
            outs = [torch.empty((n * SHAPE[0], SHAPE[1]), dtype=_dtype(dtype)) for _ in xs]
            with dist._coalescing_manager(group=group):
                for o, x in zip(outs, xs):
                    ag_single(o, tensor(x[me], dtype), group=group)
            return [(f"out {i}", o, np.concatenate(x), dtype, None) for i, (o, x) in enumerate(zip(outs, xs))]

        case(f"coalescing_manager all_gather_tensor {dtype}", coalescing_all_gather, True)

        def coalescing_reduce_scatter(dtype: str = dtype) -> list[Check]:
            xs = [ins(f"cm-rs-{dtype}-{i}", dtype, (n * 3, 2)) for i in range(2)]
            outs = [torch.empty((3, 2), dtype=_dtype(dtype)) for _ in xs]
            with dist._coalescing_manager(group=group):
                for o, x in zip(outs, xs):
                    rs_single(o, tensor(x[me], dtype), group=group)
            parts = [[a[3 * me:3 * me + 3] for a in x] for x in xs]
            return [(f"out {i}", o, _reduced(p, "SUM", dtype), dtype, _bound(p, "SUM", dtype))
                    for i, (o, p) in enumerate(zip(outs, parts))]

        case(f"coalescing_manager reduce_scatter_tensor {dtype}", coalescing_reduce_scatter, False)

    def barrier() -> list[Check]:
        dist.barrier(group=group)
        return []

    case("barrier", barrier, True)
    _objects(t, group, members, prefix, case)
    if n > 1:
        _point_to_point(t, group, members, prefix, case, dtypes)


def _obj(prefix: str, grank: int) -> dict:
    """A rank's picklable object: nested containers, a numpy array, a size that varies."""
    return {"rank": grank, "text": prefix + "x" * (grank + 1), "list": list(range(grank + 2)),
            "array": np.arange(grank + 1, dtype=np.int16), "nested": {"t": (grank, None, 1.5)}}


def _objects(t: Table, group: Any, members: list[int], prefix: str, case: Callable) -> None:
    """The object collectives; objects are compared by repr (== on the numpy arrays in them
    compares elementwise)."""
    import torch.distributed as dist

    me, n = members.index(t.rank), len(members)
    objs = [_obj(prefix, g) for g in members]

    for root in sorted({0, n - 1}):
        def broadcast_object_list(root: int = root) -> list[Check]:
            got = [objs[me], f"mine {me}"]
            dist.broadcast_object_list(got, src=members[root], group=group)
            return [("objects", repr(got), repr([objs[root], f"mine {root}"]), None, None)]

        case(f"broadcast_object_list root {root}", broadcast_object_list, True)

        def gather_object(root: int = root) -> list[Check]:
            got = [None] * n if me == root else None
            dist.gather_object(objs[me], got, dst=members[root], group=group)
            return [("objects", repr(got), repr(objs), None, None)] if me == root else []

        case(f"gather_object root {root}", gather_object, False)

        def scatter_object_list(root: int = root) -> list[Check]:
            got = [None]
            dist.scatter_object_list(got, objs if me == root else None, src=members[root], group=group)
            return [("object", repr(got[0]), repr(objs[me]), None, None)]

        case(f"scatter_object_list root {root}", scatter_object_list, False)

    def all_gather_object() -> list[Check]:
        got = [None] * n
        dist.all_gather_object(got, objs[me], group=group)
        return [("objects", repr(got), repr(objs), None, None)]

    case("all_gather_object", all_gather_object, True)


def _point_to_point(t: Table, group: Any, members: list[int], prefix: str, case: Callable,
                    dtypes: tuple[str, ...]) -> None:
    import torch
    import torch.distributed as dist

    me, n = members.index(t.rank), len(members)
    nxt, prev = members[(me + 1) % n], members[(me - 1) % n]

    def msg(case_name: str, src: int, dst: int, dtype: str) -> np.ndarray:
        return _input(f"{prefix}{case_name}-{dtype}-{dst}", src, SHAPE, dtype)

    for dtype in dtypes:
        def send_recv(dtype: str = dtype) -> list[Check]:
            # even group ranks send first, odd ones receive first: a ring of blocking calls
            # that cannot wait on itself
            out = torch.empty(SHAPE, dtype=_dtype(dtype))
            mine = to_tensor(msg("sr", t.rank, nxt, dtype), dtype)
            if me % 2 == 0:
                dist.send(mine, dst=nxt, group=group)
                dist.recv(out, src=prev, group=group)
            else:
                dist.recv(out, src=prev, group=group)
                dist.send(mine, dst=nxt, group=group)
            return [("from prev", out, msg("sr", prev, t.rank, dtype), dtype, None)]

        case(f"send_recv ring {dtype}", send_recv, False)

    def isend_irecv() -> list[Check]:
        # to every peer, two messages with different tags, received in the opposite order
        peers = [g for g in members if g != t.rank]
        sends, outs = [], {}
        for p in peers:
            for tag in (1, 2):
                sends.append(dist.isend(to_tensor(msg(f"tag{tag}", t.rank, p, "float64"), "float64"), dst=p,
                                        group=group, tag=tag))
        for p in peers:
            for tag in (2, 1):
                outs[(p, tag)] = torch.empty(SHAPE, dtype=torch.float64)
                dist.irecv(outs[(p, tag)], src=p, group=group, tag=tag).wait()
        for w in sends:
            w.wait()
        return [(f"from {p} tag {tag}", o, msg(f"tag{tag}", p, t.rank, "float64"), "float64", None)
                for (p, tag), o in sorted(outs.items())]

    case("isend_irecv tags", isend_irecv, False)

    def recv_any() -> list[Check]:
        # every other rank sends to the first; it receives from whoever comes first. A tag of
        # their own: a sender's next message (tag 0, the next case) could match otherwise.
        if me != 0:
            dist.send(to_tensor(msg("any", t.rank, members[0], "int32"), "int32"), dst=members[0], group=group,
                      tag=ANY_TAG)
            return []
        got = {}
        for _ in range(n - 1):
            out = torch.empty(SHAPE, dtype=torch.int32)
            src = dist.recv(out, src=None, group=group, tag=ANY_TAG)
            got[src] = out
        checks: list[Check] = [("sources", sorted(got), members[1:], None, None)]
        return checks + [(f"from {s}", o, msg("any", s, members[0], "int32"), "int32", None)
                         for s, o in sorted(got.items()) if s in members]

    case("recv any source", recv_any, False)

    def batch() -> list[Check]:
        peers = [g for g in members if g != t.rank]
        outs = {p: torch.empty(SHAPE, dtype=torch.float32) for p in peers}
        p2p = []
        for p in peers:
            p2p.append(dist.P2POp(dist.irecv, outs[p], p, group=group))
            p2p.append(dist.P2POp(dist.isend, to_tensor(msg("batch", t.rank, p, "float32"), "float32"), p,
                                  group=group))
        for w in dist.batch_isend_irecv(p2p):
            w.wait()
        return [(f"from {p}", o, msg("batch", p, t.rank, "float32"), "float32", None) for p, o in outs.items()]

    case("batch_isend_irecv", batch, False)


def _run_table(rank: int, size: int) -> tuple[dict, list[str]]:
    """The whole table on this rank: the world, then groups from new_group and new_subgroups."""
    import warnings

    import torch.distributed as dist

    warnings.simplefilter("ignore")  # deprecation notices of the older names torch still serves
    t = Table(rank)
    _table(t, None, list(range(size)), "", True)
    # every rank makes every group, in the same order; only members use theirs
    if size == 2:
        picked = [1, 0]
        subsets = [[0], [1]]
    else:
        picked = [2, 0]
        subsets = [[1, 2], [0]]
    group = dist.new_group(picked)  # torch orders a group's ranks
    members = sorted(picked)
    if rank in members:
        _table(t, group, members, f"new_group{members} ", False)
    mine, _ = dist.new_subgroups_by_enumeration(subsets)
    sub = next(s for s in subsets if rank in s)
    _table(t, mine, sub, f"subgroups{subsets}: {sub} ", False)
    single, _ = dist.new_subgroups(group_size=1)
    _table(t, single, [rank], f"subgroups(1): [{rank}] ", False)
    # the world still works, in step, after the groups
    t.case("world after groups", lambda: _after_groups(rank, size), list(range(size)))
    return t.results, t.failures


def _after_groups(rank: int, size: int) -> list[Check]:
    import torch
    import torch.distributed as dist

    out = torch.full((3,), float(rank + 1))
    dist.all_reduce(out)
    return [("out", out, np.full(3, size * (size + 1) / 2), "float32", None)]


# --- comparisons in the parent ----------------------------------------------------------------

def _agreement(per_rank: list[dict]) -> list[str]:
    """Cases whose outputs must be the same bits on every rank of their group, and are not."""
    problems = []
    for name in sorted({n for results in per_rank for n in results}):
        entries = {r: results[name] for r, results in enumerate(per_rank) if name in results}
        ranks = next((e[2] for e in entries.values() if e[0] == "ok" and e[2]), None)
        if ranks is None or any(r not in entries or entries[r][0] != "ok" for r in ranks):
            continue  # nothing to hold alike, or a failure reported on its own
        if any(entries[r][1] != entries[ranks[0]][1] for r in ranks):
            problems.append(f"{name}: ranks {ranks} hold different results")
    return problems


def _failures(per_rank: list[tuple[dict, list[str]]], label: str) -> list[str]:
    """What an accord run got wrong: a case raised, or a value differs from numpy's."""
    problems = []
    for rank, (results, wrong) in enumerate(per_rank):
        problems += [f"{label} {w}" for w in wrong]
        problems += [f"{label} rank {rank} {name}: {e[1]}" for name, e in results.items() if e[0] == "error"]
    return problems


def _versus_gloo(accord: list[dict], gloo: list[dict]) -> tuple[list[str], dict[str, str], set[str], set[str]]:
    """Between the two backends' runs: (mismatches, accord-only cases with gloo's refusal, cases
    where gloo's values differ from numpy's, cases compared bit for bit on every rank that ran
    them)."""
    mismatches, accord_only, gloo_off, compared = [], {}, set(), set()
    for name in sorted({n for results in accord for n in results}):
        ranks = [r for r, results in enumerate(accord) if name in results]
        ours = [accord[r][name] for r in ranks]
        theirs = [gloo[r].get(name, ("error", "not run")) for r in ranks]
        if any(e[0] != "ok" for e in ours):
            continue  # in accord's failures
        refused = [e[1] for e in theirs if e[0] != "ok"]
        if refused:
            accord_only[name] = re.sub(r"\[rank\d+\]:\[\S+ \S+ ", "[", refused[0].splitlines()[0])[:200]
        elif not all(e[3] for e in theirs):
            gloo_off.add(name)
        else:
            compared.add(name)
            mismatches += [f"rank {r} {name}: accord and gloo results differ"
                           for r, a, g in zip(ranks, ours, theirs) if a[1] != g[1]]
    return mismatches, accord_only, gloo_off, compared


def test_two_ranks_match_numpy_and_gloo(record_property):
    accord = run_ranks(_run_table, 2, init="torch:accord", timeout=240)
    gloo = run_ranks(_run_table, 2, init="torch", timeout=240)
    problems = _failures(accord, "accord") + _agreement([r for r, _ in accord])
    mismatches, accord_only, gloo_off, compared = _versus_gloo([r for r, _ in accord], [r for r, _ in gloo])
    record_property("accord_only", accord_only)
    record_property("gloo_differs_from_numpy", [w for _, wrong in gloo for w in wrong])
    print(f"{len(compared)} cases bitwise equal to gloo's; accord-only:\n  "
          + "\n  ".join(f"{k}: {v}" for k, v in accord_only.items()))
    assert not problems + mismatches, "\n".join(problems + mismatches)
    cases = {n for results, _ in accord for n in results}
    assert compared | set(accord_only) | gloo_off == cases
    assert len(compared) > len(cases) // 2, f"only {len(compared)} of {len(cases)} cases compared with gloo"


def test_three_ranks_match_numpy_and_each_other():
    accord = run_ranks(_run_table, 3, init="torch:accord", timeout=240)
    problems = _failures(accord, "accord") + _agreement([r for r, _ in accord])
    assert not problems, "\n".join(problems)
    assert len(accord[0][0]) > 300


def _repeated_steps(rank, size):
    import gc
    import weakref

    import torch
    import torch.distributed as dist

    out = []
    for step in range(12):  # the same calls every step: the engine plans them after a few
        dist.barrier()
        t = torch.full((4,), float(rank + step))
        dist.all_reduce(t)
        out.append(t[0].item())
    # A repeated step of gathers and reduce-scatters (their names recur, as FSDP's do): the
    # outputs the caller lets go of must be freed, not kept by the group until the name recurs.
    gathered, scattered, outputs = [], [], []
    for step in range(8):
        whole, part = torch.empty(3 * size), torch.empty(3)
        dist.all_gather_into_tensor(whole, torch.full((3,), float(10 * rank + step)))
        dist.reduce_scatter_tensor(part, torch.arange(3.0 * size) + step)
        gathered.append(whole.tolist())
        scattered.append(part.tolist())
        outputs += [weakref.ref(whole), weakref.ref(part)]
        del whole, part
    gc.collect()
    # a future asked for only after the work completed (the work makes it then, completed)
    t = torch.full((2,), float(rank + 1))
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    future = work.get_future()
    late_future = [future.done(), future.wait()[0].tolist()]
    return {"all_reduce": out, "gathered": gathered, "scattered": scattered,
            "outputs_alive": sum(ref() is not None for ref in outputs), "late_future": late_future}


def test_a_repeated_step_of_barriers_and_allreduces_runs_planned():
    """A step that starts with a barrier (no tensor, so no device): the planner used to look up a
    communicator for device '' and stopped the engine. Then repeated gathers and reduce-scatters
    give the right values, and leave nothing alive of the outputs their caller dropped; a future
    asked for after its work completed holds the result."""
    results = run_ranks(_repeated_steps, 2, init="torch:accord", timeout=120)
    for rank, got in enumerate(results):
        assert got["all_reduce"] == [float(1 + 2 * step) for step in range(12)]
        assert got["gathered"] == [[float(10 * r + step) for r in range(2) for _ in range(3)] for step in range(8)]
        assert got["scattered"] == [[2.0 * (3 * rank + i + step) for i in range(3)] for step in range(8)]
        assert got["outputs_alive"] == 0, f"rank {rank}: {got['outputs_alive']} dropped outputs still alive"
        assert got["late_future"] == [True, [3.0, 3.0]]
