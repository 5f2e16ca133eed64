"""Requests that differ between ranks raise on every rank, never hang (accord.torch, real ranks).

One job per (backend, layout) runs the whole matrix: each case submits one collective whose
arguments differ between the ranks (shape, dtype, reduce op, scale factors, compression,
root, group size, alltoall splits; sync, async, in-place, polled, grouped), or differ in a way
Horovod allows (allgather/alltoall dim 0, splits, in-place against out-of-place, submission
order), and the parent checks that every rank saw the same outcome. Cases already covered
elsewhere (allreduce shape/dtype/root/op-name mismatches in test_engine.py and
test_torch_ops.py, Sum against Max in test_torch_api_variants.py, an uneven alltoall without
splits) are not repeated. Layouts: 2 ranks, and a process set {0, 1} of 3 ranks. Backends: the
default (shm on one host) and Gloo (ACCORD_CPU_BACKEND=gloo).

The stall settings are short, so a case that regresses into a stall fails within seconds with
a StallError naming it, instead of timing out the job.
"""
from __future__ import annotations

import functools
import time
from types import SimpleNamespace

import pytest
from helpers.ranks import run_ranks

pytestmark = pytest.mark.timeout(120)

STALL_ENV = {"ACCORD_STALL_CHECK_TIME_SECONDS": "2", "ACCORD_STALL_SHUTDOWN_TIME_SECONDS": "5"}


def _t(*shape, dtype=None, fill=1.0):
    import torch

    return torch.full(shape, float(fill), dtype=dtype or torch.float32)


def _pick(rank, first, other):
    return first if rank == 0 else other


# --- mismatches: (case, fn(hvd, rank), error type, fragment of the message; {s}: the set's suffix)

def _f64(rank):
    import torch

    return _pick(rank, torch.float32, torch.float64)


def _poll_then_sync(hvd, handle):
    while not hvd.poll(handle):
        time.sleep(0.005)
    return hvd.synchronize(handle)


