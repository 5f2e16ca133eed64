"""Arguments refused on one rank only raise on every rank, at once (real ranks, default stall
settings).

Each case has exactly one rank pass an argument the engine or the torch frontend refuses (a
non-contiguous, 0-d, sparse or non-tensor argument, a reduce op or splits that do not fit, root's
scatter splits...), while its peer submits a fine request under the same name. Were the bad
rank to raise at submission, its peer would wait for it forever (the default stall settings only
warn); so the request carries the problem and the negotiation fails the name on every rank:
InvalidArgumentError (a ValueError, as Horovod's frontend checks raise, and a RuntimeError, as
its core's do), one message naming the rank, what it passed and a HINT. A correct collective
afterwards succeeds on both ranks.

The ``cached``/``planned`` cases submit under a name the response cache already holds (that the
ranks run without negotiating), the refusing (or mismatching) rank first and its peer two
seconds later: the conflict must show at once, not only at the stall inspector's next full
exchange (60 s) (engine/negotiation/announce.py).
"""
from __future__ import annotations

import time

import pytest
from helpers.ranks import run_ranks

pytestmark = pytest.mark.timeout(90)

BAD_RANK = 1  # the rank that passes the bad argument (unless a case says otherwise)


def _t(*shape, dtype=None, fill=1.0):
    import torch

    return torch.full(shape, float(fill), dtype=dtype or torch.float32)


def _pick(rank, good, bad, bad_rank=BAD_RANK):
    return bad if rank == bad_rank else good


def _noncontig(rank, bad_rank=BAD_RANK):
    """A [4, 3] tensor of ones, a transposed view on ``bad_rank``."""
    return _t(3, 4).t() if rank == bad_rank else _t(4, 3)


def _engine(op, tensor, name, **kw):
    from accord.engine import session

    return session.synchronize(session.submit(op, tensor, name, **kw))


def _cached_then(hvd, rank, submit, repeats=2):
    """Run ``submit`` ``repeats`` times correctly (its name is then cached; 8 times: the ranks
    run it in the planned state), then once more with the bad rank first and its peer two
    seconds later (longer than the idle tick)."""
    from accord.engine import session

    before = session.engine().stats()["planned_cycles"]
    for _ in range(repeats):
        submit(hvd, rank, ok=True)
    assert repeats < 8 or session.engine().stats()["planned_cycles"] > before, "never planned"
    if repeats < 8:
        hvd.barrier()
    if rank != BAD_RANK:
        time.sleep(2.0)
    submit(hvd, rank, ok=False)


def _allreduce_w(hvd, rank, ok, noncontig=True):
    t = _t(4, 3) if ok else (_noncontig(rank) if noncontig else _t(4 + (rank == BAD_RANK), 3))
    return hvd.allreduce(t, name="w", op=hvd.Sum)


