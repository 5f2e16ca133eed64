"""accord.mxnet: an argument refused on one rank only raises on every rank, at once (2 real
ranks, default stall settings).

Each case has exactly one rank pass an argument accord.mxnet refuses (a non-NDArray, a sparse
NDArray, a 0-d array where dim 0 is concatenated or split, a reduce op reducescatter cannot
run, alltoall splits that are not 1-D int32 or not numbers, a root_rank that is not an int),
while its peer passes a fine one under the same name. Were the bad rank to raise at once, its
peer would wait for it forever (or the call would run, or fail with another error): so the request
carries the problem and every rank raises InvalidArgumentError (a ValueError and a RuntimeError)
that is also an MXNetError, as Horovod's MXNet ops fail, with one message naming the rank and a
HINT. A correct collective afterwards succeeds on both ranks.
"""
from __future__ import annotations

import numpy as np
import pytest
from helpers.mxnet_env import require_mxnet
from helpers.ranks import run_ranks

require_mxnet()

pytestmark = pytest.mark.timeout(120)

BAD_RANK = 1  # the rank that passes the bad argument (unless a case says otherwise)


def _pick(rank, good, bad, bad_rank=BAD_RANK):
    return bad() if rank == bad_rank else good()


def _nd(*shape):
    import mxnet as mx

    return mx.nd.ones(shape)


def _scalar():
    """A 0-d NDArray (MXNet 1.9.1 makes one from a numpy scalar)."""
    import mxnet as mx

    return mx.nd.array(np.float32(1))


def _sparse(stype):
    return lambda: _nd(2, 3).tostype(stype)


def _int_nd(values, dtype):
    import mxnet as mx

    return lambda: mx.nd.array(values, dtype=dtype)


# case -> (fn(hvd, rank), fragment of the message)
CASES = {
    # --- arguments that are no (dense) NDArray --------------------------------------------------
    "allreduce.numpy_array": (
        lambda h, r: h.allreduce(_pick(r, lambda: _nd(3), lambda: np.ones(3)), name="np", op=h.Sum),
        "allreduce 'allreduce.np': invalid arguments on ranks [1]:\n  rank 1: allreduce takes an mxnet "
        "NDArray, got ndarray\nHINT: pass mx.nd.array(...)"),
    "allreduce_.row_sparse_on_rank_0": (
        lambda h, r: h.allreduce_(_pick(r, lambda: _nd(2, 3), _sparse("row_sparse"), 0), name="rsp"),
        "invalid arguments on ranks [0]:\n  rank 0: allreduce_ takes a dense NDArray, got storage type "
        "'row_sparse'\nHINT: convert it with .tostype('default')"),
    "grouped_allreduce.none_member": (
        lambda h, r: h.grouped_allreduce([_nd(2), _pick(r, lambda: _nd(2), lambda: None)], name="g"),
        "allreduce 'allreduce.g_2of2': invalid arguments on ranks [1]:\n  rank 1: grouped_allreduce takes "
        "an mxnet NDArray, got NoneType"),
    "broadcast_.csr_on_root": (
        lambda h, r: h.broadcast_(_pick(r, lambda: _nd(2, 3), _sparse("csr"), 0), root_rank=0, name="csr"),
        "broadcast 'broadcast.csr': invalid arguments on ranks [0]:\n  rank 0: broadcast_ takes a dense "
        "NDArray, got storage type 'csr'"),
    # --- 0-d arrays where the op concatenates or splits dim 0 -----------------------------------
    "allgather.scalar": (
        lambda h, r: h.allgather(_pick(r, lambda: _nd(1), _scalar), name="ag0"),
        "allgather 'allgather.ag0': invalid arguments on ranks [1]:\n  rank 1: allgather needs an NDArray "
        "with at least one dimension, got a scalar (shape ())\nHINT: reshape it"),
    "grouped_allgather.scalar_member": (
        lambda h, r: h.grouped_allgather([_nd(1), _pick(r, lambda: _nd(1), _scalar)], name="gag0"),
        "allgather 'allgather.gag0_2of2': invalid arguments on ranks [1]"),
    "alltoall.scalar": (
        lambda h, r: h.alltoall(_pick(r, lambda: _nd(2), _scalar), name="a2a0"),
        "rank 1: alltoall needs an NDArray with at least one dimension, got a scalar"),
    "reducescatter.scalar": (
        lambda h, r: h.reducescatter(_pick(r, lambda: _nd(2), _scalar), op=h.Sum, name="rs0"),
        "rank 1: reducescatter needs an NDArray with at least one dimension, got a scalar"),
    # --- per-call arguments that differ between ranks -------------------------------------------
    "reducescatter.max_on_one_rank": (
        lambda h, r: h.reducescatter(_nd(4), op=h.Max if r == BAD_RANK else h.Sum, name="rsmax"),
        "reducescatter 'reducescatter.rsmax': invalid arguments on ranks [1]:\n  rank 1: reducescatter "
        "supports only Sum and Average, got MAX\nHINT: use op=hvd.Sum"),
    "grouped_reducescatter.unknown_op": (
        lambda h, r: h.grouped_reducescatter([_nd(4)], op="max" if r == BAD_RANK else h.Sum, name="grs"),
        "rank 1: grouped_reducescatter: unknown reduce op 'max'\nHINT: use hvd.Average"),
    "allreduce.unknown_op": (
        lambda h, r: h.allreduce(_nd(3), op="sum" if r == BAD_RANK else h.Sum, name="uop"),
        "allreduce 'allreduce.uop': invalid arguments on ranks [1]:\n  rank 1: allreduce: unknown reduce op "
        "'sum'"),
    "alltoall.splits_int64_ndarray": (
        lambda h, r: h.alltoall(_nd(2), splits=_pick(r, _int_nd([1, 1], "int32"), _int_nd([1, 1], "int64")),
                                name="a2a64"),
        "rank 1: alltoall splits must hold 32-bit integers, got an NDArray of int64 (2,)\nHINT: pass "
        "splits.astype('int32')"),
    "alltoall.splits_2d": (
        lambda h, r: h.alltoall(_nd(2), splits=[1, 1] if r != BAD_RANK else [[1, 1]], name="a2a2d"),
        "rank 1: alltoall splits must be 1-D, got shape (1, 2)"),
    "alltoall.splits_not_numbers": (
        lambda h, r: h.alltoall(_nd(2), splits=[1, 1] if r != BAD_RANK else ["1", "1"], name="a2as"),
        "rank 1: alltoall splits must be numbers, got ['1', '1']"),
    "broadcast.root_not_an_int": (
        lambda h, r: h.broadcast(_nd(3), root_rank=None if r == BAD_RANK else 0, name="brn"),
        "broadcast 'broadcast.brn': invalid arguments on ranks [1]:\n  rank 1: root_rank must be an int, "
        "got None\nHINT: pass the global rank"),
}