MISMATCHES = [
    ("allreduce.prescale",
     lambda h, r: h.allreduce(_t(3), name="m.pre", op=h.Sum, prescale_factor=_pick(r, 1.0, 2.0)),
     "MismatchError", "Mismatched allreduce prescale factors for 'allreduce.m.pre{s}': rank 0 sent 1.0, "
                      "rank 1 sent 2.0"),
    ("allreduce.postscale",
     lambda h, r: h.allreduce(_t(3), name="m.post", op=h.Sum, postscale_factor=_pick(r, 1.0, 0.5)),
     "MismatchError", "Mismatched allreduce postscale factors for 'allreduce.m.post{s}': rank 0 sent 1.0, "
                      "rank 1 sent 0.5"),
    ("allreduce.sum_vs_average", lambda h, r: h.allreduce(_t(3), name="m.op", op=_pick(r, h.Sum, h.Average)),
     "MismatchError", "Mismatched allreduce reduce ops for 'allreduce.m.op{s}': rank 0 sent SUM, rank 1 sent AVERAGE"),
    ("allreduce.same_numel_other_shape", lambda h, r: h.allreduce(_pick(r, _t(4), _t(2, 2)), name="m.ndim"),
     "MismatchError", "Mismatched allreduce shapes for 'allreduce.m.ndim{s}': rank 0 sent [4], rank 1 sent [2, 2]"),
    ("allreduce.fp16_vs_none", lambda h, r: h.allreduce(_t(3), name="m.comp",
                                                       compression=_pick(r, h.Compression.fp16, h.Compression.none)),
     "MismatchError", "Mismatched allreduce compressed data types for 'allreduce.m.comp{s}': rank 0 sent float16, "
                      "rank 1 sent float32"),
    ("allreduce.dtype_without_compression", lambda h, r: h.allreduce(_t(3, dtype=_f64(r)), name="m.dtype"),
     "MismatchError", "Mismatched allreduce data types for 'allreduce.m.dtype{s}': rank 0 sent float32, "
                      "rank 1 sent float64\nHINT:"),  # one line: nothing about compression, which nobody used
    ("allreduce_async_.shape", lambda h, r: h.synchronize(h.allreduce_async_(_t(3 + r), name="m.ashape")),
     "MismatchError", "Mismatched allreduce shapes for 'allreduce.m.ashape{s}': rank 0 sent [3], rank 1 sent [4]"),
    ("allreduce_async.polled", lambda h, r: _poll_then_sync(h, h.allreduce_async(_t(3 + r), name="m.poll")),
     "MismatchError", "Mismatched allreduce shapes for 'allreduce.m.poll{s}'"),
    ("allreduce.late_rank", lambda h, r: (time.sleep(0.5 * r), h.allreduce(_t(3 + r), name="m.late"))[1],
     "MismatchError", "Mismatched allreduce shapes for 'allreduce.m.late{s}'"),
    ("allreduce.unnamed", lambda h, r: h.allreduce(_t(5 + r)),
     "MismatchError", "Mismatched allreduce shapes for 'allreduce.noname."),
    ("grouped_allreduce.member_shape", lambda h, r: h.grouped_allreduce([_t(2), _t(3 + r)], name="m.gshape"),
     "MismatchError", "Mismatched allreduce shapes for 'allreduce.m.gshape_2of2{s}': rank 0 sent [3], rank 1 sent [4]"),
    ("grouped_allreduce.op", lambda h, r: h.grouped_allreduce([_t(2), _t(3)], name="m.gop", op=_pick(r, h.Sum, h.Min)),
     "MismatchError", "Mismatched allreduce reduce ops for 'allreduce.m.gop_1of2{s}': rank 0 sent SUM, "
                      "rank 1 sent MIN"),
    ("grouped_allreduce_async_.member_dtype",
     lambda h, r: h.synchronize(h.grouped_allreduce_async_([_t(2), _t(3, dtype=_f64(r))], name="m.gdt")),
     "MismatchError", "Mismatched allreduce data types for 'allreduce.m.gdt_2of2{s}'"),
    ("allgather.dim1", lambda h, r: h.allgather(_t(2, 2 + r), name="m.ag1"),
     "MismatchError", "Mismatched allgather shapes (after dim 0) for 'allgather.m.ag1{s}': rank 0 sent [2], "
                      "rank 1 sent [3]"),
    ("allgather.ndim", lambda h, r: h.allgather(_pick(r, _t(3), _t(3, 1)), name="m.agnd"),
     "MismatchError", "Mismatched allgather shapes (after dim 0) for 'allgather.m.agnd{s}': rank 0 sent [], "
                      "rank 1 sent [1]"),
    ("allgather_async.dtype", lambda h, r: h.synchronize(h.allgather_async(_t(2, dtype=_f64(r)), name="m.agdt")),
     "MismatchError", "Mismatched allgather data types for 'allgather.m.agdt{s}'"),
    ("grouped_allgather.member_dim1", lambda h, r: h.grouped_allgather([_t(1, 2), _t(1, 2 + r)], name="m.gag"),
     "MismatchError", "Mismatched allgather shapes (after dim 0) for 'allgather.m.gag_2of2{s}'"),
    ("broadcast.shape", lambda h, r: h.broadcast(_t(3 + r), root_rank=0, name="m.bcs"),
     "MismatchError", "Mismatched broadcast shapes for 'broadcast.m.bcs{s}': rank 0 sent [3], rank 1 sent [4]"),
    ("broadcast.dtype", lambda h, r: h.broadcast(_t(3, dtype=_f64(r)), root_rank=0, name="m.bcd"),
     "MismatchError", "Mismatched broadcast data types for 'broadcast.m.bcd{s}'"),
    ("broadcast_async_.root", lambda h, r: h.synchronize(h.broadcast_async_(_t(3), root_rank=1 - r, name="m.bcr")),
     "MismatchError", "Mismatched broadcast root ranks for 'broadcast.m.bcr{s}': rank 0 sent 1, rank 1 sent 0"),
    ("broadcast.root_out_of_range_on_one_rank", lambda h, r: h.broadcast(_t(3), root_rank=_pick(r, 0, 7), name="m.bco"),
     "MismatchError", "Mismatched broadcast root ranks for 'broadcast.m.bco{s}': rank 0 sent 0, rank 1 sent 7"),
    ("broadcast.root_outside_the_set_everywhere", lambda h, r: h.broadcast(_t(3), root_rank=7, name="m.bcx"),
     "InvalidArgumentError", "broadcast 'broadcast.m.bcx{s}': root rank 7 is not in process set"),
    ("alltoall.dim1", lambda h, r: h.alltoall(_t(2, 1 + r), name="m.a2a1"),
     "MismatchError", "Mismatched alltoall shapes (after dim 0) for 'alltoall.m.a2a1{s}'"),
    ("alltoall_async.dtype", lambda h, r: h.synchronize(h.alltoall_async(_t(2, dtype=_f64(r)), name="m.a2adt")),
     "MismatchError", "Mismatched alltoall data types for 'alltoall.m.a2adt{s}'"),
    ("reducescatter.dim0", lambda h, r: h.reducescatter(_t(4 + 2 * r), name="m.rs0"),
     "MismatchError", "Mismatched reducescatter shapes for 'reducescatter.m.rs0{s}': rank 0 sent [4], rank 1 sent [6]"),
    ("reducescatter.dim1", lambda h, r: h.reducescatter(_t(4, 1 + r), name="m.rs1"),
     "MismatchError", "Mismatched reducescatter shapes for 'reducescatter.m.rs1{s}'"),
    ("reducescatter.op", lambda h, r: h.reducescatter(_t(4), name="m.rsop", op=_pick(r, h.Sum, h.Average)),
     "MismatchError", "Mismatched reducescatter reduce ops for 'reducescatter.m.rsop{s}'"),
    ("reducescatter_async.prescale",
     lambda h, r: h.synchronize(h.reducescatter_async(_t(4), name="m.rspre", prescale_factor=_pick(r, 1.0, 3.0))),
     "MismatchError", "Mismatched reducescatter prescale factors for 'reducescatter.m.rspre{s}'"),
    ("grouped_reducescatter.member_dtype",
     lambda h, r: h.grouped_reducescatter([_t(4), _t(2, dtype=_f64(r))], name="m.grs"),
     "MismatchError", "Mismatched reducescatter data types for 'reducescatter.m.grs_2of2{s}'"),
    # group sizes: the request names differ (g_1of2 against g_1of3), so without this check they would stall
    ("grouped_allreduce.group_size", lambda h, r: h.grouped_allreduce([_t(2)] * (2 + r), name="m.gsize"),
     "MismatchError", "Mismatched allreduce group sizes for 'allreduce.m.gsize{s}': rank 0 sent a group of 2 tensors, "
                      "rank 1 sent a group of 3 tensors"),
    ("grouped_allgather.one_vs_single",
     lambda h, r: h.grouped_allgather([_t(1, 2)], name="m.g1") if r == 0 else h.allgather(_t(1, 2), name="m.g1"),
     "MismatchError", "Mismatched allgather group sizes for 'allgather.m.g1{s}': rank 0 sent a group of 1 tensor, "
                      "rank 1 sent 1 tensor without a group"),
    ("grouped_reducescatter_async.group_size",
     lambda h, r: h.synchronize(h.grouped_reducescatter_async([_t(4)] * (1 + 2 * r), name="m.grsize")),
     "MismatchError", "Mismatched reducescatter group sizes for 'reducescatter.m.grsize{s}'"),
    # alltoall splits are per-rank data: bad ones on one rank must not stall the others
    ("alltoall.bad_splits_on_rank_0", lambda h, r: h.alltoall(_t(2), splits=_pick(r, [2, 1], [1, 1]), name="m.sp0"),
     "InvalidArgumentError", "alltoall: invalid arguments on ranks [0]"),
    ("alltoall_async.split_count_on_rank_1",
     lambda h, r: h.synchronize(h.alltoall_async(_t(2), splits=_pick(r, [1, 1], [2]), name="m.sp1")),
     "InvalidArgumentError", "alltoall: invalid arguments on ranks [1]"),
]


