"""broadcast_object / allgather_object unpickle only payloads sealed with the job secret."""
import pytest
from helpers.ranks import run_ranks

pytestmark = pytest.mark.timeout(60)


def _objects(rank, size):
    import accord.torch as hvd
    from accord.frontend import object_collectives as functions  # where the seals are made

    hvd.init()
    got = hvd.broadcast_object({"lr": 0.1, "from": rank}, root_rank=0, name="cfg")
    every = hvd.allgather_object(("rank", rank), name="all")
    # Rank 1 now checks seals for another purpose: the same bytes from rank 0 must be refused
    # before anything is unpickled (the error names the failed check), never decoded.
    if rank == 1:
        functions._PURPOSE = b"not what rank 0 sealed for"
    refused = None
    try:
        hvd.broadcast_object(["payload"], root_rank=0, name="tampered")
    except hvd.HorovodInternalError as exc:
        refused = str(exc)
    hvd.shutdown()
    return got, every, refused


def test_objects_travel_sealed_and_a_bad_seal_is_refused():
    out = run_ranks(_objects, 2, init="accord", timeout=45)
    for rank, (got, every, refused) in enumerate(out):
        assert got == {"lr": 0.1, "from": 0}
        assert every == [("rank", 0), ("rank", 1)]
        if rank == 1:
            assert refused is not None and "failed its authentication check" in refused and "HINT:" in refused
        else:
            assert refused is None


def _replays(rank, size):
    import os

    import accord.torch as hvd
    from accord.frontend import object_collectives as functions  # where the seals are made

    hvd.init()
    sealed, kind = {}, [""]
    real_dumps = functions._dumps

    def recording_dumps(*args):
        payload = real_dumps(*args)
        sealed[kind[0]] = payload.clone()  # what this rank sealed, by kind of call
        return payload

    functions._dumps = recording_dumps
    kind[0] = "broadcast"
    first = hvd.broadcast_object({"step": 1}, root_rank=0, name="state")
    kind[0] = "allgather"
    gathered = hvd.allgather_object(("rank", rank, 1), name="meta")
    # Now each rank's data plane replays what it sealed before: rank 0 its earlier broadcast,
    # rank 1 its earlier allgather item, each into a later call of the same kind and name.
    functions._dumps = lambda *args: sealed[kind[0]].clone()
    outcome = {}
    kind[0] = "broadcast"
    try:
        outcome["broadcast"] = hvd.broadcast_object({"step": 2}, root_rank=0, name="state")
    except hvd.HorovodInternalError as exc:
        outcome["broadcast"] = str(exc)
    if rank == 0:
        functions._dumps = real_dumps  # only rank 1 replays into the allgather
    kind[0] = "allgather"
    try:
        outcome["allgather"] = hvd.allgather_object(("rank", rank, 2), name="meta")
    except hvd.HorovodInternalError as exc:
        outcome["allgather"] = str(exc)
    functions._dumps = real_dumps
    # An announced length above ACCORD_MAX_OBJECT_BYTES is refused on every rank, nothing allocated.
    os.environ["ACCORD_MAX_OBJECT_BYTES"] = "200"
    try:
        outcome["big"] = hvd.broadcast_object("x" * 1000, root_rank=0, name="big")
    except hvd.HorovodInternalError as exc:
        outcome["big"] = str(exc)
    finally:
        del os.environ["ACCORD_MAX_OBJECT_BYTES"]
    after = hvd.broadcast_object({"step": 3}, root_rank=0, name="state")  # the job goes on
    hvd.shutdown()
    return first, gathered, outcome, after


def test_a_sealed_object_from_an_earlier_call_is_refused_in_a_later_one():
    out = run_ranks(_replays, 2, init="accord", timeout=45)
    for rank, (first, gathered, outcome, after) in enumerate(out):
        assert first == {"step": 1} and after == {"step": 3}
        assert gathered == [("rank", 0, 1), ("rank", 1, 1)]
        if rank == 0:  # the root keeps its own object
            assert outcome["broadcast"] == {"step": 2}
        else:  # rank 0's replayed broadcast is refused
            assert "failed its authentication check" in outcome["broadcast"]
            assert "HINT:" in outcome["broadcast"]
        # rank 1's replayed allgather item is refused everywhere (rank 1 checks its own too)
        assert "failed its authentication check" in outcome["allgather"]
        assert "announced 1" in outcome["big"] and "ACCORD_MAX_OBJECT_BYTES" in outcome["big"]


def _unpicklable(rank, size):
    import threading

    import accord.torch as hvd

    hvd.init()
    outcome = {}
    for kind in ("broadcast", "allgather"):
        # rank 1 alone cannot pickle its object (a lock): the root of the broadcast, one of
        # the senders of the allgather
        obj = threading.Lock() if rank == 1 else {"rank": rank}
        try:
            if kind == "broadcast":
                outcome[kind] = hvd.broadcast_object(obj, root_rank=1, name="lock")
            else:
                outcome[kind] = hvd.allgather_object(obj, name="locks")
        except Exception as exc:  # the sender's own pickling error, or the others' CollectiveError
            outcome[kind] = (type(exc).__name__, isinstance(exc, hvd.HorovodInternalError), str(exc))
    after = hvd.allgather_object(rank, name="after")  # the job goes on
    hvd.shutdown()
    return outcome, after


def test_an_object_its_sender_cannot_pickle_fails_on_every_rank():
    """Without the failed sender telling the others, they would wait for its payload forever
    (stall warnings only); the stall inspector's 60 s would also end nothing. So run_ranks'
    50 s bounds the wait, and the others' error names the sender's pickling failure."""
    out = run_ranks(_unpicklable, 3, init="accord", timeout=50)
    for rank, (outcome, after) in enumerate(out):
        assert after == [0, 1, 2]
        for kind in ("broadcast", "allgather"):
            name, internal, text = outcome[kind]
            if rank == 1:  # its own error: what pickling raised
                assert name == "TypeError" and "lock" in text, outcome
            else:
                assert internal and f"{kind}_object: rank(s) [1] could not pickle their object" in text, text
                assert "HINT:" in text