# broadcast_object's root goes to accord.frontend.object_collectives, which takes no problem: the bad rank
# takes part with root -1 (see accord.mxnet.functions.broadcast_object)
BROADCAST_OBJECT = "broadcast_object.root_not_an_int"
OTHER = {BROADCAST_OBJECT: lambda h, r: h.broadcast_object({"r": r}, root_rank=None if r == BAD_RANK else 0,
                                                           name="bo")}


def _run_case(hvd, mx, rank, case):
    try:
        (CASES[case][0] if case in CASES else OTHER[case])(hvd, rank)
        outcome = ("ok", ())
    except Exception as exc:  # the outcome is what the parent compares
        kinds = tuple(k.__name__ for k in (ValueError, RuntimeError, mx.base.MXNetError) if isinstance(exc, k))
        outcome = (type(exc).__name__, kinds, str(exc))
    after = hvd.allreduce(mx.nd.ones(3) * (rank + 1), average=False, name="after").asnumpy().tolist()
    return outcome, after


def _every_case(rank, size):
    """All cases in one job, one after the other (starting two MXNet ranks takes ~5 s): each
    case must leave the engine working for the next."""
    import mxnet as mx

    import accord.mxnet as hvd

    hvd.init()
    hvd.allreduce(mx.nd.ones(2), name="warm")  # both ranks up before the clock starts
    out = {case: _run_case(hvd, mx, rank, case) for case in [*CASES, *OTHER]}
    hvd.shutdown()
    return out


@pytest.fixture(scope="module")
def outcomes():
    return run_ranks(_every_case, 2, init="accord", timeout=100)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", list(CASES))
def test_an_argument_refused_on_one_rank_raises_on_every_rank(outcomes, case):
    fragment = CASES[case][1]
    results = [per_rank[case] for per_rank in outcomes]
    for rank, (outcome, after) in enumerate(results):
        assert outcome[:2] == ("InvalidArgumentError", ("ValueError", "RuntimeError", "MXNetError")), (rank, outcome)
        assert fragment in outcome[2] and "HINT:" in outcome[2], (rank, outcome[2])
        assert after == [3.0, 3.0, 3.0], (rank, after)  # the engine keeps working
    assert results[0][0] == results[1][0], results  # one message, the same on both ranks


@pytest.mark.timeout(120)
def test_broadcast_object_with_a_root_that_is_no_int_on_one_rank_fails_on_every_rank(outcomes):
    """The root is refused before the engine has to encode it (which would fail on every rank as
    "a bug in accord"): the bad rank says what it passed and its peer reports the roots that differ."""
    results = [per_rank[BROADCAST_OBJECT] for per_rank in outcomes]
    (good, _), (bad, _) = results[1 - BAD_RANK], results[BAD_RANK]
    both = ("ValueError", "RuntimeError", "MXNetError")
    assert bad[:2] == ("InvalidArgumentError", both), bad
    assert "broadcast_object: root_rank must be an int, got None\nHINT: pass the global rank" in bad[2], bad
    assert good[:2] == ("MismatchError", ("RuntimeError", "MXNetError")), good
    assert "broadcast" in good[2] and "-1" in good[2] and "HINT:" in good[2], good
    for rank, (_, after) in enumerate(results):
        assert after == [3.0, 3.0, 3.0], (rank, after)