# --- what Horovod allows to differ: each returns nothing and asserts its own values ----------

def _allgather_dim0(h, r):
    got = h.allgather(_t(r * 2, 3, fill=r + 1), name="ok.ag")  # rank 0 sends no rows
    assert got.shape == (2, 3) and bool((got == 2).all()), got


def _grouped_allgather_dim0(h, r):
    a, b = h.grouped_allgather([_t(1 + r, 2, fill=r), _t(2 - r, 1, fill=r)], name="ok.gag")
    assert a[:, 0].tolist() == [0, 1, 1] and b[:, 0].tolist() == [0, 0, 1], (a, b)


def _alltoall_splits(h, r):
    import torch

    rows = torch.arange(3 + r, dtype=torch.float32) + 10 * r
    out, received = h.alltoall(rows, splits=_pick(r, [1, 2], [3, 1]), name="ok.a2a")
    want = _pick(r, ([0.0, 10.0, 11.0, 12.0], [1, 3]), ([1.0, 2.0, 13.0], [2, 1]))
    assert (out.tolist(), received.tolist()) == want, (out, received)


def _alltoall_splits_vs_none(h, r):
    out = h.alltoall(_t(4, fill=r), splits=[3, 1] if r == 0 else None, name="ok.a2an")
    out = out[0] if isinstance(out, tuple) else out
    assert out.tolist() == _pick(r, [0.0, 0.0, 0.0, 1.0, 1.0], [0.0, 1.0, 1.0]), out


