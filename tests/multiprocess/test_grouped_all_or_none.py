"""A grouped call runs all of its tensors or none (real ranks; engine/negotiation/all_or_none.py).

Each case submits a group of three tensors whose middle member fails in the negotiation on
every rank: arguments one rank refuses (a non-contiguous member of an in-place grouped
allreduce, a 0-d member of a grouped allgather), or a member's shape that differs between the
ranks. Failing only that member would let its siblings run, so an in-place grouped allreduce
would raise with two of its three tensors already reduced. So every member's handle fails on every
rank (the failing member with its own error, the others with one naming the group and that
member, with a HINT), no tensor of the group is modified, and a correct grouped call under the
same name succeeds afterwards.

The ``cached``/``planned`` cases first run the correct group under the same name (its
requests are then in the response cache; 8 times: the ranks run it in the planned state), then
the bad one with the bad rank first and its peer two seconds later.
"""
from __future__ import annotations

import time

import pytest
from helpers.ranks import run_ranks

pytestmark = pytest.mark.timeout(90)

BAD_RANK = 1


def _t(*shape, fill=1.0):
    import torch

    return torch.full(shape, float(fill))


# --- the calls: (bad group, good group, what the good group returns) per kind -------------------

def _allreduce_noncontiguous(hvd, rank):
    """In place; the middle member a transposed view on the bad rank."""
    middle = _t(3, 4, fill=rank + 1).t() if rank == BAD_RANK else _t(4, 3, fill=rank + 1)
    tensors = [_t(2, fill=rank + 1), middle, _t(5, fill=rank + 1)]
    return hvd.grouped_allreduce_async_(tensors, name="g", op=hvd.Sum), tensors


def _allreduce_shape(hvd, rank):
    """In place; the middle member has 3 elements on rank 0, 4 on rank 1."""
    tensors = [_t(2, fill=rank + 1), _t(3 + rank, fill=rank + 1), _t(5, fill=rank + 1)]
    return hvd.grouped_allreduce_async_(tensors, name="g", op=hvd.Sum), tensors


def _allreduce_good(hvd, rank):
    shapes = [(2,), (4, 3), (5,)]
    out = hvd.grouped_allreduce_([_t(*s, fill=rank + 1) for s in shapes], name="g", op=hvd.Sum)
    return [t.tolist() for t in out]


def _allreduce_shape_good(hvd, rank):
    shapes = [(2,), (3,), (5,)]
    out = hvd.grouped_allreduce_([_t(*s, fill=rank + 1) for s in shapes], name="g", op=hvd.Sum)
    return [t.tolist() for t in out]


def _allgather_scalar(hvd, rank):
    """The middle member 0-d on the bad rank (allgather concatenates dim 0)."""
    import torch

    middle = torch.tensor(float(rank + 1)) if rank == BAD_RANK else _t(1, fill=rank + 1)
    tensors = [_t(1, 2, fill=rank + 1), middle, _t(2, 3, fill=rank + 1)]
    return hvd.grouped_allgather_async(tensors, name="g"), tensors


def _allgather_good(hvd, rank):
    out = hvd.grouped_allgather([_t(1 + rank, 2, fill=rank + 1), _t(1, fill=rank + 1), _t(2, 3, fill=rank + 1)],
                                name="g")
    return [t.tolist() for t in out]