# case -> (fn(hvd, rank), error type, fragment of the message)
CASES = {
    # --- the torch frontend: a tensor Horovod refuses (ValueError in Horovod) ---------------
    "allreduce.noncontiguous": (
        lambda h, r: h.allreduce(_noncontig(r), name="nc", op=h.Sum),
        "InvalidArgumentError", "allreduce 'allreduce.nc': invalid arguments on ranks [1]:\n  rank 1: Tensor is "
                                "required to be contiguous. (shape [4, 3], strides [1, 4])\nHINT: call .contiguous()"),
    "allreduce_async_.noncontiguous_on_rank_0": (
        lambda h, r: h.synchronize(h.allreduce_async_(_noncontig(r, 0), name="nc0", op=h.Sum)),
        "InvalidArgumentError", "invalid arguments on ranks [0]:\n  rank 0: Tensor is required to be contiguous."),
    "grouped_allreduce.noncontiguous_member": (
        lambda h, r: h.grouped_allreduce([_t(2), _noncontig(r)], name="gnc", op=h.Sum),
        "InvalidArgumentError", "allreduce 'allreduce.gnc_2of2': invalid arguments on ranks [1]"),
    "broadcast_.noncontiguous_on_root": (
        lambda h, r: h.broadcast_(_noncontig(r, 0), root_rank=0, name="bnc"),
        "InvalidArgumentError", "broadcast 'broadcast.bnc': invalid arguments on ranks [0]"),
    "allgather.noncontiguous": (
        lambda h, r: h.allgather(_noncontig(r), name="agnc"),
        "InvalidArgumentError", "allgather 'allgather.agnc': invalid arguments on ranks [1]"),
    "allreduce.sparse": (
        lambda h, r: h.allreduce(_pick(r, _t(3), _t(3).to_sparse()), name="sp", op=h.Sum),
        "InvalidArgumentError", "rank 1: allreduce does not take sparse tensors (layout torch.sparse_coo)"),
    "allreduce_async.none": (
        lambda h, r: h.synchronize(h.allreduce_async(_pick(r, _t(3), None), name="none", op=h.Sum)),
        "InvalidArgumentError", "rank 1: allreduce expects a torch.Tensor, got NoneType"),
    # --- 0-d tensors where the op splits or concatenates dim 0 -------------------------------
    "allgather.scalar": (  # the autograd form: it read dim 0 first (IndexError on that rank alone)
        lambda h, r: h.allgather(_pick(r, _t(1), _t()), name="ag0"),
        "InvalidArgumentError", "rank 1: allgather needs a tensor with at least one dimension, got a scalar "
                                "(shape [])\nHINT: reshape it"),
    "allgather_async.scalar_on_rank_0": (
        lambda h, r: h.synchronize(h.allgather_async(_pick(r, _t(1), _t(), 0), name="ag00")),
        "InvalidArgumentError", "allgather 'allgather.ag00': invalid arguments on ranks [0]"),
    "grouped_allgather.scalar_member": (
        lambda h, r: h.grouped_allgather([_t(1), _pick(r, _t(1), _t())], name="gag0"),
        "InvalidArgumentError", "allgather 'allgather.gag0_2of2': invalid arguments on ranks [1]"),
    "alltoall.scalar": (
        lambda h, r: h.alltoall(_pick(r, _t(2), _t()), name="a2a0"),
        "InvalidArgumentError", "rank 1: alltoall needs a tensor with at least one dimension, got a scalar"),
    "reducescatter.scalar": (
        lambda h, r: h.reducescatter(_pick(r, _t(2), _t()), name="rs0", op=h.Sum),
        "InvalidArgumentError", "rank 1: reducescatter cannot scatter a scalar tensor (shape [])"),
    # --- per-call arguments that differ between ranks ----------------------------------------
    "reducescatter.max_on_one_rank": (
        lambda h, r: h.reducescatter(_t(4), name="rsmax", op=_pick(r, h.Sum, h.Max)),
        "InvalidArgumentError", "rank 1: reducescatter supports only Sum and Average, got MAX\nHINT: use op=hvd.Sum"),
    "alltoall.splits_not_integers": (
        lambda h, r: h.alltoall(_t(2), splits=_pick(r, [1, 1], [1.0, 1.0]), name="a2af"),
        "InvalidArgumentError", "rank 1: splits must be integers, got [1.0, 1.0]"),
    "alltoall.splits_not_a_list": (
        lambda h, r: h.alltoall(_t(2), splits=_pick(r, [1, 1], 2), name="a2an"),
        "InvalidArgumentError", "rank 1: splits must be a list of integers, got int"),
    "alltoall.splits_float_tensor": (
        lambda h, r: h.alltoall(_t(2), splits=_pick(r, [1, 1], _t(2)), name="a2aft"),
        "InvalidArgumentError", "rank 1: splits must be a 1-D integer tensor, got torch.float32 of shape [2]"),
    "broadcast.root_not_an_int": (
        lambda h, r: h.broadcast(_t(3), root_rank=_pick(r, 0, 0.0), name="brf"),
        "InvalidArgumentError", "rank 1: root_rank must be an int, got 0.0"),
    "allreduce.adasum_int_tensor": (
        lambda h, r: h.allreduce(_t(3, dtype=_pick(r, None, __import__("torch").int64)), name="adi", op=h.Adasum),
        "InvalidArgumentError", "rank 1: Adasum needs floating point tensors, got torch.int64"),
    # --- the engine's own checks (accord.engine.session) -------------------------------------
    "engine.scatter_bad_splits_on_root": (
        lambda h, r: _engine("scatter", _pick(r, _t(0, 2), _t(5, 2), 0), "sc", root_rank=0,
                             splits=_pick(r, None, [2, 1], 0)),
        "InvalidArgumentError", "scatter 'sc': invalid arguments on ranks [0]:\n  rank 0: root's splits [2, 1] must "
                                "have 2 non-negative entries summing to dim 0 (5)\nHINT: pass one row count"),
    "engine.scatter_scalar_on_root": (
        lambda h, r: _engine("scatter", _pick(r, _t(0), _t(), 0), "sc0", root_rank=0),
        "InvalidArgumentError", "rank 0: scatter needs a tensor with at least one dimension, got a scalar"),
    "engine.gather_scalar": (
        lambda h, r: _engine("gather", _pick(r, _t(1), _t()), "ga0", root_rank=0),
        "InvalidArgumentError", "rank 1: gather needs a tensor with at least one dimension, got a scalar"),
    "engine.allreduce_adasum_on_one_rank": (
        lambda h, r: _engine("allreduce", _t(3), "ada", reduce_op=_pick(r, h.Sum, h.Adasum)),
        "InvalidArgumentError", "rank 1: allreduce does not support Adasum\nHINT: use Sum or Average"),
    "engine.bool_scaled_on_one_rank": (
        lambda h, r: _engine("allreduce", _t(3, dtype=__import__("torch").bool), "bsc", reduce_op=h.Max,
                             prescale_factor=_pick(r, 1.0, 2.0)),
        "InvalidArgumentError", "rank 1: a bool tensor cannot be scaled (prescale 2.0, postscale 1.0)"),
    "engine.broadcast_root_none": (
        lambda h, r: _engine("broadcast", _t(3), "brn", in_place=True, root_rank=_pick(r, 0, None)),
        "InvalidArgumentError", "rank 1: root_rank must be an int, got None\nHINT: pass the global rank"),
    "engine.prescale_not_a_number": (
        lambda h, r: _engine("allreduce", _t(3), "psn", prescale_factor=_pick(r, 1.0, "2")),
        "InvalidArgumentError", "rank 1: prescale_factor must be a number, got '2'"),
    "broadcast_object.root_none": (
        lambda h, r: h.broadcast_object({"r": r}, root_rank=_pick(r, 0, None), name="bo"),
        "InvalidArgumentError", "rank 1: root_rank must be an int, got None"),
    # --- a cached name, the bad rank first -----------------------------------------------------
    "cached.noncontiguous_first": (
        lambda h, r: _cached_then(h, r, _allreduce_w),
        "InvalidArgumentError", "allreduce 'allreduce.w': invalid arguments on ranks [1]"),
    "planned.noncontiguous_first": (
        lambda h, r: _cached_then(h, r, _allreduce_w, repeats=8),
        "InvalidArgumentError", "allreduce 'allreduce.w': invalid arguments on ranks [1]"),
    "cached.mismatch_first": (
        lambda h, r: _cached_then(h, r, lambda h, r, ok: _allreduce_w(h, r, ok, noncontig=False)),
        "MismatchError", "Mismatched allreduce shapes for 'allreduce.w': rank 0 sent [4, 3], rank 1 sent [5, 3]"),
}