def _in_place_vs_out_of_place(h, r):
    t = _t(3, fill=r + 1)
    got = h.allreduce_(t, name="ok.io", op=h.Sum) if r == 0 else h.allreduce(t, name="ok.io", op=h.Sum)
    assert got.tolist() == [3.0] * 3 and (r == 1 or got is t), got
    got = h.broadcast_(_t(2, fill=7), 0, name="ok.bio") if r == 0 else h.broadcast(_t(2), 0, name="ok.bio")
    assert got.tolist() == [7.0, 7.0], got


def _sync_vs_async(h, r):
    got = (h.allreduce(_t(2), name="ok.sa", op=h.Sum) if r == 0
           else h.synchronize(h.allreduce_async(_t(2), name="ok.sa", op=h.Sum)))
    assert got.tolist() == [2.0, 2.0], got


def _orders_differ(h, r):
    """Thirty names of three kinds, submitted and synchronized in opposite orders."""
    names = [f"ok.ord.{i}" for i in range(30)]
    handles = {}
    for n in names if r == 0 else names[::-1]:
        i = int(n.rsplit(".", 1)[1])
        if i % 3 == 0:
            handles[n] = h.allreduce_async(_t(4, fill=i + r), name=n, op=h.Sum)
        elif i % 3 == 1:
            handles[n] = h.allgather_async(_t(1 + r, 2, fill=i), name=n)
        else:
            handles[n] = h.grouped_allreduce_async([_t(2, fill=i), _t(3, fill=r)], name=n, op=h.Sum)
    for n in sorted(handles, reverse=r == 1):
        i, got = int(n.rsplit(".", 1)[1]), h.synchronize(handles[n])
        if i % 3 == 0:
            assert got.tolist() == [2.0 * i + 1] * 4, (n, got)
        elif i % 3 == 1:
            assert got.shape == (3, 2) and bool((got == i).all()), (n, got)
        else:
            assert got[0].tolist() == [2.0 * i] * 2 and got[1].tolist() == [1.0] * 3, (n, got)


