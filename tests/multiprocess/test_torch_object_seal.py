"""broadcast_object / allgather_object unpickle only payloads sealed with the job secret."""
import pytest

from helpers.ranks import run_ranks

pytestmark = pytest.mark.timeout(60)


def _objects(rank, size):
    import accord.torch as hvd
    from accord.torch import functions

    hvd.init()
    got = hvd.broadcast_object({"lr": 0.1, "from": rank}, root_rank=0, name="cfg")
    every = hvd.allgather_object(("rank", rank), name="all")
    # Rank 1 now checks seals for another purpose: the same bytes from rank 0 must be refused
    # before anything is unpickled (the error names the failed check), never decoded.
    if rank == 1:
        functions._OBJECT_PURPOSE = b"not what rank 0 sealed for"
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