def _one_case(rank, size, case):
    import torch

    import accord.torch as hvd

    hvd.init()
    hvd.allreduce(torch.ones(2), name="warm", op=hvd.Sum)
    try:
        CASES[case][0](hvd, rank)
        outcome = ("ok", False, False, "")
    except Exception as exc:  # the outcome is what the parent compares
        outcome = (type(exc).__name__, isinstance(exc, ValueError), isinstance(exc, RuntimeError), str(exc))
    after = hvd.allreduce(torch.full((3,), float(rank + 1)), name="after", op=hvd.Sum).tolist()
    hvd.shutdown()
    return outcome, after


@pytest.mark.timeout(90)
@pytest.mark.parametrize("case", list(CASES))
def test_an_argument_refused_on_one_rank_raises_on_every_rank(case):
    _, kind, fragment = CASES[case]
    results = run_ranks(_one_case, 2, case, init="accord", timeout=45)
    outcomes = [o for o, _ in results]
    for rank, (outcome, after) in enumerate(results):
        name, is_value_error, is_runtime_error, message = outcome
        assert name == kind, (rank, outcome)
        assert is_runtime_error and (is_value_error or kind == "MismatchError"), (rank, outcome)
        assert fragment in message and "HINT:" in message, (rank, message)
        assert after == [3.0, 3.0, 3.0], (rank, after)  # the engine keeps working
    assert outcomes[0][3] == outcomes[1][3], outcomes  # one message, the same on both ranks