def _one_bad_in_a_batch(h, r):
    """A mismatched name among good ones submitted together: the good ones complete right."""
    good = [h.allreduce_async(_t(5, fill=i + r), name=f"ok.batch.{i}", op=h.Sum) for i in range(8)]
    bad = h.allreduce_async(_t(2 + r), name="ok.batch.bad")
    gathered = h.allgather_async(_t(1, 2, fill=r), name="ok.batch.ag")
    for i, handle in enumerate(good):
        assert h.synchronize(handle).tolist() == [2.0 * i + 1] * 5
    assert h.synchronize(gathered)[:, 0].tolist() == [0.0, 1.0]
    with pytest.raises(h.HorovodInternalError, match="Mismatched allreduce shapes for 'allreduce.ok.batch.bad"):
        h.synchronize(bad)


def _second_group_size_in_flight(h, r):
    """One rank never holds two sizes under one name (what makes the group-size check exact).
    Each rank in turn checks while its peer holds back the name, so it is surely in flight."""
    for holder in (0, 1):
        name = f"ok.twice{holder}"
        if r != holder:
            h.allreduce(_t(1), name=f"{name}.go", op=h.Sum)
        first = h.grouped_allreduce_async([_t(2), _t(2)], name=name, op=h.Sum)
        if r == holder:
            with pytest.raises(ValueError, match="a group of 2 under this name is in flight"):
                h.grouped_allreduce_async([_t(2)] * 3, name=name)
            with pytest.raises(ValueError, match="a group of 2 under this name is in flight"):
                h.allreduce_async(_t(2), name=name)
            h.allreduce(_t(1), name=f"{name}.go", op=h.Sum)
        assert [t.tolist() for t in h.synchronize(first)] == [[2.0, 2.0]] * 2
        assert len(h.synchronize(h.grouped_allreduce_async([_t(2)] * 3, name=name, op=h.Sum))) == 3


def _planned_then_mismatch(h, r):
    """A name repeated until the engine runs it without negotiating (planned cycles), then
    mismatched once: every rank raises, then the name works again."""
    from accord.engine import session

    before = session.engine().stats()["planned_cycles"]
    for _ in range(8):
        assert h.allreduce(_t(4, fill=r), name="ok.steady", op=h.Sum).tolist() == [1.0] * 4
    assert session.engine().stats()["planned_cycles"] > before
    with pytest.raises(h.HorovodInternalError, match="Mismatched allreduce shapes for 'allreduce.ok.steady"):
        h.allreduce(_t(4 + r), name="ok.steady", op=h.Sum)
    assert h.allreduce(_t(4, fill=r), name="ok.steady", op=h.Sum).tolist() == [1.0] * 4


ALLOWED = [_allgather_dim0, _grouped_allgather_dim0, _alltoall_splits, _alltoall_splits_vs_none,
           _in_place_vs_out_of_place, _sync_vs_async, _orders_differ, _one_bad_in_a_batch,
           _second_group_size_in_flight, _planned_then_mismatch]

_COLLECTIVES = {
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "grouped_allreduce",
    "grouped_allreduce_async", "grouped_allreduce_async_", "allgather", "allgather_async",
    "grouped_allgather", "grouped_allgather_async", "broadcast", "broadcast_", "broadcast_async",
    "broadcast_async_", "alltoall", "alltoall_async", "reducescatter", "reducescatter_async",
    "grouped_reducescatter", "grouped_reducescatter_async"}


def _in_set(hvd, process_set):
    """``hvd`` whose collectives run on ``process_set``."""
    api = SimpleNamespace(**{k: getattr(hvd, k) for k in dir(hvd) if not k.startswith("_")})
    for name in _COLLECTIVES:
        setattr(api, name, functools.partial(getattr(hvd, name), process_set=process_set))
    return api