_SUMS = [[3.0] * 2, [[3.0] * 3] * 4, [3.0] * 5]
# case -> (bad call, good call, its result, error type, the failing member's error)
CASES = {
    "allreduce_.noncontiguous_member": (
        _allreduce_noncontiguous, _allreduce_good, _SUMS, "InvalidArgumentError",
        "allreduce 'allreduce.g_2of3': invalid arguments on ranks [1]:\n  rank 1: Tensor is required to be "
        "contiguous."),
    "allreduce_.member_shape": (
        _allreduce_shape, _allreduce_shape_good, [[3.0] * 2, [3.0] * 3, [3.0] * 5], "MismatchError",
        "Mismatched allreduce shapes for 'allreduce.g_2of3': rank 0 sent [3], rank 1 sent [4]"),
    "allgather.scalar_member": (
        _allgather_scalar, _allgather_good, [[[1.0, 1.0], [2.0, 2.0], [2.0, 2.0]], [1.0, 2.0],
                                             [[1.0] * 3] * 2 + [[2.0] * 3] * 2],
        "InvalidArgumentError", "allgather 'allgather.g_2of3': invalid arguments on ranks [1]:\n  rank 1: "
                                "grouped_allgather needs a tensor with at least one dimension"),
}
VARIANTS = {  # variant -> (correct runs first, environment)
    "fresh": (0, {}),
    "cached": (2, {}),
    # Gloo: a group is planned only where batches go through a fusion buffer (not shm's)
    "planned": (8, {"ACCORD_CPU_BACKEND": "gloo"}),
}
# The failure must be found at once, in the negotiation, not at the stall inspector's first full
# exchange (its check time): that is set beyond run_ranks' 60 s, so only the prompt path returns.
SLOW_STALL_ENV = {"ACCORD_STALL_CHECK_TIME_SECONDS": "300"}


def _engine_handles(handle):
    """The engine's per-member handles behind a Horovod handle (before it is synchronized)."""
    from accord.torch import gateway

    return list(gateway._table[handle].handles)


def _member_outcome(engine_handle):
    if not engine_handle.done():
        return ("pending", "")
    try:
        engine_handle.result()
    except Exception as exc:  # the outcome is what the parent compares
        return (type(exc).__name__, str(exc))
    return ("ok", "")


def _one_case(rank, size, case, variant):
    import torch

    import accord.torch as hvd
    from accord.engine import session

    bad, good, _, _, _ = CASES[case]
    repeats, _ = VARIANTS[variant]
    hvd.init()
    hvd.allreduce(torch.ones(2), name="warm", op=hvd.Sum)  # both ranks up before the case
    planned = session.engine().stats()["planned_cycles"]
    for _ in range(repeats):
        good(hvd, rank)
    planned = session.engine().stats()["planned_cycles"] - planned
    if 0 < repeats < 8:
        hvd.barrier()  # leaves nothing pending: the bad call starts from a cached name
    if repeats and rank != BAD_RANK:
        time.sleep(2.0)
    handle, tensors = bad(hvd, rank)
    before = [t.clone() for t in tensors]
    members = _engine_handles(handle)
    try:
        hvd.synchronize(handle)
        raised = ("ok", False, "")
    except Exception as exc:  # the outcome is what the parent compares
        raised = (type(exc).__name__, isinstance(exc, ValueError), str(exc))
    for m in members:
        m.wait(10.0)
    outcomes = [_member_outcome(m) for m in members]
    unchanged = [torch.equal(t, b) for t, b in zip(tensors, before)]
    after = good(hvd, rank)
    hvd.shutdown()
    return dict(raised=raised, members=outcomes, unchanged=unchanged, after=after, planned=planned)


# every case fresh and cached; planned: one case suffices (allgathers are never planned)
RUNS = [(c, v) for c in CASES for v in ("fresh", "cached")] + [("allreduce_.noncontiguous_member", "planned")]


