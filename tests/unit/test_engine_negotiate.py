"""Negotiation decisions (pure logic): cache ids, readiness, mismatch text, partial presence."""
import pytest

from accord.engine.negotiation import negotiate as neg
from accord.engine.negotiation.negotiate import Exchange, Partial, ResponseCache, decide
from accord.engine.request import Signature

pytestmark = pytest.mark.timeout(10)


def sig(shape=(3,), op="allreduce", dtype="float32", pset=0, reduce_op=1, root=-1, pre=1.0):
    return Signature(op, dtype, dtype, tuple(shape), "cpu", reduce_op, root, pre, 1.0, pset)


SETS = {1: (0, 2)}  # process set 1 = ranks 0 and 2 (set 0 is every rank)


def exch(per_rank, joined=()):
    """An Exchange where each rank reports the members of the sets its requests use."""
    sets = [{sig.process_set: SETS[sig.process_set] for sig, _ in d.values()
             if sig.process_set in SETS} for d in per_rank]
    return Exchange(list(per_rank), sets, list(joined))


def test_new_ids_follow_the_lowest_ranks_submission_order_and_survive_updates():
    cache = ResponseCache()
    d = decide(exch([{"b": (sig(), 0), "a": (sig(), 0)}, {"a": (sig(), 0), "b": (sig(), 0)}]), cache, tick=1)
    assert d.ready == ["b", "a"]  # rank 0 submitted b first
    assert cache.id_of("b", sig()) == 0 and cache.id_of("a", sig()) == 1
    # a later name is appended; an existing name with a new signature keeps its id
    d = decide(exch([{"c": (sig(), 0), "a": (sig((4,)), 0)}, {"a": (sig((4,)), 0), "c": (sig(), 0)}]), cache, tick=2)
    assert d.ready == ["a", "c"]
    assert cache.id_of("a", sig((4,))) == 1 and cache.id_of("a", sig()) is None
    assert cache.id_of("c", sig()) == 2 and len(cache) == 3
    # a set without rank 0: its lowest member's order counts
    d = decide(exch([{}, {"y": (sig(pset=1), 0), "x": (sig(pset=1), 0)}, {}]), ResponseCache(), tick=1)
    assert d.ready == []  # set 1 is {0, 2}: rank 1 cannot use it (and rank 0 lacks it)
    both = {"y": (sig(pset=1), 0), "x": (sig(pset=1), 0)}
    d = decide(exch([both, {}, dict(reversed(list(both.items())))]),
               ResponseCache(), tick=1)
    assert d.ready == ["y", "x"]


def test_ready_order_is_cache_id_order_not_arrival_order():
    cache = ResponseCache()
    decide(exch([{"z": (sig(), 0)}, {"z": (sig(), 0)}]), cache, tick=1)  # z gets id 0
    d = decide(exch([{"a": (sig(), 0), "z": (sig(), 0)}, {"z": (sig(), 0), "a": (sig(), 0)}]), cache, tick=2)
    assert d.ready == ["z", "a"]


def test_counts_vector_and_ready_detection():
    cache = ResponseCache()
    with_s = {"a": (sig(), 0), "s": (sig(pset=1), 0)}
    decide(exch([with_s, {"a": (sig(), 0)}, dict(with_s)]), cache, tick=1)
    a, s = cache.id_of("a", sig()), cache.id_of("s", sig(pset=1))
    v0 = neg.build_vector([a, s], len(cache), want_full=False, shutdown=False, joined=False)
    v1 = neg.build_vector([a], len(cache), want_full=True, shutdown=True, joined=False)
    v2 = neg.build_vector([s], len(cache), want_full=False, shutdown=False, joined=False)
    assert v0 == [0, 0, 0, 0, 1, 1] and v1 == [1, 1, 0, 0, 1, 0]
    sums = [x + y + z for x, y, z in zip(v0, v1, v2)]
    # 'a' has 2 of 3 ranks; 's' has both members of its set {0, 2}
    assert neg.ready_from_counts(sums, cache) == [s]
    sums[neg.HEADER + a] = 3
    assert neg.ready_from_counts(sums, cache) == [a, s]