def _outcome(fn):
    try:
        fn()
    except (Exception, pytest.fail.Exception) as exc:  # the outcome is what the parent compares
        return type(exc).__name__, isinstance(exc, RuntimeError), str(exc)
    return "ok", False, ""


def _matrix(rank, size):
    import accord.torch as hvd
    from accord.engine import session

    hvd.init()
    api = hvd
    if size == 3:  # ranks 0 and 1 run the matrix in the set {0, 1}; rank 2 is outside it
        api = _in_set(hvd, hvd.add_process_set([0, 1]))
        if rank == 2:
            hvd.barrier()
            hvd.shutdown()
            return None
    out = {"backend": session.backend_name("cpu")}
    for case, fn, _, _ in MISMATCHES:
        out[case] = _outcome(functools.partial(fn, api, rank))
    for fn in ALLOWED:
        out[fn.__name__] = _outcome(functools.partial(fn, api, rank))
    if size == 3:
        hvd.barrier()
    hvd.shutdown()
    return out


@pytest.mark.parametrize("nprocs", [2, 3], ids=["2ranks", "set01_of_3"])
@pytest.mark.parametrize("backend", ["auto", "gloo"])
def test_every_rank_raises_the_same_error(backend, nprocs):
    env = dict(STALL_ENV, ACCORD_CPU_BACKEND=backend)
    results = run_ranks(_matrix, nprocs, init="accord", timeout=90, env=env)[:2]
    assert [r["backend"] for r in results] == [{"auto": "shm", "gloo": "gloo"}[backend]] * 2
    suffix = "@ps1" if nprocs == 3 else ""
    problems = []
    for case, _, kind, fragment in MISMATCHES:
        seen = [r[case] for r in results]
        want = fragment.format(s=suffix)
        if any(s[0] != kind or not s[1] or want not in s[2] or "HINT:" not in s[2] for s in seen):
            problems.append(f"{case}: expected {kind} with {want!r} on both ranks, got {seen}")
        elif kind == "MismatchError" and seen[0][2] != seen[1][2]:
            problems.append(f"{case}: the ranks' messages differ: {seen}")
    for fn in ALLOWED:
        seen = [r[fn.__name__] for r in results]
        if any(s[0] != "ok" for s in seen):
            problems.append(f"{fn.__name__}: expected success on both ranks, got {seen}")
    assert not problems, "\n".join(problems)


# --- a stall while the ranks run planned cycles is reported within the stall settings ----------

def _stall_while_planned(rank, size):
    import accord.torch as hvd
    from accord.engine import session

    hvd.init()
    for _ in range(6):
        hvd.allreduce(_t(2), name="w", op=hvd.Sum)
    out = {"planned": session.engine().stats()["planned_cycles"]}
    if rank == 0:  # submits the repeated name once more; rank 1 never does
        with pytest.raises(hvd.HorovodInternalError) as info:
            hvd.allreduce(_t(2), name="w", op=hvd.Sum)
    else:
        from helpers.stacks import wait_until

        # stopped by the stall verdict while this rank submits nothing; its "late" call below
        # would end a stall that nothing else ended, so the test must not need it
        out["stopped_alone"] = wait_until(lambda: not session.engine().running, timeout=60)
        with pytest.raises(hvd.HorovodInternalError) as info:
            hvd.allreduce(_t(2), name="late", op=hvd.Sum)
    out.update(error=type(info.value).__name__, message=str(info.value))
    hvd.shutdown()
    return out