@pytest.mark.timeout(90)
@pytest.mark.parametrize(("case", "variant"), RUNS, ids=[f"{c}-{v}" for c, v in RUNS])
def test_a_group_with_a_failing_member_fails_as_a_whole_on_every_rank(case, variant):
    _, _, good_result, kind, culprit_error = CASES[case]
    _, env = VARIANTS[variant]
    results = run_ranks(_one_case, 2, case, variant, init="accord", timeout=60, env={**SLOW_STALL_ENV, **env})
    op = case.split(".")[0].rstrip("_")
    sibling_start = (f"{op} '{op}.g_1of3' did not run: its group '{op}.g' runs all of its tensors or none, "
                     f"and its member '{op}.g_2of3' failed on every rank:\n{culprit_error}")
    for rank, res in enumerate(results):
        name, is_value_error, message = res["raised"]
        assert name == kind and (is_value_error or kind == "MismatchError"), (rank, res["raised"])
        assert message.startswith(sibling_start) and "HINT:" in message, (rank, message)
        assert "no tensor of the group was changed" in message, (rank, message)
        kinds = [k for k, _ in res["members"]]
        assert kinds == [kind] * 3, (rank, res["members"])  # every member's handle failed
        assert res["members"][1][1].startswith(culprit_error), (rank, res["members"][1])
        assert "HINT:" in res["members"][1][1], (rank, res["members"][1])
        assert res["members"][2][1].startswith(sibling_start.replace("g_1of3", "g_3of3", 1)), (rank, res["members"])
        assert res["unchanged"] == [True] * 3, (rank, res["unchanged"])  # nothing of the group ran
        assert res["after"] == good_result, (rank, res["after"])  # the next group runs, correctly
        if variant == "planned":
            assert res["planned"] > 0, (rank, res["planned"])
    assert results[0]["members"] == results[1]["members"], results  # the same messages on both ranks


# --- the decision itself (pure) ---------------------------------------------------------------

def _exchange(sigs_per_rank, groups):
    from accord.engine.negotiation.negotiate import Exchange

    pending = [{n: (s, 1.0) for n, s in sigs.items()} for sigs in sigs_per_rank]
    return Exchange(pending, [{}] * len(pending), [], groups=[groups] * len(pending))


@pytest.mark.timeout(30)
def test_decide_fails_every_member_of_a_group_with_a_failed_member():
    import torch

    from accord.engine.negotiation.negotiate import ResponseCache, decide
    from accord.engine.request import Op, Request

    sig = Request("x", Op.ALLREDUCE, torch.ones(2)).signature
    names = [f"g_{i}of10" for i in range(1, 11)]
    group = {n: ("g", 10) for n in names}
    other = {"h": sig}  # not grouped: it runs
    good = dict({n: sig for n in names}, **other)
    refused = dict(good, g_10of10=sig._replace(problem="bad\nHINT: fix it"), g_2of10=sig._replace(problem="bad"))
    cache = ResponseCache()
    d = decide(_exchange([good, refused], group), cache, 1)
    assert d.ready == ["h"] and set(d.errors) == set(names) and d.invalid == set(names)
    assert len(cache) == 1 and set(d.agreed) == {"h"}  # no member cached or agreed
    # the members that failed, in the call's order; the first one's error and HINT
    assert d.errors["g_1of10"].startswith("allreduce 'g_1of10' did not run: its group 'g' runs all of its "
                                          "tensors or none, and its members 'g_2of10', 'g_10of10' failed")
    assert d.errors["g_1of10"].endswith("HINT: fix the allreduce arguments on those ranks; no tensor of the "
                                        "group was changed; fix 'g_2of10' as the error says and call the group "
                                        "again")
    assert d.errors["g_2of10"].startswith("allreduce 'g_2of10': invalid arguments on ranks [1]")
    # a mismatch: MismatchError for every member (not in ``invalid``)
    mismatched = dict(good, g_3of10=sig._replace(shape=(3,)))
    d = decide(_exchange([good, mismatched], group), ResponseCache(), 1)
    assert d.ready == ["h"] and set(d.errors) == set(names) and not d.invalid
    assert "Mismatched allreduce shapes for 'g_3of10': rank 0 sent [2], rank 1 sent [3]" in d.errors["g_1of10"]
    # nothing wrong: the whole group is ready
    assert sorted(decide(_exchange([good, good], group), ResponseCache(), 1).ready) == sorted(names + ["h"])