def test_peers_wait_on_me_reads_counts_and_uncached_slot():
    cache = ResponseCache()
    decide(exch([{"a": (sig(), 0), "b": (sig(), 0)}, {"a": (sig(), 0), "b": (sig(), 0)}]), cache, tick=1)
    a, b = cache.id_of("a", sig()), cache.id_of("b", sig())
    mine = neg.build_vector([a], len(cache), want_full=False, shutdown=False, joined=False)
    # The peer has nothing pending: nobody waits on this rank, it may block in the next cycle.
    peer = neg.build_vector([], len(cache), want_full=False, shutdown=False, joined=False)
    assert not neg.peers_wait_on_me([x + y for x, y in zip(mine, peer)], mine, False)
    # The peer has a and b: it waits on this rank's b.
    peer = neg.build_vector([a, b], len(cache), want_full=False, shutdown=False, joined=False)
    assert neg.peers_wait_on_me([x + y for x, y in zip(mine, peer)], mine, False)
    # The peer waits on a request with no cache entry (not in the vector): assume it needs us.
    peer = neg.build_vector([], len(cache), want_full=False, shutdown=False, joined=False, uncached=True)
    assert neg.peers_wait_on_me([x + y for x, y in zip(mine, peer)], mine, False)
    # ... but this rank's own uncached request does not count as a peer's.
    mine_u = neg.build_vector([a], len(cache), want_full=False, shutdown=False, joined=False, uncached=True)
    peer = neg.build_vector([a], len(cache), want_full=False, shutdown=False, joined=False)
    assert not neg.peers_wait_on_me([x + y for x, y in zip(mine_u, peer)], mine_u, True)


def test_shape_mismatch_message_lists_every_rank():
    d = decide(exch([{"grad.fc.weight": (sig((3,)), 0)}, {"grad.fc.weight": (sig((4,)), 0)}]), ResponseCache(), tick=1)
    assert d.ready == []
    msg = d.errors["grad.fc.weight"]
    assert msg.startswith("Mismatched allreduce shapes for 'grad.fc.weight': rank 0 sent [3], rank 1 sent [4]")
    assert "\nHINT: " in msg


def test_mismatch_groups_equal_values_and_reports_each_field():
    per_rank = [{"x": (sig((2, 2)), 0)}, {"x": (sig((2, 2), dtype="float64"), 0)},
                {"x": (sig((2, 2)), 0)}]
    msg = decide(exch(per_rank), ResponseCache(), 1).errors["x"]
    assert "Mismatched allreduce data types for 'x': ranks 0, 2 sent float32, rank 1 sent float64" in msg
    per_rank = [{"x": (sig(op="allreduce"), 0)}, {"x": (sig(op="broadcast", root=0), 0)}]
    msg = decide(exch(per_rank), ResponseCache(), 1).errors["x"]
    assert "Mismatched operations for 'x': rank 0 sent allreduce, rank 1 sent broadcast" in msg
    per_rank = [{"x": (sig(reduce_op=1), 0)}, {"x": (sig(reduce_op=4), 0)}]
    msg = decide(exch(per_rank), ResponseCache(), 1).errors["x"]
    assert "Mismatched allreduce reduce ops for 'x': rank 0 sent SUM, rank 1 sent MAX" in msg
    per_rank = [{"x": (sig(op="allgather", shape=(3,)), 0)}, {"x": (sig(op="allgather", shape=(5,)), 0)}]
    msg = decide(exch(per_rank), ResponseCache(), 1).errors["x"]
    assert "Mismatched allgather shapes (after dim 0) for 'x': rank 0 sent [3], rank 1 sent [5]" in msg
    per_rank = [{"x": (sig(pre=1.0), 0)}, {"x": (sig(pre=0.5), 0)}]
    msg = decide(exch(per_rank), ResponseCache(), 1).errors["x"]
    assert "Mismatched allreduce prescale factors for 'x': rank 0 sent 1.0, rank 1 sent 0.5" in msg
    post = [sig()._replace(postscale=2.0), sig()]
    msg = decide(exch([{"x": (post[0], 0)}, {"x": (post[1], 0)}]), ResponseCache(), 1).errors["x"]
    assert "Mismatched allreduce postscale factors for 'x': rank 0 sent 2.0, rank 1 sent 1.0" in msg
    # a CUDA tensor on one rank and a CPU tensor on another (built without a GPU: only the
    # signatures meet here)
    devices = [sig(), sig()._replace(device="cuda")]
    msg = decide(exch([{"x": (devices[0], 0)}, {"x": (devices[1], 0)}]), ResponseCache(), 1).errors["x"]
    assert "Mismatched allreduce device types for 'x': rank 0 sent cpu, rank 1 sent cuda" in msg
    assert msg.rstrip().splitlines()[-1].startswith("HINT:")