def test_a_stall_during_planned_cycles_stops_every_rank_on_time():
    # The rank with nothing pending must leave the plan within the stall horizon: were it to leave
    # only after a quarter of the collective timeout, its peer would block meanwhile in the plan's
    # collective and the stall would be reported that late whatever the stall settings say. That
    # quarter (150 s here) outlasts rank 1's 60 s wait for its engine to stop: the message is the
    # same either way, the engine of a rank that stayed in the plan is still running.
    env = {"ACCORD_STALL_CHECK_TIME_SECONDS": "0.5", "ACCORD_STALL_SHUTDOWN_TIME_SECONDS": "1.5",
           "ACCORD_COLLECTIVE_TIMEOUT": "600"}
    results = run_ranks(_stall_while_planned, 2, init="accord", timeout=100, env=env)
    for res in results:
        assert res["planned"] > 0, res
        assert res["error"] == "StallError", res
        assert "'allreduce.w': submitted by ranks [0]" in res["message"], res
        assert "missing on ranks [1]" in res["message"] and "HINT:" in res["message"], res
    assert "names waited more than 1.5 s" in results[0]["message"], results[0]  # the stall settings' verdict
    assert results[1]["stopped_alone"], results[1]  # the verdict reached rank 1, which left the plan


# --- the negotiation's decision on group sizes (pure) ----------------------------------------

def _exchange(per_rank, joined=()):
    """An exchange where ``per_rank`` is, per rank, {name: (key, size) or None (not grouped)}."""
    import torch

    from accord.engine.negotiation.negotiate import Exchange
    from accord.engine.request import Op, Request

    sig = Request("x", Op.ALLREDUCE, torch.ones(2)).signature
    pending = [{n: (sig, 1.0) for n in names} for names in per_rank]
    groups = [{n: g for n, g in names.items() if g} for names in per_rank]
    return Exchange(pending, [{}] * len(per_rank), list(joined), groups=groups)


def test_group_sizes_are_compared_once_every_member_holds_the_name():
    from accord.engine.negotiation.negotiate import ResponseCache, decide

    two = {f"g_{i}of2": ("g", 2) for i in (1, 2)}
    three = {f"g_{i}of3": ("g", 3) for i in (1, 2, 3)}
    # rank 2 has not submitted g yet: nothing fails (it would wait on peers gone ahead)
    d = decide(_exchange([two, three, {}]), ResponseCache(), 1)
    assert not d.errors and {p.name for p in d.partial} == set(two) | set(three)
    # every member holds it: every name under the key fails, on every rank alike
    d = decide(_exchange([two, three, two]), ResponseCache(), 1)
    assert set(d.errors) == set(two) | set(three) and not d.partial and not d.ready
    assert d.errors["g_1of2"].startswith("Mismatched allreduce group sizes for 'g': ranks 0, 2 sent a group of "
                                         "2 tensors, rank 1 sent a group of 3 tensors\nHINT:")
    # a joined rank counts as holding it; equal sizes are ready
    assert set(decide(_exchange([two, three, {}], joined=[2]), ResponseCache(), 1).errors) == set(two) | set(three)
    assert decide(_exchange([two, two]), ResponseCache(), 1).ready == sorted(two)
    # one tensor under the key's own name against a group of one
    d = decide(_exchange([{"g": None}, {"g_1of1": ("g", 1)}]), ResponseCache(), 1)
    assert "rank 0 sent 1 tensor without a group, rank 1 sent a group of 1 tensor" in d.errors["g"]


def test_a_request_on_a_set_stopped_by_another_sets_error_names_that_error():
    # While the stop that another set's stall forced on this set is still being negotiated, a
    # new request here fails with that stall, not with "not running (shut down, ...)".
    from accord.engine.cycle.controller import Controller
    from accord.engine.settings import EngineSettings
    from accord.errors import ShutdownError, StallError

    c = Controller(0, 0, SimpleNamespace(ranks=(0, 1)), sets=None, settings=EngineSettings())
    assert isinstance(c.stopped_error(), ShutdownError)
    c.request_stop(StallError("Stall shutdown: 'x@ps1' ..."))
    error = c.stopped_error()
    assert isinstance(error, StallError) and "Stall shutdown: 'x@ps1'" in str(error)