def test_mismatch_waits_for_every_member_then_is_reported_to_all():
    # Reported while rank 1 has not submitted "x", the error would reach ranks 0 and 2 only,
    # and rank 1 would later wait for them forever (found by the randomized stress test).
    per_rank = [{"x": (sig((3,)), 1.5)}, {}, {"x": (sig((4,)), 0.5)}]
    d = decide(exch(per_rank), ResponseCache(), 1)
    assert d.errors == {} and d.ready == []
    assert d.partial == [Partial("x", 0, (0, 2), (1,), 1.5)]
    per_rank[1] = {"x": (sig((3,)), 0.0)}
    d = decide(exch(per_rank), ResponseCache(), 1)
    assert "ranks 0, 1 sent [3], rank 2 sent [4]" in d.errors["x"] and not d.partial
    # a joined rank will not submit it: no reason to wait
    d = decide(exch([{"x": (sig((3,)), 0)}, {}, {"x": (sig((4,)), 0)}], joined=[1]), ResponseCache(), 1)
    assert "x" in d.errors and not d.partial
    # signatures that name different process sets: every member of both must be there
    d = decide(exch([{"x": (sig(pset=1), 0)}, {"x": (sig(), 0)}, {}]), ResponseCache(), 1)
    assert d.errors == {} and d.partial == [Partial("x", 1, (0, 1), (2,), 0)]


def test_refused_arguments_wait_for_every_member_then_fail_as_invalid_everywhere():
    # A request a rank refused (Request.refuse) carries its problem in the signature: once every
    # member holds the name it fails as InvalidArgumentError on all of them, never runs or is cached.
    bad = sig()._replace(problem="Tensor is required to be contiguous. (shape [3], strides [2])\n"
                                 "HINT: call .contiguous() on the tensor before allreduce")
    per_rank = [{"x": (sig(), 0.0)}, {"x": (bad, 1.0)}, {}]
    cache = ResponseCache()
    d = decide(exch(per_rank), cache, 1)
    assert d.errors == {} and d.partial == [Partial("x", 0, (0, 1), (2,), 1.0)]
    per_rank[2] = {"x": (bad, 0.0)}
    d = decide(exch(per_rank), cache, 2)
    assert d.invalid == {"x"} and d.ready == [] and not d.partial and len(cache) == 0
    assert d.errors["x"] == ("allreduce 'x': invalid arguments on ranks [1, 2]:\n  ranks 1, 2: Tensor is "
                             "required to be contiguous. (shape [3], strides [2])\n"
                             "HINT: call .contiguous() on the tensor before allreduce")
    # the same problem on every rank (identical signatures) fails all the same
    d = decide(exch([{"x": (bad, 0.0)}] * 2), ResponseCache(), 1)
    assert d.invalid == {"x"} and "ranks 0, 1: Tensor is required" in d.errors["x"]
    # the problem travels in the payload; a signature without one keeps its 10 fields
    assert neg.decode_pending(neg.encode_pending([("x", bad, 0.5)]))[0] == {"x": (bad, 0.5)}
    assert len(sig().to_json()) == 10 and Signature.from_json(bad.to_json()) == bad != sig()


def test_partial_presence_stays_pending_with_missing_ranks_and_oldest_age():
    per_rank = [{"a": (sig(), 5.0), "b": (sig(), 1.0)}, {"b": (sig(), 2.0)}, {"a": (sig(), 7.5)}]
    cache = ResponseCache()
    d = decide(exch(per_rank), cache, 1)
    assert d.ready == [] and d.errors == {}
    assert d.partial == [Partial("a", 0, (0, 2), (1,), 7.5), Partial("b", 0, (0, 1), (2,), 2.0)]
    assert len(cache) == 0  # nothing cached until it is ready


def test_process_set_members_only():
    per_rank = [{"s": (sig(pset=1), 0)}, {}, {"s": (sig(pset=1), 0)}]
    assert decide(exch(per_rank), ResponseCache(), 1).ready == ["s"]
    d = decide(exch([{"s": (sig(pset=9), 0)}, {"s": (sig(pset=9), 0)}]), ResponseCache(), 1)
    assert "process set 9" in d.errors["s"]


def test_joined_ranks_count_as_present():
    d = decide(exch([{"a": (sig(), 0)}, {}], joined=[1]), ResponseCache(), 1)
    assert d.ready == ["a"]


def test_eviction_replaces_least_recently_ready_entry_in_place():
    cache = ResponseCache(capacity=2)
    decide(exch([{"a": (sig(), 0), "b": (sig(), 0)}] * 2), cache, tick=1)
    cache.touch([0], tick=5)  # 'a' used recently, 'b' not
    d = decide(exch([{"c": (sig(), 0)}] * 2), cache, tick=6)
    assert d.ready == ["c"]
    assert cache.id_of("c", sig()) == 1 and cache.id_of("b", sig()) is None and len(cache) == 2
    # more ready names than capacity: the extra ones still run, after the cached ones
    d = decide(exch([{"p": (sig(), 0), "q": (sig(), 0), "r": (sig(), 0)}] * 2), cache, tick=7)
    assert d.ready == ["p", "q", "r"] and len(cache) == 2


def test_payload_roundtrip_and_split():
    entries = [("w", sig((2, 3)), 1.25), ("b", sig(op="broadcast", root=1, pset=1), 0.0)]
    data = [neg.encode_pending(entries, {1: (0, 2)}), neg.encode_pending([], joined=True)]
    decoded, sets, joined = neg.decode_pending(data[0])
    assert decoded == {"w": (sig((2, 3)), 1.25), "b": (sig(op="broadcast", root=1, pset=1), 0.0)}
    assert sets == {1: (0, 2)} and not joined
    ex = neg.split_payloads(b"".join(data), 2)
    assert ex.pending == [decoded, {}] and ex.sets == [{1: (0, 2)}, {}] and ex.joined == [1]
    with pytest.raises(ValueError):
        neg.split_payloads(b"".join(data) + b"{}", 2)
    assert data[0].startswith(b"{")  # JSON, never pickle


def test_process_set_members_come_from_the_exchange_not_local_state():
    # rank 1 registered set 1 as [0, 1] while rank 0 has [0, 1] too: agreed, ready
    per_rank = [{"s": (sig(pset=1), 0)}, {"s": (sig(pset=1), 0)}, {}]
    ex = Exchange(per_rank, [{1: (0, 1)}, {1: (0, 1)}, {}], [])
    assert decide(ex, ResponseCache(), 1).ready == ["s"]
    ex = Exchange(per_rank, [{1: (0, 1)}, {1: (0, 1, 2)}, {}], [])
    msg = decide(ex, ResponseCache(), 1).errors["s"]
    assert msg.startswith("process set 1 differs between ranks: rank 0 has [0, 1], rank 1 has [0, 1, 2]")
